"""FedDyn (PROTOCOL.md section 1, baselines; Acar et al., ICLR 2021), alpha = 0.01.

Client: loss CE - <g_k, w> + (alpha/2)||w - w_g||^2, so the extra gradient is -g_k + alpha (w - w_g);
after training g_k <- g_k - alpha (w_k - w_g), kept per client. Server: h <- h - alpha (mean - w_g);
w <- mean - h / alpha on the parameters; buffers take the mean."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from benchmark.methods import METHODS
from benchmark.config import RunConfig
from lightning_modules.feddyn import FedDynClient, FedDynServer
from lightning_modules.resnet import ResNet10
from ray_jobs.clients import ClientGroup
from tiny_net import TinyNet


def make_client(net=None, lr=0.01, **hp) -> FedDynClient:
    return FedDynClient(net or ResNet10(10), {**METHODS["feddyn"].defaults, **hp}, lr=lr)


def tiny(module, weight, bias):
    module.net = nn.Linear(2, 1)
    with torch.no_grad():
        module.net.weight.copy_(torch.tensor(weight))
        module.net.bias.copy_(torch.tensor(bias))
    return {k: v.clone() for k, v in module.net.state_dict().items()}


def set_weights(module, weight, bias):
    with torch.no_grad():
        module.net.weight.copy_(torch.tensor(weight))
        module.net.bias.copy_(torch.tensor(bias))


def test_registry_defaults():
    m = METHODS["feddyn"]
    assert m.client is FedDynClient and m.server is FedDynServer
    assert m.defaults == {"alpha": 0.01}


def test_client_term_gradient_and_state_hand_numbers():
    module = make_client(alpha=0.1)
    w_g = tiny(module, [[1.0, 2.0]], [0.5])
    g = [torch.tensor([[0.3, -0.2]]), torch.tensor([0.1])]  # this client's correction (weight, bias)
    module.start_round(2, None, w_g, client_state=g)
    set_weights(module, [[1.5, 1.0]], [1.0])  # w - w_g = (0.5, -1), 0.5
    loss = module.extra_loss(None, None, None, None)
    # -<g, w> + alpha/2 ||w - w_g||^2 = -(0.45 - 0.2 + 0.1) + 0.05 * 1.5
    assert float(loss.detach()) == pytest.approx(-0.275, rel=1e-6)
    loss.backward()
    # -g + alpha (w - w_g)
    torch.testing.assert_close(module.net.weight.grad, torch.tensor([[-0.25, 0.1]]))
    torch.testing.assert_close(module.net.bias.grad, torch.tensor([-0.05]))
    # g - alpha (w - w_g)
    state = module.client_state()
    torch.testing.assert_close(state[0], torch.tensor([[0.25, -0.1]]))
    torch.testing.assert_close(state[1], torch.tensor([0.05]))
    # the stored correction is not modified in place
    torch.testing.assert_close(g[0], torch.tensor([[0.3, -0.2]]))


def test_new_client_starts_from_zero_correction_after_another_client():
    module = make_client(alpha=0.1)
    w_g = tiny(module, [[1.0, 2.0]], [0.5])
    module.start_round(1, None, w_g, client_state=[torch.tensor([[9.0, 9.0]]), torch.tensor([9.0])])  # client a
    module.start_round(1, None, w_g, client_state=None)  # client b, first time seen: what ClientGroup passes
    set_weights(module, [[2.0, 2.0]], [0.5])  # w - w_g = (1, 0), 0
    loss = module.extra_loss(None, None, None, None)
    assert float(loss.detach()) == pytest.approx(0.1 / 2 * 1.0, rel=1e-6)  # no linear term
    state = module.client_state()
    torch.testing.assert_close(state[0], torch.tensor([[-0.1, 0.0]]))
    torch.testing.assert_close(state[1], torch.tensor([0.0]))


def test_server_h_state_two_rounds_hand_numbers():
    hp = {"alpha": 0.5}
    rule = FedDynServer(hp, 10, 4, 5, ["w"])
    g0 = {"w": torch.tensor([1.0, 2.0]), "bn.mean": torch.tensor([0.0]), "bn.n": torch.tensor(3)}
    mean0 = {"w": torch.tensor([2.0, 0.0], dtype=torch.float64), "bn.mean": torch.tensor([0.7], dtype=torch.float64),
             "bn.n": torch.tensor(5.0, dtype=torch.float64)}
    # h = 0 - 0.5 * ((2, 0) - (1, 2)) = (-0.5, 1); w = (2, 0) - h / 0.5 = (3, -2)
    g1 = rule.aggregate(g0, mean0, 0)
    torch.testing.assert_close(g1["w"], torch.tensor([3.0, -2.0]))
    torch.testing.assert_close(g1["bn.mean"], torch.tensor([0.7]))  # buffers: the mean
    assert g1["bn.n"].dtype == torch.int64 and int(g1["bn.n"]) == 5
    assert g1["w"].dtype == torch.float32
    mean1 = {"w": torch.tensor([2.0, -1.0], dtype=torch.float64), "bn.mean": torch.tensor([0.1], dtype=torch.float64),
             "bn.n": torch.tensor(6.0, dtype=torch.float64)}
    # h = (-0.5, 1) - 0.5 * ((2, -1) - (3, -2)) = (0, 0.5); w = (2, -1) - (0, 1) = (2, -2)
    g2 = rule.aggregate(g1, mean1, 1)
    torch.testing.assert_close(g2["w"], torch.tensor([2.0, -2.0]))
    torch.testing.assert_close(g2["bn.mean"], torch.tensor([0.1]))
    assert int(g2["bn.n"]) == 6


def test_server_against_straightforward_recursion():
    alpha = 0.01
    gen = torch.Generator().manual_seed(0)
    rule = FedDynServer({"alpha": alpha}, 10, 4, 5, ["a", "b"])
    glob = {"a": torch.randn(3, generator=gen), "b": torch.randn(2, 2, generator=gen)}
    h = {k: torch.zeros(v.shape, dtype=torch.float64) for k, v in glob.items()}
    for r in range(3):
        mean = {k: v.double() + 0.1 * torch.randn(v.shape, generator=gen, dtype=torch.float64) for k, v in glob.items()}
        new = rule.aggregate(glob, mean, r)
        for k in glob:
            h[k] = h[k] - alpha * (mean[k] - glob[k].double())
            torch.testing.assert_close(new[k], (mean[k] - h[k] / alpha).float())
        glob = new


# --------------------------------------------------------------------- several clients on one module
def images(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, 32, 32), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def make_group(client_ids, data, alpha) -> ClientGroup:
    """A ClientGroup (the real per-client state protocol of `train`) with injected tiny data."""
    group = ClientGroup.__new__(ClientGroup)
    group.cfg = RunConfig(method="feddyn", seed=0, local_epochs=1, batch_size=4)
    group.device = torch.device("cpu")
    group.clients = [{"id": c, "domain": "mnist"} for c in client_ids]
    group.data = {c: data[c] for c in client_ids}
    group.module = make_client(TinyNet(10), alpha=alpha, lr=0.05)
    group.client_states = {}
    return group


def test_two_clients_on_one_module_keep_their_own_correction_over_two_rounds():
    alpha = 0.1
    torch.manual_seed(0)
    g0 = {k: v.clone() for k, v in TinyNet(10).state_dict().items()}
    keys = [k for k, _ in TinyNet(10).named_parameters()]
    data = {3: (images(4, 20), torch.tensor([0, 1, 2, 3])), 5: (images(4, 21), torch.tensor([4, 5, 6, 7]))}
    both = make_group([3, 5], data, alpha)
    alone = {c: make_group([c], data, alpha) for c in (3, 5)}

    res0 = both.train(g0, None, 0)
    trained0 = {}
    for c in (3, 5):
        r = alone[c].train(g0, None, 0)
        trained0[c] = {k: r["sum"][k] / r["weight"] for k in keys}  # the client's trained weights
        # g = 0 - alpha (w_k - w_g), in parameter order
        for k, got, ref in zip(keys, both.client_states[c], alone[c].client_states[c]):
            torch.testing.assert_close(got, ref, rtol=0, atol=0)
            torch.testing.assert_close(got.double(), -alpha * (trained0[c][k] - g0[k].double()), rtol=1e-5, atol=1e-12)
    assert any(not torch.equal(a, b) for a, b in zip(both.client_states[3], both.client_states[5]))

    g1 = {k: (res0["sum"][k] / res0["weight"]).to(g0[k].dtype) for k in g0}
    both.train(g1, None, 1)
    for c in (3, 5):
        r = alone[c].train(g1, None, 1)
        trained1 = {k: r["sum"][k] / r["weight"] for k in keys}
        for i, k in enumerate(keys):
            torch.testing.assert_close(both.client_states[c][i], alone[c].client_states[c][i], rtol=0, atol=0)
            # g1 = g0 - alpha (w_k1 - w_g1), g0 = -alpha (w_k0 - w_g0): the round-0 state was kept
            expected = -alpha * (trained0[c][k] - g0[k].double()) - alpha * (trained1[k] - g1[k].double())
            torch.testing.assert_close(both.client_states[c][i].double(), expected, rtol=1e-4, atol=1e-10)

    # the kept correction changes training: a client whose state were reset trains differently
    reset = make_group([3], data, alpha)
    r_reset = reset.train(g1, None, 1)
    kept = make_group([3], data, alpha)
    kept.client_states[3] = [(-alpha * (trained0[3][k] - g0[k].double())).float() for k in keys]
    r_kept = kept.train(g1, None, 1)
    assert any(not torch.equal(r_reset["sum"][k], r_kept["sum"][k]) for k in keys)
