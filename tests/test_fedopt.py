"""FedOpt (PROTOCOL.md section 1, baselines): server SGD with momentum 0.9 on the pseudo-gradient
w_global - mean(client weights), server lr 0.5; clients train CE only; buffers take the mean.
The mean is unweighted over clients by default (RethinkFL's and MarsFL's `mean(dim=0)`);
`weighting=samples` weights it by the clients' sample counts. The step starts from the clients' mean under FPL's
protocol (`step_from=mean`, RethinkFL's code) and from the global model under the other papers' (`global`, Reddi et
al.'s)."""
from __future__ import annotations

import json

import pytest
import torch

from lightning_modules.clients import ClientGroup
from lightning_modules.fedavg import FedAvgClient
from lightning_modules.fedopt import FedOptServer
from lightning_modules.registry import METHODS
from lightning_modules.server import cast_like
from ray_jobs.config import RunConfig

from tiny_net import TinyNet


def f64(*v):
    return torch.tensor(v, dtype=torch.float64)


def make_rule(keys, **hp):
    return FedOptServer({**METHODS["fedopt"].defaults, "step_from": "global", **hp}, 10, 4, 5, keys)


def test_registry_defaults():
    m = METHODS["fedopt"]
    assert m.client is FedAvgClient and m.server is FedOptServer
    assert m.defaults == {"server_lr": 0.5, "server_momentum": 0.9, "weighting": "uniform", "step_from": "mean"}


@pytest.mark.parametrize("step_from", ["mean", "global"])
def test_three_rounds_by_hand_from_either_start(step_from):
    """lr 0.5, momentum 0.9, one parameter. The pseudo-gradient is always w - mean; the new model is mean - 0.5 buf
    (RethinkFL's code) or w - 0.5 buf (Reddi et al.)."""
    rule = make_rule(["w"], step_from=step_from)
    w = {"w": torch.tensor([1.0])}
    means = (0.0, 2.0, 1.0)
    # from the mean: g = 1 - 0 = 1, buf 1, w = 0 - 0.5 = -0.5; g = -0.5 - 2 = -2.5, buf 0.9 - 2.5 = -1.6,
    # w = 2 + 0.8 = 2.8; g = 2.8 - 1 = 1.8, buf -1.44 + 1.8 = 0.36, w = 1 - 0.18 = 0.82
    # from the global model: g = 1, buf 1, w = 1 - 0.5 = 0.5; g = 0.5 - 2 = -1.5, buf 0.9 - 1.5 = -0.6,
    # w = 0.5 + 0.3 = 0.8; g = 0.8 - 1 = -0.2, buf -0.54 - 0.2 = -0.74, w = 0.8 + 0.37 = 1.17
    want = {"mean": (-0.5, 2.8, 0.82), "global": (0.5, 0.8, 1.17)}[step_from]
    for r, (mean, expected) in enumerate(zip(means, want)):
        w = rule.aggregate(w, {"w": f64(mean)}, r)
        torch.testing.assert_close(w["w"], torch.tensor([expected]))


def test_fpl_protocol_steps_from_the_mean_the_others_from_the_global_model():
    """The registry's default is FPL's protocol's (RethinkFL's code); the other papers' presets set Reddi et al.'s
    step, and a run's folder name says the step only where it is not its protocol's."""
    assert RunConfig(method="fedopt", dataset="office_caltech").hparams["step_from"] == "mean"
    fpl = RunConfig.from_preset("fpl-office", method="fedopt")
    assert fpl.hparams["step_from"] == "mean" and fpl.run_name == "fedopt-office_caltech-default-seed0"
    plvm = RunConfig.from_preset("fedplvm-office10", method="fedopt")
    assert plvm.hparams["step_from"] == "global" and plvm.run_name == "fedopt-office10-default-seed0"
    assert RunConfig.from_preset("fedapc-office", method="fedopt").hparams["step_from"] == "global"
    assert RunConfig.from_preset("fedproto-mnist-n3", method="fedopt").hparams["step_from"] == "global"
    other = RunConfig.from_preset("fpl-office", method="fedopt", hparams={"step_from": "global"})
    assert other.run_name == "fedopt-office_caltech-default-step_fromglobal-seed0"
    with pytest.raises(ValueError, match=r"^unknown step_from value 'model'; choose one of: mean, global\.$"):
        RunConfig(method="fedopt", hparams={"step_from": "model"})


def test_runs_recorded_before_the_key_stepped_from_the_global_model():
    """A summary without step_from (every FedOpt run before 2026-11-29) took Reddi et al.'s step: it is not taken for
    a run of FPL's protocol today, and is one of step_from=global."""
    from benchmark.results import protocol, with_later_hparams
    today = json.loads(json.dumps(protocol(RunConfig.from_preset("fpl-office", method="fedopt"))))
    old = {**today, "hparams": {k: v for k, v in today["hparams"].items() if k != "step_from"}}
    assert with_later_hparams(old, today)["hparams"]["step_from"] == "global"
    assert protocol(with_later_hparams(old, today)) != today
    reddi = json.loads(json.dumps(protocol(RunConfig.from_preset("fpl-office", method="fedopt",
                                                                 hparams={"step_from": "global"}))))
    assert protocol(with_later_hparams(old, reddi)) == reddi


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


@pytest.mark.parametrize("step_from", ["global", "mean"])
def test_matches_torch_sgd_on_the_pseudo_gradient(step_from):
    """torch's SGD on the pseudo-gradient; from the mean, the parameters are set to the mean between the gradient
    and the step, as RethinkFL's `update_global` leaves them (its duplicated state_dict keys load the mean last)."""
    gen = torch.Generator().manual_seed(0)
    keys = ["a", "b"]
    rule = make_rule(keys, step_from=step_from)
    glob = {"a": torch.randn(3, generator=gen), "b": torch.randn(2, 2, generator=gen)}
    ref = [torch.nn.Parameter(glob[k].double().clone()) for k in keys]
    opt = torch.optim.SGD(ref, lr=0.5, momentum=0.9)  # the independent implementation
    for r in range(4):
        mean = {k: glob[k].double() + 0.1 * torch.randn(glob[k].shape, generator=gen, dtype=torch.float64)
                for k in keys}
        for p, k in zip(ref, keys):
            p.grad = p.detach() - mean[k]
            if step_from == "mean":
                with torch.no_grad():
                    p.copy_(mean[k])
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


# --------------------------------------------------------------------- two clients of unequal size
def images(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, 32, 32), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def make_group(client_ids, data, hp) -> ClientGroup:
    """A ClientGroup (the real accumulation of `train`) with injected tiny data."""
    group = ClientGroup.__new__(ClientGroup)
    group.cfg = RunConfig(method="fedopt", seed=0, local_epochs=1, batch_size=4, hparams=hp)
    group.device = torch.device("cpu")
    group.clients = [{"id": c, "domain": "mnist"} for c in client_ids]
    group.data = {c: data[c] for c in client_ids}
    group.module = FedAvgClient(TinyNet(10), hp, lr=0.05)
    group.client_states = {}
    return group


@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_two_clients_of_unequal_size(weighting):
    """Clients of 2 and 6 samples: the uniform mean gives each 1/2, the sample-weighted 1/4 and 3/4."""
    hp = {**METHODS["fedopt"].defaults, "weighting": weighting}
    data = {0: (images(2, 30), torch.tensor([0, 1])), 1: (images(6, 31), torch.tensor([2, 3, 4, 5, 6, 7]))}
    torch.manual_seed(0)
    g0 = {k: v.clone() for k, v in TinyNet(10).state_dict().items()}
    keys = [k for k, _ in TinyNet(10).named_parameters()]
    trained = {}
    for c in (0, 1):  # each client alone: its trained weights
        r = make_group([c], data, hp).train(g0, None, 0)
        trained[c] = {k: v / r["weight"] for k, v in r["sum"].items()}
    res = make_group([0, 1], data, hp).train(g0, None, 0)
    share = {"uniform": (0.5, 0.5), "samples": (0.25, 0.75)}[weighting]
    assert res["weight"] == {"uniform": 2.0, "samples": 8.0}[weighting]
    mean = {k: v / res["weight"] for k, v in res["sum"].items()}  # what the driver computes
    for k in g0:
        torch.testing.assert_close(mean[k], share[0] * trained[0][k] + share[1] * trained[1][k])
    new = make_rule(keys, weighting=weighting).aggregate(g0, mean, 0)
    for k in keys:  # first step: buf = grad
        torch.testing.assert_close(new[k], (g0[k].double() - 0.5 * (g0[k].double() - mean[k])).float())
    bn = [k for k in g0 if k not in keys]
    assert bn and all(torch.equal(new[k], cast_like(mean, g0)[k]) for k in bn)  # buffers: the same mean
    # the two weightings really differ on this case
    other = {0: 0.25, 1: 0.75} if weighting == "uniform" else {0: 0.5, 1: 0.5}
    k = keys[0]
    assert not torch.allclose(mean[k], other[0] * trained[0][k] + other[1] * trained[1][k])


def test_state_dict_carries_the_momentum_to_a_new_rule():
    """A rule rebuilt from state_dict (a resumed run) takes the same second step as the one that kept going:
    the hand numbers of the two-round test above."""
    rule = make_rule(["w"])
    g0 = {"w": torch.tensor([1.0, 2.0])}
    g1 = rule.aggregate(g0, {"w": f64(0.0, 1.0)}, 0)
    resumed = make_rule(["w"])
    resumed.load_state_dict(rule.state_dict())
    g2 = resumed.aggregate(g1, {"w": f64(0.5, 2.5)}, 1)
    torch.testing.assert_close(g2["w"], torch.tensor([0.05, 1.55]))  # without the momentum: (0.5, 2.0)
    with pytest.raises(KeyError, match="momentum_buf"):
        make_rule(["w"]).load_state_dict({})
