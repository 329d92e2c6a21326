"""FedPLVM's Dirichlet label skew (`--split dirichlet --dirichlet-alpha A`; Tables 7 and 8: 0.5, Office-10 1.0):
the class counts its code draws (`utils/data_util.py`, `prepare_data_digits_noniid` / `prepare_data_office_noniid`)
re-drawn here by a plain loop, every sample on one client at most, one draw for every seed and method (the code's: it
seeds numpy with 0 in every run) unless --dirichlet-seed asks for another, the test sets and config.json's counts."""
from __future__ import annotations

import math

import numpy as np
import pytest

from benchmark.data import load_domain
from benchmark.partition import class_blocks
from ray_jobs.config import RunConfig
from ray_jobs.run import build_parser, config_from_args, plan_run_clients

DIGIT5 = ["mnist", "svhn", "usps", "syn", "mnistm"]
OFFLINE = ["mnist", "usps", "syn", "mnistm"]  # the shared data has no full SVHN


def drawn_by_loop(seed: int, clients: int, n: int, alpha: float, ceil: bool) -> list[list[int]]:
    """The reference's counts, written out: numpy's global stream seeded, then per class one Dirichlet draw over the
    clients, each client's count ceil (Digit-5) or int (Office) of p * clients * n. [client][class]."""
    np.random.seed(seed)
    out = [[0] * 10 for _ in range(clients)]
    for k in range(10):
        p = np.random.dirichlet([alpha] * clients)
        p = p / p.sum()
        for i in range(clients):
            v = p[i] * clients * n
            out[i][k] = math.ceil(v) if ceil else int(v)
    return out


@pytest.mark.parametrize("seed, draw", [(0, 0), (1, 0), (0, 3)])
@pytest.mark.slow
def test_digit5_counts_are_the_reference_draw_and_the_same_for_every_method(data_root, seed, draw):
    plans = []
    for method in ("fedavg", "fedplvm"):
        cfg = RunConfig.from_preset("fedplvm-digit5", method=method, domains=OFFLINE, seed=seed, dirichlet_alpha=0.5,
                                    dirichlet_seed=draw)
        plans.append(plan_run_clients(cfg, data_root))
    assert plans[0] == plans[1]  # the split is the protocol's, not the method's
    assert [c["domain"] for c in plans[0]] == OFFLINE  # one client per domain run
    train, test = drawn_by_loop(draw, 5, 10, 0.5, True), drawn_by_loop(draw, 5, 100, 0.5, True)
    for c in plans[0]:
        i = DIGIT5.index(c["domain"])  # the draw covers SVHN's client too: leaving it out moves no one's counts
        dom = load_domain(data_root, "digit5", c["domain"])
        have = np.bincount(dom.train_y, minlength=10)
        assert c["class_counts"] == np.minimum(train[i], have).tolist()  # the training archives have enough
        assert c["class_counts"] == train[i]
        assert c["num_samples"] == sum(train[i]) == len(c["indices"])
        assert c["test_class_counts"] == np.minimum(test[i], np.bincount(dom.test_y, minlength=10)).tolist()
        # a client's samples: the first drawn count of each class of its domain's training set, as the reference
        kept = load_domain(data_root, "digit5", c["domain"], per_class=cfg.domain_per_class(c["domain"]))
        first = np.concatenate([np.flatnonzero(dom.train_y == k)[:train[i][k]] for k in range(10)])
        assert np.array_equal(np.sort(kept.train_y[c["indices"]]), np.sort(dom.train_y[first]))
        assert np.array_equal(kept.train_x[c["indices"]], dom.train_x[np.sort(first)])
        # its test set (the driver's): the first drawn count of each class of the test archive
        assert np.bincount(kept.test_y, minlength=10).tolist() == c["test_class_counts"]


@pytest.mark.slow
def test_the_seeds_share_the_codes_draw_and_another_dirichlet_seed_draws_other_counts(data_root):
    """FedPLVM's main() seeds numpy with 0 in every run, so its runs share one draw: seeds 0 and 1 train on the same
    class counts; --dirichlet-seed 1 draws others."""
    got = [[c["class_counts"] for c in plan_run_clients(RunConfig.from_preset(
        "fedplvm-digit5", domains=OFFLINE, seed=s, dirichlet_alpha=0.5, dirichlet_seed=d), data_root)]
        for s, d in ((0, 0), (1, 0), (0, 1))]
    assert got[0] == got[1] != got[2]
    # by hand from the reference's first draw: MNIST's class 0 is ceil(p_0 * 50) with p ~ Dir(0.5, ..., 0.5)
    np.random.seed(0)
    assert got[0][0][0] == math.ceil(np.random.dirichlet([0.5] * 5)[0] * 50) == 8


@pytest.mark.parametrize("alpha", [0.5, 1.0])  # the stated concentration, and Table 8's
def test_office10_truncates_its_counts(data_root, alpha):
    cfg = RunConfig.from_preset("fedplvm-office10", domains=["amazon", "dslr"], seed=0, dirichlet_alpha=alpha)
    train = drawn_by_loop(0, 4, 10, alpha, False)
    clients = plan_run_clients(cfg, data_root)
    assert [c["domain"] for c in clients] == ["amazon", "dslr"]
    for c in clients:
        i = ["amazon", "caltech", "dslr", "webcam"].index(c["domain"])
        dom = load_domain(data_root, "office10", c["domain"])
        assert c["class_counts"] == np.minimum(train[i], np.bincount(dom.train_y, minlength=10)).tolist()


def test_every_sample_on_one_client_at_most():
    """Several clients of a domain: each class's drawn counts taken one client after another; a class that runs out
    leaves the last ones what is left."""
    labels = np.array([0, 1, 0, 2, 0, 1, 0, 2, 1, 0])  # class 0: 5, class 1: 3, class 2: 2
    counts = np.array([[2, 1, 0], [2, 1, 2], [3, 5, 1]])
    shards = class_blocks(labels, counts)
    assert [s.tolist() for s in shards] == [[0, 1, 2], [3, 4, 5, 6, 7], [8, 9]]
    flat = np.concatenate(shards)
    assert len(flat) == len(set(flat.tolist()))
    rng_shards = class_blocks(labels, counts, np.random.default_rng(0))
    assert sorted(np.concatenate(rng_shards).tolist()) == sorted(flat.tolist())  # same counts, other samples
    assert [np.bincount(labels[s], minlength=3).tolist() for s in rng_shards] == [[2, 1, 0], [2, 1, 2], [1, 1, 0]]


def test_share_protocol_clients_are_disjoint(data_root):
    """Under FPL's protocol (several clients a domain, shares drawn at random) the skew draws each client's classes:
    no sample on two clients, int(1% N) samples a client on average (each class's counts rounded up)."""
    cfg = RunConfig.from_preset("fpl-digits", domains=["usps"], seed=0, dirichlet_alpha=0.5)
    clients = plan_run_clients(cfg, data_root)
    idx = np.concatenate([c["indices"] for c in clients])
    assert len(clients) == 4 and len(idx) == len(set(idx.tolist()))
    labels = load_domain(data_root, "digits", "usps", need_test=False).train_y
    for c in clients:
        assert np.bincount(labels[c["indices"]], minlength=10).tolist() == c["class_counts"]
    # the draw by hand: the code split's 20 clients (MNIST 6, USPS 4, SVHN 3, SYN 7), per class p ~ Dirichlet(0.5)
    # from numpy's legacy stream seeded 0, ceil(p * 20 * 7.2) for USPS's clients 6 to 9 (7.2: int(1% of 7,291) / 10)
    rng = np.random.RandomState(0)
    drawn = np.ceil(np.stack([rng.dirichlet(np.full(20, 0.5)) * 20 * 7.2 for _ in range(10)], axis=1))[6:10]
    assert [c["class_counts"] for c in clients] == drawn.astype(int).tolist()  # USPS has enough of every class
    sizes = [c["num_samples"] for c in clients]
    assert len(set(sizes)) > 1 and 4 * 72 <= sum(sizes) < 4 * 72 + 4 * 10  # skewed; 72 each on average, ceil aside
    assert plan_run_clients(cfg, data_root) == clients  # seeded


def test_command_line_and_run_name():
    parse = lambda *a: config_from_args(build_parser().parse_args(list(a)))  # noqa: E731
    cfg = parse("--preset", "fedplvm-digit5", "--split", "dirichlet")
    assert cfg.dirichlet_alpha == 0.5 and cfg.split == "default"
    assert cfg.run_name == "fpl-digit5-default-dirichlet0.5-seed0"
    drawn = parse("--preset", "fedplvm-digit5", "--split", "dirichlet", "--dirichlet-seed", "2", "--seed", "1")
    assert (drawn.dirichlet_seed, drawn.run_name) == (2, "fpl-digit5-default-dirichlet0.5-draw2-seed1")
    with pytest.raises(Exception, match="does not use; add --split dirichlet"):
        parse("--preset", "fedplvm-digit5", "--dirichlet-seed", "2")
    with pytest.raises(Exception, match="dirichlet-seed must be a whole number"):
        RunConfig.from_preset("fedplvm-digit5", dirichlet_alpha=0.5, dirichlet_seed=-1)
    assert parse("--preset", "fedplvm-office10", "--split", "dirichlet",
                 "--dirichlet-alpha", "0.1").dirichlet_alpha == 0.1
    assert parse("--preset", "fedplvm-digit5").dirichlet_alpha is None
    with pytest.raises(Exception, match="dirichlet-alpha must be"):
        RunConfig.from_preset("fedplvm-digit5", dirichlet_alpha=0.0)
    with pytest.raises(Exception, match="n-way k-shot"):
        RunConfig.from_preset("fedproto-mnist-n3", dirichlet_alpha=0.5)


def test_a_run_recorded_before_the_skew_existed_is_label_iid(tmp_path):
    """dirichlet_alpha is a protocol key: a summary written before it existed ran label iid (None)."""
    import json

    from benchmark.results import is_complete, protocol

    cfg = RunConfig.from_preset("fedplvm-digit5", method="fedplvm")
    old = {k: v for k, v in protocol(cfg).items() if k != "dirichlet_alpha"}
    (tmp_path / "summary.json").write_text(json.dumps({"complete": True, "protocol": old}))
    assert is_complete(tmp_path, protocol(cfg))
    assert not is_complete(tmp_path, protocol(RunConfig.from_preset("fedplvm-digit5", method="fedplvm",
                                                                     dirichlet_alpha=0.5)))
    (tmp_path / "summary.json").write_text(json.dumps({"complete": True, "protocol": {"method": "fedplvm"}}))
    assert not is_complete(tmp_path, protocol(cfg))


def test_a_skewed_run_recorded_before_dirichlet_seed_drew_with_its_own_seed(tmp_path):
    """A label-skew summary written before dirichlet_seed existed drew its counts with its run's seed: seed 0's is
    the code's draw, complete for today's seed-0 run; seed 1's drew other counts, so today's seed-1 run (draw 0) is
    not it, a run asking for --dirichlet-seed 1 at seed 1 is."""
    import json

    from benchmark.results import is_complete, protocol

    for seed in (0, 1):
        cfg = RunConfig.from_preset("fedplvm-digit5", method="fedplvm", seed=seed, dirichlet_alpha=0.5)
        old = {k: v for k, v in protocol(cfg).items() if k != "dirichlet_seed"}
        (tmp_path / "summary.json").write_text(json.dumps({"complete": True, "protocol": old}))
        assert is_complete(tmp_path, protocol(cfg)) == (seed == 0)
        assert is_complete(tmp_path, protocol(RunConfig.from_preset(
            "fedplvm-digit5", method="fedplvm", seed=seed, dirichlet_alpha=0.5, dirichlet_seed=seed)))
    iid = RunConfig.from_preset("fedplvm-digit5", method="fedplvm", seed=1)  # label iid: no draw, whatever the seed
    (tmp_path / "summary.json").write_text(json.dumps({"complete": True, "protocol": {
        k: v for k, v in protocol(iid).items() if k != "dirichlet_seed"}}))
    assert is_complete(tmp_path, protocol(iid))


def test_table8_draws_office10_at_concentration_1_and_table7_digit5_at_0_5(tmp_path):
    """FedPLVM's Tables 7 and 8 plan their runs with the table's skew and, for Office-10, its preset's: 0.5 for
    Digit-5 (the paper's), 1.0 for Office-10 (the draw the paper's Table 8 means fit, docs/deviations.md 32), each
    averaged by sample count and named by its concentration; other tables' Office-10 runs stay label-iid."""
    from ray_jobs.plan import plan

    runs = plan("fedplvm78", "full", None, tmp_path, None, find_data=False)
    alphas = {(c.dataset, c.dirichlet_alpha, c.aggregation) for c in runs}
    assert alphas == {("digit5", 0.5, "samples"), ("office10", 1.0, "samples")} and len(runs) == 42
    names = {c.run_name for c in runs if c.method == "fedavg" and c.seed == 0}
    assert names == {"fedavg-digit5-default-dirichlet0.5-seed0", "fedavg-office10-default-dirichlet1-seed0"}
    assert {c.dirichlet_alpha for c in plan("fedplvm12", "full", None, tmp_path, None, find_data=False)} == {None}
