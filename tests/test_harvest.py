"""tools/harvest.sh: a sweep's complete runs copied into this checkout in their committed form."""
from __future__ import annotations

import gzip
import json
import shutil
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark.results import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
RECORDS = '{"round": 0, "accuracy": {"AVG": 10.0}}\n{"round": 1, "accuracy": {"AVG": 12.5}}\n'


def checkout(dst: Path) -> Path:
    """A git checkout holding tools/harvest.sh alone (what the script needs of the project)."""
    (dst / "tools").mkdir(parents=True)
    shutil.copy(ROOT / "tools" / "harvest.sh", dst / "tools")
    subprocess.run(["git", "init", "-q", str(dst)], check=True)
    return dst


def harvest(src: Path, dst: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "tools/harvest.sh", str(src)], cwd=dst, capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable})


@pytest.mark.slow
def test_complete_runs_come_with_their_rounds_gzipped_and_nothing_else(tmp_path):
    src, dst = tmp_path / "sweep", checkout(tmp_path / "checkout")
    (dst / "benchmark").symlink_to(ROOT / "benchmark")  # the checkout's code: pack_metrics packs old-code runs
    runs = src / "results" / "runs"
    for name in ("new-code", "old-code", "in-progress"):
        (runs / name).mkdir(parents=True)
        (runs / name / "config.json").write_text(json.dumps({"run": name}))
        (runs / name / "metrics.jsonl").write_text(RECORDS)
        (runs / name / "model.pt").write_bytes(b"weights")
    for name in ("new-code", "old-code"):
        (runs / name / "summary.json").write_text('{"complete": true}')
    (runs / "new-code" / "metrics.jsonl.gz").write_bytes(
        gzip.compress(RECORDS.encode(), compresslevel=9, mtime=0))  # Recorder.finish's
    done = harvest(src, dst)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["new-code", "old-code"]
    for name in ("new-code", "old-code"):  # the code older than metrics.jsonl.gz: made from its metrics.jsonl
        got = dst / "results" / "runs" / name
        assert sorted(p.name for p in got.iterdir()) == ["config.json", "metrics.jsonl.gz", "summary.json"]
        # the bytes a run of today's code writes (level 9, no timestamp): one record, one archive
        assert (got / "metrics.jsonl.gz").read_bytes() == gzip.compress(RECORDS.encode(), compresslevel=9, mtime=0)
        assert [r["round"] for r in read_jsonl(got / "metrics.jsonl")] == [0, 1]
    assert not (dst / "results" / "runs" / "in-progress").exists()
    assert not (runs / "old-code" / "metrics.jsonl.gz").exists()  # the sweep's folder is only read
    again = harvest(src, dst)
    assert again.returncode == 0 and again.stdout == ""  # what this checkout holds complete is not copied again


def test_a_run_the_sweeps_commit_holds_and_this_checkout_removed_stays_removed(tmp_path):
    """A sweep's worktree made from an older main holds that commit's run folders; one removed from main since
    (21 superseded runs were, 4e189cc) is not a new run of the sweep and is not brought back; the sweep's own new
    run is copied."""
    src, dst = tmp_path / "sweep", checkout(tmp_path / "checkout")
    runs = src / "results" / "runs"
    for name in ("removed-here", "new-run"):
        (runs / name).mkdir(parents=True)
        for f in ("config.json", "summary.json"):
            (runs / name / f).write_text("{}")
        (runs / name / "metrics.jsonl.gz").write_bytes(gzip.compress(RECORDS.encode(), compresslevel=9, mtime=0))
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(src)], check=True)
    subprocess.run([*git, "add", "results/runs/removed-here"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "an older main"], check=True)
    done = harvest(src, dst)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["new-run"]
    assert f"note: removed-here not copied: committed in {src}'s commit and absent here" in done.stderr
    assert sorted(p.name for p in (dst / "results" / "runs").iterdir()) == ["new-run"]
