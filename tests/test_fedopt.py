"""FedOpt (PROTOCOL.md section 1, baselines): server SGD with momentum 0.9 on the pseudo-gradient
w_global - mean(client weights), server lr 0.5; clients train CE only; buffers take the mean."""
from __future__ import annotations

import torch

from benchmark.methods import METHODS
from lightning_modules.fedavg import FedAvgClient
from lightning_modules.fedopt import FedOptServer


def f64(*v):
    return torch.tensor(v, dtype=torch.float64)


def make_rule(keys, **hp):
    return FedOptServer({**METHODS["fedopt"].defaults, **hp}, 10, 4, 5, keys)


def test_registry_defaults():
    m = METHODS["fedopt"]
    assert m.client is FedAvgClient and m.server is FedOptServer
    assert m.defaults == {"server_lr": 0.5, "server_momentum": 0.9}


def test_momentum_step_two_rounds_hand_numbers():
    rule = make_rule(["w"])
    g0 = {"w": torch.tensor([1.0, 2.0]), "bn.var": torch.tensor([1.0]), "bn.n": torch.tensor(2)}
    # grad = (1, 2) - (0, 1) = (1, 1); buf = grad; w = (1, 2) - 0.5 (1, 1) = (0.5, 1.5)
    g1 = rule.aggregate(g0, {"w": f64(0.0, 1.0), "bn.var": f64(0.4), "bn.n": f64(4.0)}, 0)
    torch.testing.assert_close(g1["w"], torch.tensor([0.5, 1.5]))
    torch.testing.assert_close(g1["bn.var"], torch.tensor([0.4]))  # buffers: the mean, no momentum
    assert g1["bn.n"].dtype == torch.int64 and int(g1["bn.n"]) == 4
    # grad = (0.5, 1.5) - (0.5, 2.5) = (0, -1); buf = 0.9 (1, 1) + (0, -1) = (0.9, -0.1)
    # w = (0.5, 1.5) - 0.5 (0.9, -0.1) = (0.05, 1.55)
    g2 = rule.aggregate(g1, {"w": f64(0.5, 2.5), "bn.var": f64(0.2), "bn.n": f64(6.0)}, 1)
    torch.testing.assert_close(g2["w"], torch.tensor([0.05, 1.55]))
    torch.testing.assert_close(g2["bn.var"], torch.tensor([0.2]))
    assert int(g2["bn.n"]) == 6


def test_matches_torch_sgd_on_the_pseudo_gradient():
    gen = torch.Generator().manual_seed(0)
    keys = ["a", "b"]
    rule = make_rule(keys)
    glob = {"a": torch.randn(3, generator=gen), "b": torch.randn(2, 2, generator=gen)}
    ref = [torch.nn.Parameter(glob[k].double().clone()) for k in keys]
    opt = torch.optim.SGD(ref, lr=0.5, momentum=0.9)  # the independent implementation
    for r in range(4):
        mean = {k: glob[k].double() + 0.1 * torch.randn(glob[k].shape, generator=gen, dtype=torch.float64) for k in keys}
        for p, k in zip(ref, keys):
            p.grad = p.detach() - mean[k]
        opt.step()
        glob = rule.aggregate(glob, mean, r)
        for p, k in zip(ref, keys):
            torch.testing.assert_close(glob[k], p.detach().float())
            with torch.no_grad():
                p.copy_(glob[k].double())  # the next round starts from the cast global model


def test_lr_one_no_momentum_is_fedavg():
    rule = make_rule(["w"], server_lr=1.0, server_momentum=0.0)
    g0 = {"w": torch.tensor([3.0, -1.0])}
    for r, mean in enumerate(([1.0, 1.0], [2.0, 5.0])):
        g0 = rule.aggregate(g0, {"w": f64(*mean)}, r)
        torch.testing.assert_close(g0["w"], torch.tensor(mean))
