"""FedProc (PROTOCOL.md section 1, baselines): global prototype = unweighted mean of the client
prototypes; cosine InfoNCE with temperature 1 against them; loss a·L_con + (1-a)·CE with
a = 1 - r/(R-1) in round r of R; round 0 is CE alone."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from benchmark.models import ResNet10
from lightning_modules.fedproc import FedProcClient, FedProcServer
from lightning_modules.losses import prototype_infonce
from lightning_modules.registry import METHODS

NAN = float("nan")


def ref_infonce(z, y, protos, t):
    """Per sample: -log(e^{cos(z,G_y)/T} / sum_{k held} e^{cos(z,G_k)/T}); 0 when G_y is absent;
    mean over the whole batch (float64, one sample at a time)."""
    held = [k for k in range(len(protos)) if not torch.isnan(protos[k]).any()]
    total = 0.0
    for zi, yi in zip(z.double(), y.tolist()):
        if yi not in held:
            continue
        e = {k: math.exp(float(zi @ protos[k].double()) / (float(zi.norm()) * float(protos[k].double().norm())) / t)
             for k in held}
        total += -math.log(e[yi] / sum(e.values()))
    return total / len(y)


def ref_ce(logits, y):
    total = 0.0
    for row, yi in zip(logits.double(), y.tolist()):
        total += -math.log(math.exp(float(row[yi])) / sum(math.exp(float(v)) for v in row))
    return total / len(y)


def test_registry_defaults():
    m = METHODS["fedproc"]
    assert m.client is FedProcClient and m.server is FedProcServer
    assert m.defaults == {"temperature": 1.0}


def test_weight_schedule_five_rounds():
    rule = FedProcServer({"temperature": 1.0}, 3, 2, 5, [])
    protos = {0: {0: torch.tensor([1.0, 0.0])}}
    # payload(round_idx = r - 1) is what round r trains with: a = 1 - r / 4 for r = 1..4
    got = [rule.payload(protos, r - 1).weight_a for r in range(1, 5)]
    assert got == pytest.approx([0.75, 0.5, 0.25, 0.0])


def test_payload_global_protos_are_unweighted_means():
    rule = FedProcServer({"temperature": 1.0}, 3, 2, 5, [])
    protos = {0: {0: torch.tensor([1.0, 0.0]), 2: torch.tensor([4.0, 4.0])}, 1: {0: torch.tensor([3.0, 2.0])}}
    g = rule.payload(protos, 0).global_protos
    torch.testing.assert_close(g[0], torch.tensor([2.0, 1.0]))
    assert torch.isnan(g[1]).all()
    torch.testing.assert_close(g[2], torch.tensor([4.0, 4.0]))


def test_prototype_infonce_hand_numbers():
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([0, 2])  # class 2 has no prototype: contributes 0, still counted in the mean
    protos = torch.tensor([[1.0, 0.0], [0.0, 3.0], [NAN, NAN]])
    # sample 0: cos (1, 0) -> -log(e / (e + 1))
    assert float(prototype_infonce(z, y, protos, 1.0)) == pytest.approx(math.log1p(math.exp(-1.0)) / 2, rel=1e-6)
    # T = 0.5: -log(e^2 / (e^2 + 1))
    assert float(prototype_infonce(z, y, protos, 0.5)) == pytest.approx(math.log1p(math.exp(-2.0)) / 2, rel=1e-6)


def test_prototype_infonce_random_against_per_sample_reference():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(8, 5, generator=gen)
    y = torch.tensor([0, 1, 2, 3, 3, 1, 0, 2])
    protos = torch.randn(4, 5, generator=gen)
    protos[2] = NAN
    for t in (1.0, 0.3):
        assert float(prototype_infonce(z, y, protos, t)) == pytest.approx(ref_infonce(z, y, protos, t), rel=1e-5)
    # the absent class (a masked logit) gives a finite gradient, that of the loss over the held classes alone
    zg = z.clone().requires_grad_(True)
    prototype_infonce(zg, y, protos, 0.3).backward()
    held, keep = torch.tensor([0, 1, 3]), y != 2
    zh = z.clone().requires_grad_(True)
    target = torch.tensor([0, 1, 2, 2, 2, 1, 0, 0])  # y's position among the held classes (ignored: y = 2)
    logits = F.normalize(zh, dim=1) @ F.normalize(protos[held], dim=1).T / 0.3
    (F.cross_entropy(logits[keep], target[keep], reduction="sum") / len(y)).backward()
    assert torch.isfinite(zg.grad).all() and torch.allclose(zg.grad, zh.grad, atol=1e-6)
    assert zg.grad[~keep].abs().max() == 0 and zg.grad[keep].abs().max() > 1e-3


def make_client(**hp):
    return FedProcClient(ResNet10(10), {**METHODS["fedproc"].defaults, **hp})


def test_round0_is_ce_alone():
    module = make_client()
    module.start_round(0, None, module.net.state_dict())
    logits = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    y = torch.tensor([0, 2])
    z = torch.randn(2, 4)
    expected = (math.log(1 + 2 / math.e) + math.log(3.0)) / 2
    assert float(module.compute_loss(None, y, logits, z)) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.3])  # the default, and another by value
def test_compute_loss_mixes_contrastive_and_ce_with_weight_a(temperature):
    gen = torch.Generator().manual_seed(1)
    rule = FedProcServer({"temperature": temperature}, 4, 5, 5, [])
    client_protos = {c: {k: torch.randn(5, generator=gen) for k in (0, 1, 3)} for c in range(3)}
    payload = rule.payload(client_protos, 2)  # builds round 3 of 5: a = 1 - 3/4
    assert payload.weight_a == pytest.approx(0.25)
    module = make_client(temperature=temperature)
    module.start_round(3, payload, module.net.state_dict())
    logits = torch.randn(6, 4, generator=gen)
    z = torch.randn(6, 5, generator=gen)
    y = torch.tensor([0, 1, 2, 3, 0, 2])
    mean_protos = torch.full((4, 5), NAN)
    for k in (0, 1, 3):
        mean_protos[k] = sum(client_protos[c][k] for c in range(3)) / 3
    expected = 0.25 * ref_infonce(z, y, mean_protos, temperature) + 0.75 * ref_ce(logits, y)
    assert float(module.compute_loss(None, y, logits, z)) == pytest.approx(expected, rel=1e-5)
