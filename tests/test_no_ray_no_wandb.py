"""A GPU machine may have neither Ray nor wandb: `--executor local` with WANDB_MODE=disabled runs
(one run, and a sweep's local path) with both blocked from import."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark.results import read_jsonl

REPO = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ray", "wandb"):
            raise ImportError(f"{name} is blocked in this test")

sys.meta_path.insert(0, Block())
from ray_jobs.run import main
from ray_jobs.sweep import execute
from ray_jobs.config import RunConfig

out, root = sys.argv[1], sys.argv[2]
small = ["--rounds", "1", "--local-epochs", "1", "--client-fraction", "0.05", "--eval-max", "20", "--quiet",
         "--executor", "local", "--dataset", "office_caltech", "--method", "fpl", "--data-root", root]
assert main([*small, "--out", out + "/run"]) == 0
cfg = RunConfig(method="fedavg", dataset="office_caltech", rounds=1, local_epochs=1, client_fraction=0.05, eval_max=20,
                executor="local", data_root=root, out=out + "/sweep")
assert execute([cfg], None) == [cfg.run_name]
print("blocked:", sorted(m for m in ("ray", "wandb") if m in sys.modules))
"""


@pytest.mark.slow
def test_local_run_and_sweep_without_ray_and_wandb(tmp_path, data_root):
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(data_root)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "blocked: []" in proc.stdout
    for name in ("run", "sweep"):
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["rounds"] == 1 and 0 <= summary["final"]["AVG"] <= 100
        rounds = read_jsonl(tmp_path / name / "metrics.jsonl")  # the summary is the round's test, as with Ray
        assert [r["round"] for r in rounds] == [0] and summary["final"] == rounds[0]["accuracy"]
        domains = summary["domains"]
        assert summary["final"]["AVG"] == pytest.approx(sum(summary["final"][d] for d in domains) / len(domains))
