"""The processes a run or a sweep starts pick the same precision on a processor with native bfloat16 and on one
without: each path run as a subprocess under both kinds of processor (`conftest.PROCESSORS`, given to every process
through `benchmark.provenance.CPU_FLAGS_ENV`), its run folder's name and config.json read back."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark.provenance import CPU_FLAGS_ENV, cpu_flags, native_bf16
from conftest import PROCESSORS

PROJECT = Path(__file__).resolve().parent.parent
SMALL = ["--rounds", "1", "--local-epochs", "1", "--client-fraction", "0.05", "--eval-max", "50"]


def env_of(kind: str) -> dict:
    return {**os.environ, CPU_FLAGS_ENV: PROCESSORS[kind], "PYTHONPATH": str(PROJECT), "WANDB_MODE": "disabled"}


def test_the_flags_given_are_the_flags_every_process_reads(monkeypatch):
    for kind, flags in PROCESSORS.items():
        monkeypatch.setenv(CPU_FLAGS_ENV, flags)
        assert native_bf16(cpu_flags()) == (kind == "native-bf16")
    monkeypatch.setenv(CPU_FLAGS_ENV, "avx2,avx512_bf16")  # commas too
    assert cpu_flags() == {"avx2", "avx512_bf16"}
    monkeypatch.setenv(CPU_FLAGS_ENV, "")
    assert cpu_flags() == set()


@pytest.mark.parametrize("kind", PROCESSORS)
@pytest.mark.slow
def test_the_entry_point_without_precision_runs_32_true_in_the_short_runs_own_folder(kind, tmp_path, data_root):
    """A plain short run (the entry point as a user starts it, default folder under results/runs) on either
    processor: 32-true, in a folder whose name carries its departures from the preset (never the protocol run's)."""
    proc = subprocess.run([sys.executable, "-m", "ray_jobs.run", "--method", "fedavg", "--dataset", "office_caltech",
                           "--domains", "webcam,dslr", *SMALL, "--executor", "local", "--quiet",
                           "--data-root", str(data_root)],
                          cwd=tmp_path, env=env_of(kind), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (folder,) = (tmp_path / "results" / "runs").iterdir()
    assert folder.name == "fedavg-office_caltech-no_caltech_amazon-default-rounds1-epochs1-fraction0.05-evalmax50-seed0"
    config = json.loads((folder / "config.json").read_text())
    assert config["precision"] == "32-true" and "precision" not in config["departures"]
    (title,) = [line for line in proc.stdout.splitlines() if line.startswith("fedavg on")]
    assert title.startswith("fedavg on office_caltech (default split, seed 0, 1 rounds, 32-true)")


@pytest.mark.slow
def test_a_sweeps_worker_processes_run_32_true_on_a_processor_with_native_bfloat16(tmp_path, data_root):
    """Two smoke runs at once in worker processes (spawned: each reads the flags afresh) on a processor with native
    bfloat16: both 32-true, as the table's protocol (on Office-Caltech's two smallest domains: the precision is the
    same on any)."""
    proc = subprocess.run([sys.executable, "-m", "ray_jobs.sweep", "--table", "2", "--profile", "smoke", "--methods",
                           "fedavg,fedprox", "--datasets", "office_caltech", "--domains", "webcam,dslr",
                           "--executor", "local", "--parallel", "2",
                           "--results-dir", str(tmp_path), "--data-root", str(data_root)],
                          cwd=PROJECT, env=env_of("native-bf16"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    configs = [json.loads(p.read_text()) for p in sorted((tmp_path / "runs").glob("*/config.json"))]
    assert [(c["method"], c["precision"]) for c in configs] == [("fedavg", "32-true"), ("fedprox", "32-true")]
