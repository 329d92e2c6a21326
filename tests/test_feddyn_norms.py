"""tools/feddyn_norms.py: its rows are the run's own. After 2 rounds the evaluated model's norm is that of the
model.pt a run through the entry point saves (the same settings: the average FedDyn evaluates), its accuracy that
run's, and the sent model is the evaluated one plus the drift (norms by the triangle inequality; after round 0 the
drift is the mean client move, so the sent model is not the evaluated one). The run's metrics.jsonl records the
same norms, which --run reads back."""
from __future__ import annotations

import json
import math

import pytest
import tool_script

from benchmark.figures import load_model
from ray_jobs.run import build_parser, config_from_args, run

feddyn_norms = tool_script.load("feddyn_norms")

FLAGS = ["--preset", "fpl-office", "--method", "feddyn", "--rounds", "2", "--local-epochs", "1",
         "--client-fraction", "0.1", "--eval-max", "16", "--executor", "local", "--eval-every", "1"]


@pytest.mark.slow
def test_rows_are_the_runs_own(data_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    args = build_parser().parse_args([*FLAGS, "--data-root", str(data_root), "--out", str(tmp_path / "run")])
    rows = list(feddyn_norms.rounds(config_from_args(args)))
    summary = run(config_from_args(args), quiet=True)
    model = load_model(tmp_path / "run")
    keys = [k for k, _ in model.named_parameters()]
    state = model.state_dict()
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[-1]["evaluated_norm"] == pytest.approx(math.sqrt(sum(float(state[k].double().pow(2).sum())
                                                                     for k in keys)), rel=1e-6)
    assert rows[-1]["accuracy"] == pytest.approx(summary["final"]["AVG"])
    for r in rows:
        assert abs(r["sent_norm"] - r["evaluated_norm"]) <= r["drift_norm"] * (1 + 1e-6)
        assert r["drift_norm"] > 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["complete"]
    # the run recorded the rows the tool made in process; --run prints them and writes them as CSV
    recorded = feddyn_norms.recorded(tmp_path / "run")
    assert [list(r) for r in recorded] == [list(feddyn_norms.COLUMNS)] * 2
    for got, made in zip(recorded, rows):
        assert got == pytest.approx(made, rel=1e-6)
    capsys.readouterr()
    assert feddyn_norms.main(["--run", str(tmp_path / "run"), "--csv", str(tmp_path / "n.csv")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    lines = (tmp_path / "n.csv").read_text().splitlines()
    assert lines[0] == ",".join(feddyn_norms.COLUMNS) and float(lines[2].split(",")[1]) == recorded[1]["evaluated_norm"]


def test_bad_flag_is_one_line(capsys, tmp_path):
    assert feddyn_norms.main(["--preset", "fpl-office", "--rounds", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert feddyn_norms.main(["--run", str(tmp_path)]) == 2  # no run there
    assert capsys.readouterr().err == f"error: {tmp_path} has no metrics.jsonl: give a run folder " \
                                      "(results/runs/<run name>)\n"
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"round": 0, "train_loss": 1.0}) + "\n")  # not FedDyn's
    assert feddyn_norms.main(["--run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: round 0 records no server_norms: not a FedDyn run") and err.count("\n") == 1
