"""FedDyn as in Acar et al.'s code (`train_FedDyn`, `train_feddyn_mdl`), alpha = 0.01.

Client k: alpha_k = alpha / data_share (n_k over the mean client size); loss CE + alpha_k <w, h_k - w_sent>
with SGD weight decay wd + alpha_k; after training h_k <- h_k + (w_k - w_sent), kept per client.
Server: avg = the unweighted client mean; sent = avg + mean_k h_k (parameters; buffers take the mean);
the model evaluated is avg."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from benchmark.data import to_tensor_images
from benchmark.models import ResNet10
from benchmark.transforms import normalize
from lightning_modules.clients import ClientGroup
from lightning_modules.feddyn import FedDynClient, FedDynServer
from lightning_modules.registry import METHODS, HyperparameterError
from ray_jobs.config import RunConfig
from ray_jobs.driver import Driver

from host_reads import HostReads
from tiny_net import TinyNet


def make_client(net=None, lr=0.01, weight_decay=1e-5, **hp) -> FedDynClient:
    return FedDynClient(net or ResNet10(10), {**METHODS["feddyn"].defaults, **hp}, lr=lr, weight_decay=weight_decay)


def set_weights(module, weight, bias):
    with torch.no_grad():
        module.net.weight.copy_(torch.tensor(weight))
        module.net.bias.copy_(torch.tensor(bias))


def linear_client(alpha, share, w_sent, b_sent, h=None, **kw):
    module = make_client(alpha=alpha, **kw)
    module.net = nn.Linear(2, 1)
    set_weights(module, w_sent, b_sent)
    state = module.initial_client_state(0, {"id": 0, "data_share": share})
    if h is not None:
        state["h"] = h
    module.start_round(2, None, {k: v.clone() for k, v in module.net.state_dict().items()}, state)
    return module


def test_registry_defaults():
    m = METHODS["feddyn"]
    assert m.client is FedDynClient and m.server is FedDynServer
    assert m.defaults == {"alpha": 0.01, "max_grad_norm": None, "momentum": None}
    assert FedDynServer.client_weight(m.defaults, 500) == 1.0  # the unweighted mean over clients
    with pytest.raises(HyperparameterError, match=r"^momentum must be a number in \[0, 1\), or null for the "
                                                  r"protocol \(got 1\.0\)\.$"):
        RunConfig(method="feddyn", hparams={"momentum": 1.0})
    assert RunConfig(method="feddyn", hparams={"momentum": 0.0}).run_name == "feddyn-digits-code-momentum0-seed0"


def test_adaptive_alpha_linear_term_gradient_and_state_hand_numbers():
    # alpha 0.1, the client holds half the mean client's data: alpha_k = 0.2
    h = [torch.tensor([[0.3, -0.2]]), torch.tensor([0.1])]  # this client's accumulated w_k - w_sent
    module = linear_client(0.1, 0.5, [[1.0, 2.0]], [0.5], h)
    assert module.alpha_k == pytest.approx(0.2)
    assert module.configure_optimizers().param_groups[0]["weight_decay"] == pytest.approx(1e-5 + 0.2)
    set_weights(module, [[1.5, 1.0]], [1.0])
    loss = module.extra_loss(None, None, None, None)
    # alpha_k <w, h - w_sent> = 0.2 * (1.5 * (0.3 - 1) + 1 * (-0.2 - 2) + 1 * (0.1 - 0.5)) = 0.2 * (-3.65)
    assert float(loss.detach()) == pytest.approx(-0.73, rel=1e-6)
    loss.backward()
    torch.testing.assert_close(module.net.weight.grad, torch.tensor([[-0.14, -0.44]]))
    torch.testing.assert_close(module.net.bias.grad, torch.tensor([-0.08]))
    # h + (w - w_sent) = (0.3 + 0.5, -0.2 - 1), 0.1 + 0.5
    state = module.client_state()
    assert state["alpha"] == pytest.approx(0.2)
    torch.testing.assert_close(state["h"][0], torch.tensor([[0.8, -1.2]]))
    torch.testing.assert_close(state["h"][1], torch.tensor([0.6]))
    torch.testing.assert_close(h[0], torch.tensor([[0.3, -0.2]]))  # the stored state is not modified in place


def test_sgd_step_equals_the_papers_objective():
    """One local SGD step (momentum, weight decay wd + alpha_k) equals plain SGD on the paper's form
    CE - <g_k, w> + alpha_k/2 ||w - w_sent||^2 + wd/2 ||w||^2 with g_k = -alpha_k h_k."""
    gen = torch.Generator().manual_seed(0)
    w_sent, b_sent = torch.randn(1, 2, generator=gen), torch.randn(1, generator=gen)
    h = [torch.randn(1, 2, generator=gen), torch.randn(1, generator=gen)]
    x, t = torch.randn(5, 2, generator=gen), torch.randn(5, 1, generator=gen)
    module = linear_client(0.3, 2.0, w_sent.tolist(), b_sent.tolist(), h, lr=0.1, weight_decay=1e-3)
    alpha_k, wd = 0.15, 1e-3
    opt = module.configure_optimizers()
    ref = nn.Linear(2, 1)
    ref.load_state_dict(module.net.state_dict())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        loss = ((module.net(x) - t) ** 2).mean() + module.extra_loss(None, None, None, None)
        opt.zero_grad()
        loss.backward()
        opt.step()
        params = list(ref.parameters())
        paper = ((ref(x) - t) ** 2).mean()
        paper = paper + sum((alpha_k * hk * p).sum() for hk, p in zip(h, params))  # -<g_k, w>
        paper = (paper + alpha_k / 2 * ((params[0] - w_sent) ** 2).sum()
                 + alpha_k / 2 * ((params[1] - b_sent) ** 2).sum())
        paper = paper + wd / 2 * sum((p ** 2).sum() for p in params)
        ref_opt.zero_grad()
        paper.backward()
        ref_opt.step()
    for a, b in zip(module.net.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b)


@pytest.fixture(scope="module")
def shards_of_usps(data_root):
    """10 USPS test images (uint8, as a client holds them) and their labels."""
    with np.load(data_root / "digits/usps_test.npz") as z:
        return to_tensor_images(z["x"][:10]), torch.from_numpy(z["y"][:10]).long()


def test_clipped_local_steps_equal_torchs_sgd_with_clip_grad_norm(shards_of_usps):
    """`max_grad_norm` (Acar et al.'s `clip_grad_norm_` at 10 in `train_feddyn_mdl`) and `momentum` (Acar et al.'s
    0): fit_local's steps equal an independent loop over the same batches: the loss's gradient clipped to the norm,
    then SGD with the momentum (the protocol's 0.9 when None) and weight decay wd + alpha_k; the clipping bites at
    0.05 and momentum 0 moves other weights than 0.9."""
    from benchmark.transforms import Transform
    from lightning_modules.base import augmented_batch, batches, fit_local

    x, y = shards_of_usps
    trained = {}
    for clip, momentum in ((None, None), (0.05, None), (None, 0.0)):
        torch.manual_seed(0)
        module = make_client(TinyNet(10), lr=0.05, max_grad_norm=clip, momentum=momentum)
        module.transform = Transform(augment=False)
        state = module.initial_client_state(0, {"id": 0, "data_share": 1.0})
        module.start_round(0, None, {k: v.clone() for k, v in module.net.state_dict().items()}, state)
        ref = copy.deepcopy(module.net)
        fit_local(module, x, y, 2, 4, torch.Generator().manual_seed(3))
        trained[clip, momentum] = [p.detach().clone() for p in module.net.parameters()]
        sent = [p.detach().clone() for p in ref.parameters()]
        opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9 if momentum is None else momentum,
                              weight_decay=1e-5 + 0.01)
        g = torch.Generator().manual_seed(3)
        ref.train()
        for _ in range(2):
            for idx in batches(len(y), 4, g):
                xb, yb = augmented_batch(x, y, idx, g, torch.float32, module.transform)
                logits, _ = ref(xb)
                loss = F.cross_entropy(logits, yb) + 0.01 * sum((p * -w).sum() for p, w in zip(ref.parameters(), sent))
                opt.zero_grad()
                loss.backward()
                if clip:
                    torch.nn.utils.clip_grad_norm_(list(ref.parameters()), clip)
                opt.step()
        for a, b in zip(trained[clip, momentum], ref.parameters()):
            torch.testing.assert_close(a, b.detach())
    for other in ((0.05, None), (None, 0.0)):
        assert max(float((a - b).abs().max()) for a, b in zip(trained[None, None], trained[other])) > 1e-3


def test_new_client_starts_from_zero_h_after_another_client():
    module = linear_client(0.1, 1.0, [[1.0, 2.0]], [0.5], [torch.tensor([[9.0, 9.0]]), torch.tensor([9.0])])
    state = module.initial_client_state(0, {"id": 1, "data_share": 4.0})  # client b, first time seen
    module.start_round(1, None, {k: v.clone() for k, v in module.net.state_dict().items()}, state)
    assert module.alpha_k == pytest.approx(0.025)
    set_weights(module, [[2.0, 2.0]], [0.5])
    # alpha_k <w, 0 - w_sent> = 0.025 * -(2 + 4 + 0.25)
    assert float(module.extra_loss(None, None, None, None).detach()) == pytest.approx(-0.15625, rel=1e-6)
    torch.testing.assert_close(module.client_state()["h"][0], torch.tensor([[1.0, 0.0]]))


def test_server_two_rounds_hand_numbers_sent_and_evaluated():
    rule = FedDynServer({"alpha": 0.5}, 10, 4, 5, ["w"])
    g0 = {"w": torch.tensor([1.0, 2.0]), "bn.mean": torch.tensor([0.0]), "bn.n": torch.tensor(3)}
    mean0 = {"w": torch.tensor([2.0, 0.0], dtype=torch.float64), "bn.mean": torch.tensor([0.7], dtype=torch.float64),
             "bn.n": torch.tensor(5.0, dtype=torch.float64)}
    # drift = (2, 0) - (1, 2) = (1, -2); sent = avg + drift = (3, -2)
    g1 = rule.aggregate(g0, mean0, 0)
    torch.testing.assert_close(g1["w"], torch.tensor([3.0, -2.0]))
    torch.testing.assert_close(g1["bn.mean"], torch.tensor([0.7]))  # buffers: the mean
    assert g1["bn.n"].dtype == torch.int64 and int(g1["bn.n"]) == 5 and g1["w"].dtype == torch.float32
    ev = rule.evaluated_state(g1)  # the model tested: the plain mean, not the one sent
    torch.testing.assert_close(ev["w"], torch.tensor([2.0, 0.0]))
    torch.testing.assert_close(ev["bn.mean"], torch.tensor([0.7]))
    mean1 = {"w": torch.tensor([2.0, -1.0], dtype=torch.float64), "bn.mean": torch.tensor([0.1], dtype=torch.float64),
             "bn.n": torch.tensor(6.0, dtype=torch.float64)}
    # drift = (1, -2) + (2, -1) - (3, -2) = (0, -1); sent = (2, -2)
    g2 = rule.aggregate(g1, mean1, 1)
    torch.testing.assert_close(g2["w"], torch.tensor([2.0, -2.0]))
    torch.testing.assert_close(rule.evaluated_state(g2)["w"], torch.tensor([2.0, -1.0]))
    assert int(g2["bn.n"]) == 6


def test_server_against_acars_per_client_recursion():
    """cld = mean_k(w_k) + mean_k(local_param_list[k]), local_param_list[k] += w_k - cld (Acar's train_FedDyn)."""
    gen = torch.Generator().manual_seed(0)
    n_clients = 3
    rule = FedDynServer({"alpha": 0.01}, 10, 4, 5, ["a"])
    cld = {"a": torch.randn(4, generator=gen)}
    local = [torch.zeros(4, dtype=torch.float64) for _ in range(n_clients)]
    for r in range(3):
        clients = [cld["a"].double() + 0.1 * torch.randn(4, generator=gen, dtype=torch.float64)
                   for _ in range(n_clients)]
        for k in range(n_clients):
            local[k] += clients[k] - cld["a"].double()
        avg = sum(clients) / n_clients
        expected_cld = avg + sum(local) / n_clients
        mean = {"a": sum(c * FedDynServer.client_weight({}, 10 * (k + 1)) for k, c in enumerate(clients)) / n_clients}
        cld = rule.aggregate(cld, mean, r)
        torch.testing.assert_close(cld["a"], expected_cld.float())
        torch.testing.assert_close(rule.evaluated_state(cld)["a"], avg.float())


def test_driver_evaluates_the_plain_mean_not_the_sent_model():
    """After a FedDyn round the driver tests avg: labels made from avg's predictions give 100%,
    the model sent to the clients (which gets less here) is not what is tested."""
    torch.manual_seed(0)
    net = TinyNet(10)
    keys = [k for k, _ in net.named_parameters()]
    g0 = {k: v.clone() for k, v in net.state_dict().items()}
    mean = {k: v.double() + (0.5 * torch.randn(v.shape, dtype=torch.float64) if k in keys else 0)
            for k, v in g0.items()}
    rule = FedDynServer({"alpha": 0.01}, 10, TinyNet.feature_dim, 5, keys)
    sent = rule.aggregate(g0, mean, 0)
    x = torch.randint(0, 256, (64, 3, 32, 32), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)

    def predict(state):
        m = TinyNet(10)
        m.load_state_dict(state)
        with torch.no_grad():
            return m.eval()(normalize(x))[0].argmax(1)

    y = predict(rule.evaluated_state(sent))
    assert (predict(sent) != y).any()  # the two models differ on this case
    driver = Driver.__new__(Driver)
    driver.model, driver.rule, driver.global_state = TinyNet(10), rule, sent
    driver.cfg, driver.device = RunConfig(method="feddyn"), torch.device("cpu")
    driver.test_sets = {"mnist": (x, y)}
    acc = driver.evaluate()
    assert acc["mnist"] == 100.0
    with HostReads() as reads:  # 7 batches, the last short: the same counts, read back to the host once
        assert driver.evaluate(batch_size=10)["mnist"] == 100.0
    assert reads.reads == ["tolist"]


# --------------------------------------------------------------------- several clients on one module
def images(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, 32, 32), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


SHARE = {3: 0.5, 5: 1.5}


def make_group(client_ids, data, alpha) -> ClientGroup:
    """A ClientGroup (the real per-client state protocol of `train`) with injected tiny data."""
    group = ClientGroup.__new__(ClientGroup)
    group.cfg = RunConfig(method="feddyn", seed=0, local_epochs=1, batch_size=4, hparams={"alpha": alpha})
    group.device = torch.device("cpu")
    group.clients = [{"id": c, "domain": "mnist", "data_share": SHARE[c]} for c in client_ids]
    group.data = {c: data[c] for c in client_ids}
    group.module = make_client(TinyNet(10), alpha=alpha, lr=0.05)
    group.client_states = {}
    return group


def test_two_clients_on_one_module_keep_their_own_h_and_alpha_over_two_rounds():
    alpha = 0.1
    torch.manual_seed(0)
    g0 = {k: v.clone() for k, v in TinyNet(10).state_dict().items()}
    keys = [k for k, _ in TinyNet(10).named_parameters()]
    data = {3: (images(4, 20), torch.tensor([0, 1, 2, 3])), 5: (images(4, 21), torch.tensor([4, 5, 6, 7]))}
    both = make_group([3, 5], data, alpha)
    alone = {c: make_group([c], data, alpha) for c in (3, 5)}

    res0 = both.train(g0, None, 0)
    assert res0["weight"] == 2.0  # unweighted: one per client
    trained0 = {}
    for c in (3, 5):
        r = alone[c].train(g0, None, 0)
        trained0[c] = {k: r["sum"][k] / r["weight"] for k in keys}  # the client's trained weights
        assert both.client_states[c]["alpha"] == pytest.approx(alpha / SHARE[c])
        for k, got, ref in zip(keys, both.client_states[c]["h"], alone[c].client_states[c]["h"]):
            torch.testing.assert_close(got, ref, rtol=0, atol=0)
            torch.testing.assert_close(got.double(), trained0[c][k] - g0[k].double(), rtol=1e-5, atol=1e-7)

    g1 = {k: (res0["sum"][k] / res0["weight"]).to(g0[k].dtype) for k in g0}
    both.train(g1, None, 1)
    for c in (3, 5):
        r = alone[c].train(g1, None, 1)
        trained1 = {k: r["sum"][k] / r["weight"] for k in keys}
        for i, k in enumerate(keys):
            torch.testing.assert_close(both.client_states[c]["h"][i], alone[c].client_states[c]["h"][i], rtol=0, atol=0)
            expected = (trained0[c][k] - g0[k].double()) + (trained1[k] - g1[k].double())  # round 0's h was kept
            torch.testing.assert_close(both.client_states[c]["h"][i].double(), expected, rtol=1e-4, atol=1e-6)

    # the data share changes training: the same client with another share trains differently
    other = make_group([3], data, alpha)
    other.clients[0]["data_share"] = 1.0
    r_other, r_own = other.train(g0, None, 0), make_group([3], data, alpha).train(g0, None, 0)
    assert any(not torch.equal(r_other["sum"][k], r_own["sum"][k]) for k in keys)


@pytest.mark.slow
def test_own_initialisations_drift_is_the_mean_of_the_clients_h(data_root):
    """Under client_init="own" (FedPLVM's presets) each client starts round 0 from its own initialisation and
    adds w_k - own_k to its h_k; the server steps from the mean of those starts, so Acar's identity holds: drift =
    mean over clients of h_k (from the driver's initial global model it would miss it by the inits' spread)."""
    from ray_jobs.driver import Driver
    from ray_jobs.run import plan_run_clients

    cfg = RunConfig(method="feddyn", dataset="office_caltech", domains=["webcam", "dslr"], rounds=2, local_epochs=1,
                    client_fraction=0.5, eval_max=30, executor="local", num_actors=1, client_init="own",
                    data_root=str(data_root))
    planned = plan_run_clients(cfg)
    driver = Driver(cfg, planned, str(data_root))
    g0, own_mean = dict(driver.global_state), driver.start_state(0)
    driver.run_round(0)
    ck = driver.checkpoint()
    drift, hs = ck["rule_state"]["drift"], [st["h"] for st in ck["client_states"].values()]
    assert len(hs) == 5
    # each client's alpha_k, as the driver gave it: alpha / (n_k / mean n), by hand from the planned sizes
    n = {c["id"]: c["num_samples"] for c in planned}
    assert sorted(n.values()) == [12, 12, 12, 12, 23]  # (unequal sizes: a wrong share would show)
    for cid, st in ck["client_states"].items():
        assert st["alpha"] == pytest.approx(0.01 * (sum(n.values()) / len(n)) / n[cid], rel=1e-6), cid
    worst = 0.0
    for i, k in enumerate(driver.rule.param_keys):
        mean_h = torch.stack([h[i].double() for h in hs]).mean(dim=0)
        worst = max(worst, float((drift[k] - mean_h).abs().max() / mean_h.abs().max()))
    assert worst < 1e-3, worst  # float32 rounding of h_k (measured 3e-5); from the global init: above 1
    # the correction matters: the driver's initial global model is far from the mean of the clients' starts
    gap = max(float((own_mean[k].double() - g0[k].double()).abs().max() / own_mean[k].abs().max())
              for k in driver.rule.param_keys)
    assert gap > 0.1, gap
    assert driver.start_state(1) is driver.global_state  # later rounds start from the global model
