"""FPL and its ablations (PROTOCOL.md section 1: Table 1, Table 3, Fig. 5): each switch changes
exactly the term it names. CPCL per sample: -log(sum_{p of class y} e^{cos(z,p)/tau} / sum_p
e^{cos(z,p)/tau}); UPCR per sample: mean over dims of (z - U_y)^2; batch means; a sample whose
class has no prototype contributes 0. Plus hyperparameter validation of every method."""
from __future__ import annotations

import math

import pytest
import torch

from benchmark.models import ResNet10
from benchmark.protocols import ConfigError
from lightning_modules.fpl import FPLClient, FPLRound, FPLServer
from lightning_modules.losses import cpcl_loss, upcr_loss
from lightning_modules.registry import METHODS, TABLE2_METHODS
from ray_jobs.config import RunConfig

NAN = float("nan")
ABLATIONS = ["fpl", "fpl_cpcl_only", "fpl_upcr_only", "fpl_upcr_global", "fpl_cpcl_global"]


def ref_cpcl(z, y, protos, labels, tau):
    total = 0.0
    for zi, yi in zip(z.double(), y.tolist()):
        if yi not in labels.tolist():
            continue
        e = [math.exp(float(zi @ p) / (float(zi.norm()) * float(p.norm())) / tau) for p in protos.double()]
        pos = sum(v for v, lab in zip(e, labels.tolist()) if lab == yi)
        total += -math.log(pos / sum(e))
    return total / len(y)


def ref_upcr(z, y, targets):
    total = 0.0
    for zi, yi in zip(z.double(), y.tolist()):
        u = targets[yi].double()
        if torch.isnan(u).any():
            continue
        total += float(((zi - u) ** 2).mean())
    return total / len(y)


@pytest.fixture(scope="module")
def case():
    gen = torch.Generator().manual_seed(0)
    dim, num_classes = 4, 10
    z = torch.rand(6, dim, generator=gen)  # non-negative like the post-ReLU features
    y = torch.tensor([0, 1, 2, 3, 0, 2])  # class 3 has no prototype anywhere
    cluster = torch.rand(5, dim, generator=gen)
    cluster_labels = torch.tensor([0, 0, 1, 2, 2])
    unbiased = torch.full((num_classes, dim), NAN)
    glob = torch.full((num_classes, dim), NAN)
    for k in range(3):
        unbiased[k] = cluster[cluster_labels == k].mean(dim=0)
        glob[k] = torch.rand(dim, generator=gen)  # deliberately not the unbiased ones
    payload = FPLRound(cluster_protos=cluster, cluster_labels=cluster_labels, unbiased_protos=unbiased,
                       global_protos=glob)
    tau = 0.02
    terms = {
        "cpcl_cluster": ref_cpcl(z, y, cluster, cluster_labels, tau),
        "cpcl_global": ref_cpcl(z, y, glob[:3], torch.arange(3), tau),
        "upcr_unbiased": ref_upcr(z, y, unbiased),
        "upcr_global": ref_upcr(z, y, glob),
    }
    return z, y, payload, terms


def test_reference_terms_are_distinct(case):
    *_, terms = case
    vals = sorted(terms.values())
    assert all(b - a > 1e-3 for a, b in zip(vals, vals[1:]))


def test_loss_functions_against_per_sample_reference(case):
    z, y, p, terms = case
    assert float(cpcl_loss(z, y, p.cluster_protos, p.cluster_labels, 0.02)) == pytest.approx(
        terms["cpcl_cluster"], rel=1e-4)
    assert float(upcr_loss(z, y, p.unbiased_protos)) == pytest.approx(terms["upcr_unbiased"], rel=1e-5)


@pytest.mark.parametrize("name,expected", [
    ("fpl", ("cpcl_cluster", "upcr_unbiased")),
    ("fpl_cpcl_only", ("cpcl_cluster",)),
    ("fpl_upcr_only", ("upcr_unbiased",)),
    ("fpl_upcr_global", ("upcr_global",)),
    ("fpl_cpcl_global", ("cpcl_global",)),
])
def test_ablation_switches_change_exactly_their_terms(case, name, expected):
    z, y, payload, terms = case
    m = METHODS[name]
    assert m.client is FPLClient and m.server is FPLServer
    module = m.client(ResNet10(10), m.defaults)
    module.start_round(0, None, module.net.state_dict())
    assert module.extra_loss(None, y, None, z) is None  # round 0: no prototypes, CE alone
    module.start_round(4, payload, module.net.state_dict())
    got = float(module.extra_loss(None, y, None, z))
    assert got == pytest.approx(sum(terms[t] for t in expected), rel=1e-4)


def fpl_loss(hparams, z, y, payload):
    module = FPLClient(ResNet10(10), {**METHODS["fpl"].defaults, **hparams})
    module.start_round(4, payload, module.net.state_dict())
    return module.extra_loss(None, y, None, z)


def test_lambda_weighs_the_prototype_terms(case):
    """lambda = 1 (the default) is FPL's loss before the weight existed, CPCL + UPCR exactly; lambda = 2 doubles it."""
    z, y, p, terms = case
    today = cpcl_loss(z, y, p.cluster_protos, p.cluster_labels, 0.02) + upcr_loss(z, y, p.unbiased_protos, "mean")
    assert torch.equal(fpl_loss({}, z, y, p), today) and torch.equal(fpl_loss({"lambda": 1.0}, z, y, p), today)
    assert float(fpl_loss({"lambda": 2.0}, z, y, p)) == pytest.approx(
        2 * (terms["cpcl_cluster"] + terms["upcr_unbiased"]), rel=1e-4)


def test_lambda_by_hand():
    """Two samples, two 2-d cluster prototypes (1, 0) of class 0 and (0, 1) of class 1, tau 0.5: each sample's cosine
    is 1 with its class's prototype and 0 with the other's, CPCL = log(1 + e^-2) for both; UPCR: z = (1, 0) is its
    unbiased prototype (0), z = (0, 2) is (0, 1) away, mean over 2 dims 0.5; batch means log(1 + e^-2) + 0.25 (with
    UPCR's sum over the dims, + 0.5)."""
    protos = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    unbiased = torch.full((10, 2), NAN)
    unbiased[:2] = protos
    p = FPLRound(cluster_protos=protos, cluster_labels=torch.tensor([0, 1]), unbiased_protos=unbiased,
                 global_protos=unbiased)
    z, y = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 1])
    hand = math.log(1 + math.exp(-2)) + 0.25
    for lam in (1.0, 2.0, 0.1):
        assert float(fpl_loss({"tau": 0.5, "lambda": lam}, z, y, p)) == pytest.approx(lam * hand, rel=1e-6)
    # UPCR summed over the 2 dims (the paper's Eq. 10), not averaged: (0 + 1) / 2 over the batch
    assert float(fpl_loss({"tau": 0.5, "upcr_reduction": "sum"}, z, y, p)) == pytest.approx(
        math.log(1 + math.exp(-2)) + 0.5, rel=1e-6)


def test_a_run_recorded_before_fpl_had_lambda_ran_lambda_1(tmp_path):
    """FPL's runs recorded before `lambda` existed (their hparams lack it) are complete for lambda = 1, not for
    another lambda; a checkpoint's protocol the same; FedPLVM's, which always recorded its lambda, compare as
    recorded."""
    import json

    from benchmark.checkpoint import protocol_difference
    from benchmark.results import is_complete, protocol

    cfg = RunConfig.from_preset("fedplvm-digit5", method="fpl")
    old = protocol(cfg)
    old["hparams"] = {k: v for k, v in old["hparams"].items() if k != "lambda"}
    (tmp_path / "summary.json").write_text(json.dumps({"complete": True, "protocol": old}))
    assert is_complete(tmp_path, protocol(cfg))
    assert not is_complete(tmp_path, protocol(RunConfig.from_preset("fedplvm-digit5", method="fpl",
                                                                    hparams={"lambda": 2.0})))
    assert protocol_difference(old, protocol(cfg)) == []
    assert protocol_difference(old, protocol(RunConfig.from_preset("fedplvm-digit5", method="fpl",
                                                                   hparams={"lambda": 2.0}))) != []
    plvm = protocol(RunConfig.from_preset("fedplvm-digit5", method="fedplvm"))  # its lambda (100) recorded
    (tmp_path / "summary.json").write_text(json.dumps({"complete": True, "protocol": plvm}))
    assert is_complete(tmp_path, plvm)
    assert not is_complete(tmp_path, protocol(RunConfig.from_preset("fedplvm-digit5", method="fedplvm",
                                                                     hparams={"lambda": 1.0})))
    # a method without lambda gains none: FedAvg's old runs compare as they are
    avg = protocol(RunConfig.from_preset("fedplvm-digit5", method="fedavg"))
    (tmp_path / "summary.json").write_text(json.dumps({"complete": True, "protocol": avg}))
    assert is_complete(tmp_path, avg) and "lambda" not in avg["hparams"]


def test_ablation_defaults():
    base = {"tau": 0.02, "cpcl": True, "upcr": True, "upcr_target": "unbiased", "cpcl_protos": "cluster",
            "upcr_reduction": "mean", "lambda": 1.0}
    assert METHODS["fpl"].defaults == base
    assert METHODS["fpl_cpcl_only"].defaults == {**base, "upcr": False}
    assert METHODS["fpl_upcr_only"].defaults == {**base, "cpcl": False}
    assert METHODS["fpl_upcr_global"].defaults == {**base, "cpcl": False, "upcr_target": "global"}
    assert METHODS["fpl_cpcl_global"].defaults == {**base, "upcr": False, "cpcl_protos": "global"}
    assert TABLE2_METHODS == ["fedavg", "fedprox", "moon", "feddyn", "fedopt", "fedproc", "fedproto", "fpl"]


# --------------------------------------------------------------------- hyperparameter validation
BAD = [
    ("fedprox", "mu", 0), ("fedprox", "mu", -0.01), ("fedprox", "mu", "0.01"), ("fedprox", "mu", None),
    ("moon", "mu", 0), ("moon", "temperature", 0.0), ("moon", "temperature", float("nan")),
    ("feddyn", "alpha", 0), ("feddyn", "alpha", True),
    ("fedopt", "server_lr", 0), ("fedopt", "server_momentum", 1.0), ("fedopt", "server_momentum", -0.1),
    ("fedopt", "server_momentum", "0.9"),
    ("fedproc", "temperature", -1.0),
    ("fedproto", "mu", 0),
    ("fpl", "tau", 0), ("fpl", "tau", -0.02), ("fpl", "tau", "abc"), ("fpl", "lambda", 0), ("fpl", "lambda", True),
    ("fpl", "cpcl", "False"), ("fpl", "upcr", 1), ("fpl", "upcr_target", "mean"), ("fpl", "cpcl_protos", "local"),
    ("fpl", "upcr_reduction", "max"),
    ("fedopt", "weighting", "clients"), ("moon", "frozen_mode", True), ("moon", "initial_previous", "start"),
    ("moon", "double_forward", "yes"), ("fedproto", "double_forward", 2),
] + [(name, "tau", 0) for name in ABLATIONS[1:]]


@pytest.mark.parametrize("method,name,value", BAD)
def test_invalid_hyperparameter_raises_naming_it(method, name, value):
    with pytest.raises(ValueError, match=name):
        RunConfig(method=method, hparams={name: value})


@pytest.mark.parametrize("method", sorted(METHODS))
def test_unknown_hyperparameter_raises(method):
    with pytest.raises(ConfigError, match="bogus"):
        RunConfig(method=method, hparams={"bogus": 1.0})


def test_mu_of_another_method_is_unknown():
    with pytest.raises(ConfigError, match="tau"):
        RunConfig(method="fedprox", hparams={"tau": 0.02})
    with pytest.raises(ConfigError, match="mu"):
        RunConfig(method="fedavg", hparams={"mu": 0.01})


def test_valid_overrides_are_merged_with_defaults():
    cfg = RunConfig(method="fpl", hparams={"tau": 0.05, "cpcl": False})
    assert cfg.hparams == {**METHODS["fpl"].defaults, "tau": 0.05, "cpcl": False}
    assert RunConfig(method="fedopt", hparams={"server_momentum": 0}).hparams == {
        "server_lr": 0.5, "server_momentum": 0, "weighting": "uniform", "step_from": "mean"}
    assert RunConfig(method="moon").hparams == {"mu": 5.0, "temperature": 0.5, "frozen_mode": "train",
                                                "initial_previous": "own", "double_forward": True}
    assert RunConfig(method="fedavg").hparams == {}
