"""Communication counts (benchmark.communication) on hand-computed cases: tensors, a client's round,
and two rounds of the real driver (local executor, real USPS images) with a tiny model whose
state_dict is counted by hand."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmark.communication import client_round, count, mean_per_client, run_total
from benchmark.partition import plan_clients
from lightning_modules.server import RoundPayload
from ray_jobs.config import RunConfig

from tiny_net import TinyNet

# TinyNet's state_dict by hand: conv 6x3x3x3 + 6, BatchNorm weight, bias, running mean, running var 4 x 6,
# classifier 10 x 6 + 10: 262 float32 entries (4 bytes), plus num_batches_tracked, one int64 (8 bytes)
TINY_ENTRIES, TINY_BYTES = 162 + 6 + 24 + 60 + 10 + 1, (162 + 6 + 24 + 60 + 10) * 4 + 8


@dataclasses.dataclass(frozen=True)
class _Payload(RoundPayload):
    protos: torch.Tensor
    labels: torch.Tensor
    weight: float


def test_count_by_hand():
    assert count(None) == (0, 0)
    assert count(torch.zeros(2, 3)) == (6, 24)
    assert count(torch.zeros(4, dtype=torch.int64)) == (4, 32)
    assert count(torch.zeros(5, dtype=torch.float16)) == (5, 10)
    assert count({0: torch.zeros(3), 1: [torch.zeros(2), torch.zeros(1, dtype=torch.float64)]}) == (6, 12 + 8 + 8)
    payload = _Payload(protos=torch.zeros(3, 4), labels=torch.zeros(3, dtype=torch.long), weight=0.5)
    assert count(payload) == (15, 48 + 24)  # the float field is not a tensor: not counted
    assert count(TinyNet(10).state_dict()) == (TINY_ENTRIES, TINY_BYTES)


def test_client_round_and_means():
    a = client_round((10, 40), {0: torch.zeros(2), 3: torch.zeros(2)}, {"w": torch.zeros(10)}, None)
    assert a == {"up_weights": 10, "up_prototypes": 4, "up_bytes": 56, "down_weights": 10, "down_prototypes": 0,
                 "down_bytes": 40}
    b = client_round((0, 0), {0: torch.zeros(2)}, None,
                     _Payload(torch.zeros(2, 2), torch.zeros(2, dtype=torch.long), 1.0))
    assert b == {"up_weights": 0, "up_prototypes": 2, "up_bytes": 8, "down_weights": 0, "down_prototypes": 6,
                 "down_bytes": 32}
    m = mean_per_client({"0": a, "1": b})
    assert m["up_bytes"] == 32 and m["down_prototypes"] == 3
    rounds = [{"communication": {"per_client": {"0": a, "1": b}, "mean_per_client": m}}] * 2
    assert run_total(rounds) == {"per_client_per_round": m, "total_bytes": 2 * (56 + 40 + 8 + 32)}


def tiny_driver(method: str, data_root, monkeypatch, **hparams):
    """The real driver (local executor, one client group) on 2 USPS clients of the tiny network."""
    import lightning_modules.clients
    import ray_jobs.driver

    for mod in (lightning_modules.clients, ray_jobs.driver):
        monkeypatch.setattr(mod, "build_model", lambda name, k: TinyNet(k))
    cfg = RunConfig(method=method, dataset="digits", domains=["usps"], split="fedapc", rounds=2, local_epochs=1,
                    client_fraction=0.5, executor="local", num_actors=1, eval_max=20, hparams=hparams)
    clients = plan_clients(data_root, "digits", {"usps": 2}, 0.01, 0, 0.5)
    return ray_jobs.driver.Driver(cfg, clients, str(data_root)), clients


@pytest.mark.parametrize("method", ["fedavg", "fedproto", "fpl"])
def test_driver_counts_two_rounds_by_hand(method, data_root, monkeypatch):
    """2 USPS clients, 2 rounds, TinyNet (feature dim 6). Round 0: each client receives the weights only and
    uploads its weights plus, for a prototype method, 6 float32 per class it holds; round 1: it also
    receives the payload: FedProto's 10 x 6 global prototypes, FPL's M x 6 cluster prototypes, their M int64
    labels, and the 10 x 6 unbiased and global prototypes; FedAvg sends and takes no prototype."""
    driver, clients = tiny_driver(method, data_root, monkeypatch)
    labels = {c["id"]: set(driver.executor.groups[0].data[c["id"]][1].tolist()) for c in clients}
    for r in range(2):
        payload = driver.payload
        rec = driver.run_round(r)["communication"]
        for c in clients:
            got = rec["per_client"][str(c["id"])]
            protos = 0 if method == "fedavg" else 6 * len(labels[c["id"]])
            if r == 0 or method == "fedavg":
                down = 0
            elif method == "fedproto":
                down = 60
            else:
                m = len(payload.cluster_labels)
                down = 6 * m + m + 60 + 60
            down_bytes = (0 if r == 0 or method == "fedavg"
                          else (4 * (down - m) + 8 * m if method == "fpl" else 4 * down))
            assert got == {"up_weights": TINY_ENTRIES, "up_prototypes": protos, "up_bytes": TINY_BYTES + 4 * protos,
                           "down_weights": TINY_ENTRIES, "down_prototypes": down, "down_bytes": TINY_BYTES + down_bytes}


@pytest.mark.parametrize("method,hparams", [("fedper", {}), ("fedrep", {}), ("fesem", {"clusters": 2})])
def test_personalised_methods_count_what_travels(method, hparams, data_root, monkeypatch):
    """FedPer and FedRep upload and receive the body only: TinyNet less its classifier's 10 x 6 + 10 float32;
    FeSEM uploads its whole state_dict and receives its centre's, in round 0 the initialisation. Each client is
    tested with its own model on the domain's test set (no global model is tested)."""
    driver, clients = tiny_driver(method, data_root, monkeypatch, **hparams)
    head = 0 if method == "fesem" else 70
    for r in range(2):
        rec = driver.run_round(r)
        for c in clients:
            assert rec["communication"]["per_client"][str(c["id"])] == {
                "up_weights": TINY_ENTRIES - head, "up_prototypes": 0, "up_bytes": TINY_BYTES - 4 * head,
                "down_weights": TINY_ENTRIES - head, "down_prototypes": 0, "down_bytes": TINY_BYTES - 4 * head}
        assert set(rec["client_accuracy"]) == {str(c["id"]) for c in clients} and "usps" in rec["accuracy"]
    assert (driver.final_state() is None) == (method == "fesem")  # FeSEM: a model per cluster, none global
