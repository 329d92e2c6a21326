"""`--eval-every K`: evaluation is skipped in the rounds the schedule leaves out and touches nothing of training, so a
run evaluated every 3rd round trains exactly what a run evaluated every round trains, and its final and last-5
metrics read the same rounds."""
from __future__ import annotations

import pytest
import torch

from benchmark.protocols import ConfigError
from benchmark.results import MODEL_FILE, read_jsonl, read_summary
from ray_jobs.config import RunConfig
from ray_jobs.run import main, run
from ray_jobs.tables import TABLES

ROUNDS = 7  # evaluated with K = 3: rounds 2 and 5 by the schedule, rounds 2-6 as the last 5


def test_schedule_by_hand():
    cfg = RunConfig(rounds=ROUNDS, eval_every=3, executor="local")
    assert [r for r in range(ROUNDS) if cfg.evaluates(r)] == [2, 3, 4, 5, 6]
    cfg = RunConfig(rounds=100, eval_every=5, executor="local")
    assert [r for r in range(100) if cfg.evaluates(r)] == [*range(4, 95, 5), 95, 96, 97, 98, 99]
    assert all(RunConfig(rounds=4, executor="local").evaluates(r) for r in range(4))
    # a table that reads the final round only tests no more of the last 5 (eval_last 1)
    cfg = RunConfig(rounds=ROUNDS, eval_every=3, eval_last=1, executor="local")
    assert [r for r in range(ROUNDS) if cfg.evaluates(r)] == [2, 5, 6]
    cfg = RunConfig(rounds=50, eval_every=5, eval_last=1, executor="local")
    assert [r for r in range(50) if cfg.evaluates(r)] == [*range(4, 50, 5)]  # 10 of FedPLVM's 50 rounds, not 14
    # each table's full profile: the rounds its metric reads; the smoke profile every round
    assert (TABLES["fedplvm12"].overrides("full")["eval_last"] == 1
            and TABLES["fedproto"].overrides("full")["eval_last"] == 1)
    assert TABLES["2"].overrides("full")["eval_last"] == 5 and "eval_last" not in TABLES["fedplvm12"].overrides("smoke")
    # eval_every 0: the rounds the metric reads alone; a grid table's report reads nothing else
    cfg = RunConfig(rounds=50, eval_every=0, eval_last=1, executor="local")
    assert [r for r in range(50) if cfg.evaluates(r)] == [49]
    cfg = RunConfig(rounds=ROUNDS, eval_every=0, executor="local")
    assert [r for r in range(ROUNDS) if cfg.evaluates(r)] == [2, 3, 4, 5, 6]
    assert (TABLES["fedplvm_fig5"].overrides("full")["eval_every"] == 0
            and TABLES["fedplvm12"].overrides("full")["eval_every"] == 5)
    with pytest.raises(ConfigError, match="eval_last is 1"):
        RunConfig(eval_last=3)


@pytest.mark.parametrize("method,preset,kw", [
    # a global model tested in the driver, FINCH-clustered prototypes in the payload
    ("fpl", None, dict(dataset="office_caltech", domains=["webcam", "dslr"], client_fraction=0.05, eval_max=40)),
    # no global model: each client tests its own model on its own test samples in its group
    ("fedproto_orig", "fedproto-mnist-n3", dict(client_fraction=0.1)),
])
@pytest.mark.slow
def test_a_sparse_schedule_trains_exactly_what_every_round_trains(data_root, tmp_path, method, preset, kw):
    def one(k, last=5):
        out = tmp_path / f"k{k}-last{last}"
        base = dict(method=method, rounds=ROUNDS, local_epochs=1, eval_every=k, eval_last=last, executor="local",
                    num_actors=2, data_root=str(data_root), out=str(out), **kw)
        cfg = RunConfig.from_preset(preset, **base) if preset else RunConfig(**base)
        return run(cfg, quiet=True), read_jsonl(out / "metrics.jsonl")

    (every, rec1), (sparse, rec3), (final_only, rec_final) = one(1), one(3), one(3, last=1)
    assert [r["evaluated"] for r in rec3] == [False, False, True, True, True, True, True]
    assert all(r["evaluated"] for r in rec1)
    for a, b in zip(rec1, rec3):
        assert a["client_loss"] == b["client_loss"] and a["train_loss"] == b["train_loss"]  # bit for bit
        assert ("accuracy" in b) == b["evaluated"]
        if b["evaluated"]:
            assert a["accuracy"] == b["accuracy"]
            assert a.get("client_accuracy") == b.get("client_accuracy")
        else:
            assert "client_accuracy" not in b and b["time_s"]["evaluation"] < a["time_s"]["evaluation"]
    assert every["final"] == sparse["final"] and every["last5"] == sparse["last5"]
    assert sparse["last5"]["AVG"] == pytest.approx(sum(r["accuracy"]["AVG"] for r in rec1[-5:]) / 5)
    assert (every["evaluated_rounds"], sparse["evaluated_rounds"]) == (ROUNDS, 5)
    # the final global model, bit for bit (fedproto_orig keeps none: its clients' own models are their states)
    saved = [(tmp_path / f"k{k}-last5" / MODEL_FILE).exists() for k in (1, 3)]
    assert saved == [method == "fpl"] * 2
    if method == "fpl":
        m1, m3 = (torch.load(tmp_path / f"k{k}-last5" / MODEL_FILE) for k in (1, 3))
        assert all(torch.equal(m1[n], m3[n]) for n in m1)
    assert read_summary(tmp_path / "k3-last5") == sparse
    # the final round only (a table whose metric is the final round): rounds 2 and 5 by the schedule, and 6
    assert [r["evaluated"] for r in rec_final] == [False, False, True, False, False, True, True]
    assert [r["client_loss"] for r in rec_final] == [r["client_loss"] for r in rec1]
    assert final_only["final"] == every["final"] and final_only["last5"] is None
    assert final_only["evaluated_rounds"] == 3 and read_summary(tmp_path / "k3-last1") == final_only


def test_bad_eval_every_is_one_line(capsys):
    assert main(["--eval-every", "-1", "--executor", "local"]) == 2
    assert capsys.readouterr().err.strip() == "error: eval-every must be 0 (the last rounds alone) or more (got -1)."
    with pytest.raises(ConfigError):
        RunConfig(eval_every=-1)


def test_a_report_says_the_schedules_its_runs_used(tmp_path):
    """A report's setting line names each schedule its complete runs used, from their config.json."""
    from ray_jobs.report import setting_line

    runs = []
    for i, (every, last) in enumerate([(5, 1), (5, 5), (5, 1)]):
        cfg = RunConfig.from_preset("fedplvm-digit5", seed=i, eval_every=every, eval_last=last,
                                    out=str(tmp_path / str(i)))
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "config.json").write_text(cfg.to_json())
        runs.append(cfg)
    line = setting_line(runs[0], ["mnist"], runs)
    assert "tested after every 5th round and the final one or every 5th round and the last 5." in line
    assert "tested after every 5th round and the final one." in setting_line(runs[0], ["mnist"], runs[::2])
    grid = RunConfig.from_preset("fedplvm-digit5", seed=3, eval_every=0, eval_last=1, out=str(tmp_path / "3"))
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / "config.json").write_text(grid.to_json())
    assert "tested after the final round." in setting_line(grid, ["mnist"], [grid])


@pytest.mark.parametrize("every, last, words", [
    (1, 5, "every round"), (0, 1, "the final round"), (0, 5, "the last 5 rounds"),
    (2, 1, "every 2nd round and the final one"), (3, 5, "every 3rd round and the last 5"),
    (5, 1, "every 5th round and the final one"), (12, 1, "every 12th round and the final one"),
    (21, 1, "every 21st round and the final one")])
def test_schedule_words(every, last, words):
    from ray_jobs.report import schedule_words

    assert schedule_words(every, last) == words
