"""MOON client (PROTOCOL.md section 1, baselines): CE + mu * model-contrastive loss, mu = 5,
temperature 0.5, on the 512-d features; global and previous local model frozen (no gradient); the
previous model is per-client state. As RethinkFL's moon.py (defaults): the frozen models run in
training mode (BatchNorm on batch statistics) and round 0's previous model is the client's own random
initialisation, seeded from (seed, client id); `frozen_mode=eval` / `initial_previous=global` give the
eval-mode variant with the starting model as round 0's previous."""
from __future__ import annotations

import math

import pytest
import torch

from benchmark.models import ResNet10
from benchmark.transforms import normalize
from lightning_modules.base import fit_local
from lightning_modules.clients import ClientGroup
from lightning_modules.fedavg import FedAvgServer
from lightning_modules.losses import moon_loss
from lightning_modules.moon import MOONClient, own_initialisation
from lightning_modules.registry import METHODS
from ray_jobs.config import RunConfig

from tiny_net import TinyNet


def images(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, 32, 32), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def initial_state(seed: int = 0, net=ResNet10) -> dict:
    torch.manual_seed(seed)
    return {k: v.clone() for k, v in net(10).state_dict().items()}


def make_client(tiny_net: bool = False, **hp) -> MOONClient:
    return MOONClient(TinyNet(10) if tiny_net else ResNet10(10), {**METHODS["moon"].defaults, **hp})


def assert_state_equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def states_differ(a: dict, b: dict) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a)


def ref_moon(z, zg, zp, t):
    """Per sample -log(e^{cos(z,zg)/T} / (e^{cos(z,zg)/T} + e^{cos(z,zp)/T})), batch mean, in float64."""
    def cos(a, b):
        return float(a @ b) / (float(a.norm()) * float(b.norm()))

    out = []
    for i in range(len(z)):
        pos = math.exp(cos(z[i].double(), zg[i].double()) / t)
        neg = math.exp(cos(z[i].double(), zp[i].double()) / t)
        out.append(-math.log(pos / (pos + neg)))
    return sum(out) / len(out)


def test_registry_defaults():
    m = METHODS["moon"]
    assert m.client is MOONClient and m.server is FedAvgServer
    assert m.defaults == {"mu": 5.0, "temperature": 0.5, "frozen_mode": "train", "initial_previous": "own",
                          "double_forward": True}


def test_moon_loss_hand_numbers():
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    zg = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    zp = torch.tensor([[0.0, 1.0], [0.0, 1.0], [0.0, 2.0]])
    # cos pairs (pos, neg): (1, 0), (1/sqrt2, 1/sqrt2), (0, 1); T = 0.5 doubles them
    expected = (math.log1p(math.exp(-2.0)) + math.log(2.0) + math.log1p(math.exp(2.0))) / 3
    assert float(moon_loss(z, zg, zp, 0.5)) == pytest.approx(expected, rel=1e-6)
    # T = 1: logits (1, 0), (c, c), (0, 1)
    expected_t1 = (math.log1p(math.exp(-1.0)) + math.log(2.0) + math.log1p(math.exp(1.0))) / 3
    assert float(moon_loss(z, zg, zp, 1.0)) == pytest.approx(expected_t1, rel=1e-6)


def test_moon_loss_random_against_per_sample_reference():
    gen = torch.Generator().manual_seed(3)
    z, zg, zp = (torch.randn(6, 8, generator=gen) for _ in range(3))
    for t in (0.5, 2.0):
        assert float(moon_loss(z, zg, zp, t)) == pytest.approx(ref_moon(z, zg, zp, t), rel=1e-5)


@pytest.mark.parametrize("frozen_mode", ["train", "eval"])
def test_nets_frozen_and_their_mode(frozen_mode):
    start = initial_state()
    module = make_client(frozen_mode=frozen_mode)
    module.net.load_state_dict(start)
    module.start_round(0, None, start, client_state=module.initial_client_state(0, {"id": 4}))
    assert_state_equal(module.global_net.state_dict(), start)
    frozen = list(module.global_net.parameters()) + list(module.previous_net.parameters())
    assert frozen and all(not p.requires_grad for p in frozen)

    module.train()  # what fit_local does before the local epochs
    assert module.net.training
    assert module.global_net.training == module.previous_net.training == (frozen_mode == "train")

    x, y = normalize(images(4, 1)), torch.tensor([1, 2, 3, 4])
    module.on_train_epoch_start()
    module.training_step((x, y), 0).backward()
    assert all(p.grad is None for p in frozen)
    assert all(p.grad is not None for p in module.net.parameters())


def test_own_initialisation_is_seeded_by_seed_and_client():
    a = own_initialisation(ResNet10, 10, 0, 3)
    assert_state_equal(a, own_initialisation(ResNet10, 10, 0, 3))  # any executor, any order
    assert states_differ(a, own_initialisation(ResNet10, 10, 0, 4))
    assert states_differ(a, own_initialisation(ResNet10, 10, 1, 3))
    assert states_differ(a, initial_state(0))  # not the shared starting model
    rng_before = torch.get_rng_state()
    own_initialisation(TinyNet, 10, 0, 3)
    assert torch.equal(torch.get_rng_state(), rng_before)  # the global torch stream is untouched


@pytest.mark.parametrize("initial_previous", ["own", "global"])
def test_round0_term(initial_previous):
    """Round 0: with the client's own initialisation as previous model the term is the MOON loss against
    it (active, not constant); with the starting model it is mu * log 2 whatever the weights."""
    start = initial_state(0, TinyNet)
    module = make_client(tiny_net=True, initial_previous=initial_previous)
    module.net.load_state_dict(start)
    module.start_round(0, None, start, client_state=module.initial_client_state(0, {"id": 7}))
    previous = own_initialisation(TinyNet, 10, 0, 7) if initial_previous == "own" else start
    assert_state_equal(module.previous_net.state_dict(), previous)
    module.train()
    x, y = normalize(images(8, 2)), torch.tensor([0, 1, 2, 3, 4, 5, 6, 7])
    logits, z = module.net(x)
    got = float(module.extra_loss(x, y, logits, z).detach())
    if initial_previous == "global":
        assert got == pytest.approx(5.0 * math.log(2.0), rel=1e-5)
        return
    ref_g, ref_p = TinyNet(10), TinyNet(10)
    ref_g.load_state_dict(start)
    ref_p.load_state_dict(previous)
    with torch.no_grad():  # training mode: batch statistics
        zg, zp = ref_g.train().features(x), ref_p.train().features(x)
    assert got == pytest.approx(5.0 * ref_moon(z.detach(), zg, zp, 0.5), rel=1e-4)
    assert abs(got - 5.0 * math.log(2.0)) > 1e-3


@pytest.mark.parametrize("mu,temperature", [(5.0, 0.5), (1.5, 2.0)])  # the defaults, and others by value
def test_extra_loss_uses_frozen_features_in_the_chosen_mode(mu, temperature):
    glob = initial_state(0, TinyNet)
    prev = initial_state(1, TinyNet)  # this client's model of its last round
    with torch.no_grad():  # running statistics far from the batch's, so that the two modes differ
        glob["bn.running_mean"].fill_(0.5)
        prev["bn.running_var"].fill_(4.0)
    x, y = normalize(images(4, 2)), torch.tensor([0, 1, 2, 3])
    got = {}
    for mode in ("train", "eval"):
        module = make_client(tiny_net=True, frozen_mode=mode, mu=mu, temperature=temperature)
        module.net.load_state_dict(glob)
        module.start_round(3, None, glob, client_state=prev)
        module.train()
        logits, z = module.net(x)
        got[mode] = float(module.extra_loss(x, y, logits, z).detach())

        ref_g, ref_p = TinyNet(10), TinyNet(10)
        ref_g.load_state_dict(glob)
        ref_p.load_state_dict(prev)
        with torch.no_grad():
            zg = ref_g.train(mode == "train").features(x)
            zp = ref_p.train(mode == "train").features(x)
        assert got[mode] == pytest.approx(mu * ref_moon(z.detach(), zg, zp, temperature), rel=1e-4)
    assert got["train"] != pytest.approx(got["eval"], rel=1e-3)


def test_client_state_is_trained_weights_and_becomes_next_previous():
    start = initial_state(0, TinyNet)
    module = make_client(tiny_net=True)
    module.net.load_state_dict(start)
    module.start_round(0, None, start, client_state=None)
    frozen_before = {k: v.clone() for k, v in module.global_net.state_dict().items()}
    fit_local(module, images(4, 3), torch.tensor([0, 1, 0, 1]), 1, 4, torch.Generator().manual_seed(0))
    # the frozen global model did not move, BN statistics included (training mode uses the batch's)
    assert module.global_net.training
    assert_state_equal(module.global_net.state_dict(), frozen_before)

    trained = {k: v.clone() for k, v in module.net.state_dict().items()}
    assert states_differ(trained, start)
    state = module.client_state()
    assert_state_equal(state, trained)
    with torch.no_grad():  # a copy: later changes to the net do not reach it
        next(module.net.parameters()).add_(1.0)
    assert_state_equal(state, trained)

    new_global = initial_state(5, TinyNet)
    module.net.load_state_dict(new_global)
    module.start_round(1, None, new_global, client_state=state)
    assert_state_equal(module.previous_net.state_dict(), trained)
    assert_state_equal(module.global_net.state_dict(), new_global)


# --------------------------------------------------------------------- several clients on one module
def make_group(client_ids, data) -> ClientGroup:
    """A ClientGroup (the real per-client state protocol of `train`) with injected tiny data."""
    group = ClientGroup.__new__(ClientGroup)
    group.cfg = RunConfig(method="moon", seed=0, local_epochs=1, batch_size=4)
    group.device = torch.device("cpu")
    group.clients = [{"id": c, "domain": "mnist"} for c in client_ids]
    group.data = {c: data[c] for c in client_ids}
    group.module = make_client(tiny_net=True)
    group.client_states = {}
    seen = group.previous_seen = []
    original = group.module.start_round

    def spy(round_idx, payload, global_state, client_state):
        original(round_idx, payload, global_state, client_state)
        seen.append({k: v.clone() for k, v in group.module.previous_net.state_dict().items()})

    group.module.start_round = spy
    return group


def test_two_clients_on_one_module_keep_their_own_previous_model():
    data = {7: (images(4, 10), torch.tensor([0, 1, 2, 3])), 9: (images(4, 11), torch.tensor([4, 5, 6, 7]))}
    g0 = initial_state(0, TinyNet)
    both, alone = make_group([7, 9], data), {c: make_group([c], data) for c in (7, 9)}

    res0 = both.train(g0, None, 0)
    for c in (7, 9):
        alone[c].train(g0, None, 0)
    # round 0: previous = each client's own initialisation
    assert_state_equal(both.previous_seen[0], own_initialisation(TinyNet, 10, 0, 7))
    assert_state_equal(both.previous_seen[1], own_initialisation(TinyNet, 10, 0, 9))
    # each client's stored state is its own trained model: the weights it trained alone
    trained0 = {c: both.client_states[c] for c in (7, 9)}
    for c in (7, 9):
        assert_state_equal(trained0[c], alone[c].client_states[c])
    assert states_differ(trained0[7], trained0[9])
    # and it is the client's trained weights (the one-client group's weighted sum / weight)
    res_alone7 = make_group([7], data).train(g0, None, 0)
    for k, v in trained0[7].items():
        torch.testing.assert_close(v, (res_alone7["sum"][k] / res_alone7["weight"]).to(v.dtype), rtol=0, atol=0)

    g1 = {k: (res0["sum"][k] / res0["weight"]).to(g0[k].dtype) for k in g0}
    both.train(g1, None, 1)
    for c in (7, 9):
        alone[c].train(g1, None, 1)
    # round 1: the previous model of each client is its own round-0 model, not the other's, not reset
    assert_state_equal(both.previous_seen[2], trained0[7])
    assert_state_equal(both.previous_seen[3], trained0[9])
    for c in (7, 9):
        assert_state_equal(both.client_states[c], alone[c].client_states[c])
