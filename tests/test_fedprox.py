"""FedProx client (PROTOCOL.md section 1, baselines): CE + (mu/2)·||w - w_global||^2, mu = 0.01."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from benchmark.models import ResNet10
from benchmark.transforms import normalize
from lightning_modules.fedavg import FedAvgServer
from lightning_modules.fedprox import FedProxClient
from lightning_modules.registry import METHODS


def make_client(**hp):
    return FedProxClient(ResNet10(10), {**METHODS["fedprox"].defaults, **hp})


def test_registry_defaults():
    m = METHODS["fedprox"]
    assert m.client is FedProxClient and m.server is FedAvgServer
    assert m.defaults == {"mu": 0.01}  # not the official code's effective 0.01 * 0.01 / 2


def test_proximal_term_hand_numbers_tiny_net():
    module = make_client()
    module.net = nn.Linear(2, 1)
    with torch.no_grad():
        module.net.weight.copy_(torch.tensor([[1.0, 2.0]]))
        module.net.bias.copy_(torch.tensor([3.0]))
    module.start_round(1, None, module.net.state_dict())
    assert float(module.extra_loss(None, None, None, None).detach()) == 0.0  # at the global weights
    with torch.no_grad():
        module.net.weight.copy_(torch.tensor([[1.5, 1.0]]))  # delta (0.5, -1), bias unchanged
    loss = module.extra_loss(None, None, None, None)
    assert float(loss) == pytest.approx(0.01 / 2 * (0.25 + 1.0))  # 0.00625
    loss.backward()
    torch.testing.assert_close(module.net.weight.grad, torch.tensor([[0.005, -0.01]]))
    torch.testing.assert_close(module.net.bias.grad, torch.tensor([0.0]))


def test_proximal_term_and_gradient_on_resnet10_every_parameter():
    torch.manual_seed(0)
    module = make_client()
    module.start_round(1, None, module.net.state_dict())
    params = list(module.net.parameters())
    assert sum(p.numel() for p in params) == 4_903_242
    gen = torch.Generator().manual_seed(1)
    deltas = [0.01 * torch.randn(p.shape, generator=gen) for p in params]
    with torch.no_grad():
        for p, d in zip(params, deltas):
            p.add_(d)
    real = [p.detach().clone() for p in params]
    start = [r - d for r, d in zip(real, deltas)]  # w_global as float32 arithmetic sees it
    expected = 0.01 / 2 * sum(float(((r.double() - s.double()) ** 2).sum()) for r, s in zip(real, start))
    loss = module.extra_loss(None, None, None, None)
    assert float(loss) == pytest.approx(expected, rel=1e-4)
    loss.backward()
    for p, r, s in zip(params, real, start):
        torch.testing.assert_close(p.grad, 0.01 * (r - s), rtol=1e-4, atol=1e-9)


def test_global_snapshot_is_a_copy_and_training_step_is_ce_plus_term():
    torch.manual_seed(0)
    module = make_client(mu=2.0)  # a large mu so the term is visible next to CE
    module.start_round(1, None, module.net.state_dict())
    with torch.no_grad():
        for p in module.net.parameters():
            p.add_(0.001)
    n_params = sum(p.numel() for p in module.net.parameters())
    gen = torch.Generator().manual_seed(2)
    x = normalize(torch.randint(0, 256, (4, 3, 32, 32), generator=gen, dtype=torch.uint8))
    y = torch.tensor([0, 3, 3, 9])
    module.train()
    module.on_train_epoch_start()
    loss = module.training_step((x, y), 0)
    logits, _ = module.net(x)  # train-mode BN uses batch statistics: same output again
    expected = float(F.cross_entropy(logits, y)) + 2.0 / 2 * n_params * 0.001**2
    assert float(loss) == pytest.approx(expected, rel=1e-3)
