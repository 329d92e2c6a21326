"""The fused engine trains exactly what the one-client-at-a-time loop trains, for every method.

Each method runs 2 rounds (its own server rule making the global model and the
payload between rounds; round 1 uses the payload and the per-client state of round 0) through two client groups that differ only in the engine,
on real USPS images with clients of unequal size (two sizes shared by several
clients, one client alone), a tiny BatchNorm network, in float64: weights,
BatchNorm statistics (in the weighted sums and in MOON's per-client state),
prototypes, losses and per-client state must agree within relative 1e-9.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from benchmark.data import to_tensor_images
from lightning_modules.clients import ClientGroup, resolve_engine
from lightning_modules.fused import fit_fused
from lightning_modules.registry import METHODS
from lightning_modules.server import weighted_mean
from ray_jobs.config import RunConfig

from tiny_net import TinyNet

SIZES = {0: 10, 1: 7, 2: 10, 3: 5, 4: 7}  # client id -> samples: 2 of 10, 2 of 7, 1 of 5


@pytest.fixture(scope="module")
def shards(data_root):
    with np.load(data_root / "digits/usps_test.npz") as z:
        x, y = to_tensor_images(z["x"][:64]), torch.from_numpy(z["y"][:64]).long()
    out, start = {}, 0
    for cid, n in SIZES.items():
        out[cid] = (x[start:start + n], y[start:start + n])
        start += n
    return out


def make_group(method: str, engine: str, shards, dtype, precision="32-true", **protocol) -> ClientGroup:
    spec = METHODS[method]
    group = ClientGroup.__new__(ClientGroup)
    # the methods that keep no global model are tested on FedProto's protocol (its cfg; the data here is injected)
    dataset = "digits" if spec.server.averages_weights else "mnist"
    group.cfg = RunConfig(method=method, dataset=dataset, seed=3, local_epochs=2, batch_size=4, engine=engine, **protocol)
    group.device = torch.device("cpu")
    mean = sum(SIZES.values()) / len(SIZES)  # the driver's data_share (FedDyn's alpha_k)
    group.clients = [{"id": c, "domain": "usps", "data_share": n / mean} for c, n in SIZES.items()]
    group.data = shards
    group.module = spec.client(TinyNet(10), spec.defaults, lr=0.05, momentum=0.9, weight_decay=1e-3)
    group.module.to(dtype)
    group.module.precision_mode = precision
    group.client_states = {}
    group.own_models = {}  # rules that average no weights (FedProto as published, Local)
    return group


def run_rounds(method, engine, shards, dtype, rounds=2, precision="32-true", **protocol):
    """The driver's round for one group: train, weighted mean, server rule, payload."""
    spec = METHODS[method]
    torch.manual_seed(0)
    state = {k: v.to(dtype) for k, v in TinyNet(10).state_dict().items()}
    keys = [k for k, _ in TinyNet(10).named_parameters()]
    rule = spec.server(spec.defaults, 10, TinyNet.feature_dim, 10, keys)  # of 10 rounds: FedProc's weight a > 0
    group, payload, results = make_group(method, engine, shards, dtype, precision, **protocol), None, []
    if rule.per_client:  # FeSEM: every client's own entry
        state = {c: state for c in SIZES}
    for r in range(rounds):
        res = group.train(state, payload, r)
        if rule.per_client:
            state = rule.aggregate_clients(res["uploads"], res["client_weights"], r)
        elif rule.averages_weights:
            state = rule.aggregate(state, weighted_mean([res["sum"]], [res["weight"]]), r)
        else:  # no sum: compare every client's own model instead
            res["sum"] = {f"{c}.{k}": v.clone() for c, own in group.own_models.items() for k, v in own.items()}
        payload = rule.payload(res["protos"], r)
        results.append((res, {c: group.client_states.get(c) for c in SIZES}))
    return results


def flat(obj) -> list[torch.Tensor]:
    """The tensors of nested dicts / lists in a fixed order (floats become tensors)."""
    if obj is None:
        return []
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in flat(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in flat(v)]
    return [torch.as_tensor(obj, dtype=torch.float64)]


def max_rel_diff(a, b) -> float:
    """Largest difference of two tensors relative to the reference tensor's largest entry."""
    fa, fb = flat(a), flat(b)
    assert len(fa) == len(fb) and len(fa) > 0
    worst = 0.0
    for x, y in zip(fa, fb):
        assert x.shape == y.shape
        if x.numel():
            x, y = x.double(), y.double()
            worst = max(worst, float((x - y).abs().max() / y.abs().max().clamp_min(1e-300)))
    return worst


@pytest.mark.parametrize("method", sorted(m for m in METHODS if METHODS[m].client_model is None))  # TinyNet: one model
def test_fused_equals_sequential_in_float64(method, shards):
    seq = run_rounds(method, "sequential", shards, torch.float64)
    fused = run_rounds(method, "fused", shards, torch.float64)
    for (rs, cs_s), (rf, cs_f) in zip(seq, fused):
        spec = METHODS[method]  # the rule's weights: sample counts, or 1 per client (FedOpt, FedDyn)
        weights = sum(spec.server.client_weight(spec.defaults, n) for n in SIZES.values()) if spec.server.averages_weights else 0
        assert rs["weight"] == rf["weight"] == weights
        assert sorted(rf["protos"]) == sorted(rf["losses"]) == sorted(SIZES)
        for c in SIZES:
            assert sorted(rs["protos"][c]) == sorted(rf["protos"][c])
        assert max_rel_diff(rf["sum"], rs["sum"]) < 1e-9  # weights and BatchNorm statistics
        assert max_rel_diff(rf["protos"], rs["protos"]) < 1e-9
        assert max_rel_diff(rf["losses"], rs["losses"]) < 1e-9
        if cs_s[0] is not None:  # MOON's previous model, FedDyn's correction
            assert max_rel_diff(cs_f, cs_s) < 1e-9
    # the training moved the weights and the clients differ: the comparison above could fail
    assert max_rel_diff(seq[-1][0]["sum"], seq[0][0]["sum"]) > 1e-3
    assert len({round(v, 6) for v in seq[-1][0]["losses"].values()}) > 1


@pytest.mark.parametrize("method", ["fedprox", "feddyn", "moon"])
def test_fused_equals_sequential_when_clients_start_from_their_own_weights(method, shards):
    """client_init="own" (FedPLVM's protocols): in round 0 each client starts from its own initialisation, and
    these methods take their anchor (FedProx, FedDyn) or MOON's global model from the start weights outside the
    stacked tensors; round 0 then trains one by one, round 1 fused, the same training as sequential."""
    group = make_group(method, "fused", shards, torch.float64, client_init="own")
    assert [[c["id"] for c in g] for g in group.subgroups(0)] == [[c] for c in SIZES]
    assert [[c["id"] for c in g] for g in group.subgroups(1)] == [[0, 2], [1, 4], [3]]
    seq = run_rounds(method, "sequential", shards, torch.float64, client_init="own")
    fused = run_rounds(method, "fused", shards, torch.float64, client_init="own")
    for (rs, cs_s), (rf, cs_f) in zip(seq, fused):
        assert max_rel_diff(rf["sum"], rs["sum"]) < 1e-9
        assert max_rel_diff(rf["losses"], rs["losses"]) < 1e-9
        if cs_s[0] is not None:  # FedDyn's correction, MOON's previous model
            assert max_rel_diff(cs_f, cs_s) < 1e-9
    # the clients did start apart: round 0's sum is not what the shared start gives
    shared = run_rounds(method, "sequential", shards, torch.float64, rounds=1)
    assert max_rel_diff(shared[0][0]["sum"], seq[0][0]["sum"]) > 1e-3


def test_fused_equals_sequential_in_float32(shards):
    """float32: equal within rounding, amplified by 2 rounds of training (README quotes the size)."""
    worst = 0.0
    for method in ("fpl", "moon"):
        seq = run_rounds(method, "sequential", shards, torch.float32)
        fused = run_rounds(method, "fused", shards, torch.float32)
        for (rs, _), (rf, _) in zip(seq, fused):
            worst = max(worst, max_rel_diff(rf["sum"], rs["sum"]), max_rel_diff(rf["protos"], rs["protos"]),
                        max_rel_diff(rf["losses"], rs["losses"]))
    print(f"float32 fused vs sequential: largest difference relative to the tensor's largest entry {worst:.1e}")
    assert worst < 1e-4


def test_bf16_mixed_runs_in_both_engines(shards):
    """bf16-mixed (Lightning's autocast plugin) is applied: losses move off float32's by bfloat16
    rounding, not more; both engines run under it and stay close."""
    ref = run_rounds("fpl", "sequential", shards, torch.float32)
    seq = run_rounds("fpl", "sequential", shards, torch.float32, precision="bf16-mixed")
    fused = run_rounds("fpl", "fused", shards, torch.float32, precision="bf16-mixed")
    for (r32, _), (rs, _), (rf, _) in zip(ref, seq, fused):
        assert 0 < max_rel_diff(rs["losses"], r32["losses"]) < 0.05
        assert max_rel_diff(rf["losses"], rs["losses"]) < 0.05


def test_fit_fused_refuses_clients_of_unequal_size(shards):
    group = make_group("fedavg", "fused", shards, torch.float64)
    with pytest.raises(ValueError, match="same number of samples"):
        fit_fused(group.module, lambda i: None, [shards[0], shards[1]], 1, 4, [torch.Generator()] * 2)


def test_engine_groups_clients_of_equal_size(shards):
    group = make_group("fedavg", "fused", shards, torch.float64)
    assert [[c["id"] for c in g] for g in group.subgroups()] == [[0, 2], [1, 4], [3]]
    group.cfg = dataclasses.replace(group.cfg, engine="sequential")
    assert [[c["id"] for c in g] for g in group.subgroups()] == [[c] for c in SIZES]


def test_auto_engine_rule():
    assert resolve_engine("auto", torch.device("cpu")) == "sequential"
    assert resolve_engine("auto", torch.device("cuda")) == "fused"
    assert resolve_engine("fused", torch.device("cpu")) == "fused"
    with pytest.raises(ValueError, match="unknown engine 'batched'"):
        resolve_engine("batched", torch.device("cpu"))
