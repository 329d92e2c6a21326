"""Client sampling (`--participation`): the draws from (seed, round), only the drawn clients train, count and are
recorded, each method's rule for the others (docs/scale.md), and the same runs on any executor and after a resume."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmark.results import read_jsonl
from benchmark.sampling import participant_count, participants
from lightning_modules.clients import ClientGroup
from ray_jobs.config import RunConfig
from ray_jobs.driver import Driver
from ray_jobs.run import RunError, plan_run_clients, run

# 5 clients (webcam 1, dslr 4), a few samples each: the code path of the Office protocol in seconds
TINY = dict(dataset="office_caltech", domains=["webcam", "dslr"], rounds=4, local_epochs=1, client_fraction=0.1,
            eval_max=30, num_actors=2, driver_cpus=1, cpus_per_actor=1)


def tiny(root, out=None, **kw) -> RunConfig:
    return RunConfig(**{**TINY, **kw}, data_root=str(root), out=None if out is None else str(out))


def recorded(out) -> list:
    """metrics.jsonl without its timings."""
    return [{k: v for k, v in r.items() if k != "time_s"} for r in read_jsonl(out / "metrics.jsonl")]


def test_draws_depend_on_seed_and_round_only():
    ids = list(range(20))
    assert participants(ids, 1.0, 0, 3) == ids  # every client, no draw
    assert [participant_count(20, f) for f in (0.1, 0.12, 0.01, 0.5, 0.99)] == [2, 2, 1, 10, 20]
    draws = [participants(ids, 0.1, 0, r) for r in range(200)]
    assert all(len(d) == 2 and d == sorted(d) and len(set(d)) == 2 for d in draws)
    assert draws == [participants(list(reversed(ids)), 0.1, 0, r) for r in range(200)]  # a pure function
    assert len({tuple(d) for d in draws}) > 50  # rounds differ
    assert set().union(*map(set, draws[:100])) == set(ids)  # every client drawn over enough rounds
    assert [participants(ids, 0.1, 1, r) for r in range(200)] != draws  # another seed, other draws
    cfg = RunConfig(participation=0.1, seed=0)
    assert [cfg.participants(r, ids) for r in range(200)] == draws
    assert cfg.run_name.endswith("-part0.1-seed0") and "part" not in RunConfig().run_name


def test_participation_is_a_protocol_setting():
    with pytest.raises(ValueError, match="participation must be in"):
        RunConfig(participation=0)
    with pytest.raises(ValueError, match="participation must be in"):
        RunConfig(participation=1.5)
    from benchmark.results import protocol

    assert protocol(RunConfig(participation=0.5))["participation"] == 0.5
    old = {k: v for k, v in protocol(RunConfig()).items() if k != "participation"}  # a run folder from before
    assert protocol(old) == protocol(RunConfig())


def tree_equal(a, b) -> bool:
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(tree_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(tree_equal(x, y) for x, y in zip(a, b))
    return a == b


def clone(obj):
    return torch.utils._pytree.tree_map(lambda t: t.clone() if torch.is_tensor(t) else t, obj)


@pytest.mark.parametrize("method", ["feddyn", "moon", "fedper", "fedproto_orig", "fedfa"])
@pytest.mark.slow
def test_a_client_not_drawn_keeps_its_state_exactly(data_root, method):
    """Per-client state (FedDyn's h_k, MOON's previous model, FedPer's head, FedProto's own model, FedFA's stream)
    of a client skipped in a round is, after that round, what it was after its last one; those drawn train."""
    cfg = tiny(data_root, method=method, executor="local")
    clients = plan_run_clients(cfg)[:3]
    group = ClientGroup(cfg, [{**c, "data_share": 1.0} for c in clients], str(data_root))
    init = {k: v.clone() for k, v in group.module.net.state_dict().items()}
    state = init if METHODS_AVERAGE[method] else None
    group.train(state, None, 0)
    before = clone(group.persistent_states())
    assert sorted(before) == [0, 1, 2]
    res = group.train(state, None, 1, [1])
    assert sorted(res["losses"]) == sorted(res["sent_weights"]) == sorted(res["protos"]) == [1]
    after = group.persistent_states()
    for cid in (0, 2):
        assert tree_equal(after[cid], before[cid]), cid
    if method != "fedfa":  # FedFA's state is its stream's coordinates (seed, id): the same after any round
        assert not tree_equal(after[1], before[1])
    empty = group.train(state, None, 2, [4])  # none of the group's clients drawn
    assert empty["sum"] is None and empty["weight"] == 0 and not empty["losses"]
    assert tree_equal(group.persistent_states(), after) and group.states_round == 2


METHODS_AVERAGE = {"feddyn": True, "moon": True, "fedper": True, "fedproto_orig": False, "fedfa": True}


@pytest.mark.slow
def test_feddyn_drift_is_the_mean_of_all_clients_h_under_partial_participation(data_root):
    """Acar et al.: the model sent is the drawn clients' mean plus the mean of all N clients' h_k, those not
    drawn included (theirs unchanged, zero before their first round)."""
    cfg = tiny(data_root, method="feddyn", executor="local", participation=0.4, num_actors=1)
    driver = Driver(cfg, plan_run_clients(cfg), str(data_root))
    drawn = []
    for r in range(3):
        drawn.append(driver.run_round(r)["trained_clients"])
    assert all(len(d) == 2 for d in drawn) and len(set(map(tuple, drawn))) > 1
    ck = driver.checkpoint()
    states = ck["client_states"]
    assert sorted(states) == sorted(set().union(*map(set, drawn))) and len(states) < 5
    flat = lambda ts: torch.cat([t.double().flatten() for t in ts])  # noqa: E731
    drift = flat(ck["rule_state"]["drift"][k] for k in driver.rule.param_keys)
    h = torch.stack([flat(st["h"]) for st in states.values()])
    mean_all, mean_trained = h.sum(dim=0) / 5, h.mean(dim=0)  # the clients never drawn hold h = 0
    scale = float(mean_all.abs().max())
    assert float((drift - mean_all).abs().max()) < 1e-3 * scale  # float32 rounding of h_k
    assert float((drift - mean_trained).abs().max()) > 0.1 * scale  # the mean over the clients that trained is not it


def test_fesem_clients_not_drawn_keep_their_centre(data_root):
    from lightning_modules.registry import METHODS

    rule = METHODS["fesem"].server({"clusters": 2, "distance": "weights"}, 10, 4, 3, ["w"])
    s = lambda v: {"w": torch.tensor([float(v)])}  # noqa: E731
    first = rule.aggregate_clients({0: s(0), 1: s(10), 2: s(1)}, {0: 1.0, 1: 1.0, 2: 1.0}, 0)
    assert {i: float(v["w"]) for i, v in first.items()} == {0: 0.5, 1: 10.0, 2: 0.5}
    second = rule.aggregate_clients({1: s(12)}, {1: 1.0}, 1)  # only client 1 trained
    assert {i: float(v["w"]) for i, v in second.items()} == {0: 0.5, 1: 12.0, 2: 0.5}
    assert rule.assignment == {0: 0, 1: 1, 2: 0}


@pytest.mark.slow
def test_only_drawn_clients_train_count_and_are_recorded_and_a_resume_draws_the_same(data_root, tmp_path):
    cfg = tiny(data_root, tmp_path / "ref", method="fedavg", executor="local", participation=0.4)
    run(cfg, quiet=True)
    rounds = recorded(tmp_path / "ref")
    ids = [c["id"] for c in plan_run_clients(cfg)]
    for r in rounds:
        assert r["trained_clients"] == cfg.participants(r["round"], ids) and len(r["trained_clients"]) == 2
        assert sorted(map(int, r["client_loss"])) == r["trained_clients"]
        assert sorted(map(int, r["communication"]["per_client"])) == r["trained_clients"]
    # a run that stops in round 2 (a non-finite loss of a client drawn there) and resumes from its checkpoint
    victim = cfg.participants(2, ids)[0]
    out = tmp_path / "resumed"
    with pytest.raises(RunError, match="non-finite"):
        run(dataclasses.replace(cfg, out=str(out), test_faults={"nan_loss": [2, victim]}), quiet=True)
    assert [r["round"] for r in read_jsonl(out / "metrics.jsonl")] == [0, 1]
    run(dataclasses.replace(cfg, out=str(out)), quiet=True, resume=True)
    assert recorded(out) == rounds


@pytest.mark.slow
def test_participation_that_draws_every_client_is_participation_one(data_root, tmp_path):
    """A share that rounds to every client trains every client, as participation 1 (today's runs: no draw)."""
    a = run(tiny(data_root, tmp_path / "a", method="feddyn", executor="local", rounds=2), quiet=True)
    b = run(tiny(data_root, tmp_path / "b", method="feddyn", executor="local", rounds=2, participation=0.95),
            quiet=True)
    assert recorded(tmp_path / "a") == recorded(tmp_path / "b")
    assert all(r["trained_clients"] == [0, 1, 2, 3, 4] for r in recorded(tmp_path / "a"))
    assert a["final"] == b["final"]
    assert tree_equal(torch.load(tmp_path / "a" / "model.pt"), torch.load(tmp_path / "b" / "model.pt"))


@pytest.mark.slow
def test_ray_draws_and_trains_as_local(ray_cluster, data_root, tmp_path):
    kw = dict(method="moon", participation=0.4, rounds=3)
    run(tiny(data_root, tmp_path / "local", executor="local", **kw), quiet=True)
    run(tiny(data_root, tmp_path / "ray", executor="ray", **kw), quiet=True)
    assert recorded(tmp_path / "ray") == recorded(tmp_path / "local")


def test_a_sweep_plans_its_runs_at_the_participation_given(data_root, tmp_path):
    from ray_jobs.plan import plan

    runs = plan("2", "smoke", None, tmp_path, str(data_root), {"participation": 0.5})
    assert runs and all(c.participation == 0.5 and f"-part0.5{c.departures_name}-seed" in c.out for c in runs)
