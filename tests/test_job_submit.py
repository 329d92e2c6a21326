"""Ray token authentication, for real: the session's local instance runs with it, and `ray job submit`
to a token-protected Ray head on 127.0.0.1 succeeds with the token (the run writes its results) and is
refused without it or with a wrong one; a driver without the token gets a one-line error."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark.results import read_jsonl
from ray_head import ray_head

PROJECT = Path(__file__).resolve().parent.parent
REFUSED_WITHIN_S = 120  # a refused submission must fail, never hang


@pytest.fixture(scope="module")
def head(slow_setup, tmp_path_factory):
    """One Ray head for the module (tests/ray_head.py)."""
    with ray_head(tmp_path_factory.mktemp("head")) as h:
        yield h


def entry(data_root: Path, out: Path) -> list[str]:
    """The submitted run: FPL on Office-Caltech's two smallest domains (webcam, dslr), 2 short rounds."""
    return ["python", "-m", "ray_jobs.run", "--method", "fpl", "--dataset", "office_caltech", "--domains",
            "webcam,dslr", "--rounds", "2", "--local-epochs", "1", "--client-fraction", "0.1", "--eval-max", "50",
            "--data-root", str(data_root), "--out", str(out), "--quiet"]


def submit(head, env: dict, job_id: str, data_root: Path, out: Path, timeout: float) -> subprocess.CompletedProcess:
    """The README's submission, which waits for the head's job agent: `tools/ray_submit.sh --address
    http://HEAD:8265 --working-dir . -- python -m ray_jobs.run ...` (`ray job submit`'s arguments)."""
    job_env = {"env_vars": {k: os.environ[k] for k in os.environ if k.startswith("WANDB_")}}
    return subprocess.run(["bash", str(PROJECT / "tools" / "ray_submit.sh"), "--address", head.address,
                           "--working-dir", str(PROJECT),
                           "--submission-id", job_id, "--runtime-env-json", json.dumps(job_env), "--",
                           *entry(data_root, out)],
                          env=env, capture_output=True, text=True, timeout=timeout, cwd=PROJECT)


def test_session_instance_runs_with_token_auth(ray_cluster):
    """Ray's default for a local ray.init(): token auth on, here with the session's token file."""
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    def auth_env():
        return os.environ.get("RAY_AUTH_MODE"), os.environ.get("RAY_AUTH_TOKEN_PATH")

    assert ray.get(auth_env.remote()) == ("token", os.environ["RAY_AUTH_TOKEN_PATH"])


def test_submission_without_token_is_refused(head, data_root, tmp_path):
    res = submit(head, head.no_auth, f"fedproto-bench-no-token-{os.getpid()}", data_root, tmp_path / "run",
                 REFUSED_WITHIN_S)
    assert res.returncode != 0
    assert "Unauthorized: Missing authentication token" in res.stdout + res.stderr, res.stderr[-3000:]
    assert not (tmp_path / "run").exists()


def test_submission_with_wrong_token_is_refused(head, data_root, tmp_path):
    env = {**head.no_auth, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    res = submit(head, env, f"fedproto-bench-wrong-token-{os.getpid()}", data_root, tmp_path / "run",
                 REFUSED_WITHIN_S)
    assert res.returncode != 0
    assert "Forbidden: Invalid authentication token" in res.stdout + res.stderr, res.stderr[-3000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_ray_job_submit_with_token(head, data_root, tmp_path):
    """The submitting machine gets the token through RAY_AUTH_TOKEN; the job's driver (on the head)
    connects to the cluster with the head's token and writes the run folder."""
    out = tmp_path / "run"
    job_id = f"fedproto-bench-test-{os.getpid()}"
    env = {**head.no_auth, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": head.token}
    res = submit(head, env, job_id, data_root, out, 900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(head.address, headers={"Authorization": f"Bearer {head.token}"})
    assert client.get_job_status(job_id) == JobStatus.SUCCEEDED
    assert [j.submission_id for j in client.list_jobs()] == [job_id]  # the refused submissions left no job
    summary = json.loads((out / "summary.json").read_text())
    rounds = read_jsonl(out / "metrics.jsonl")
    assert summary["complete"] and summary["rounds"] == 2 and summary["method"] == "fpl"
    assert summary["final"] == rounds[-1]["accuracy"]
    assert [c["domain"] for c in summary["clients"]] == ["webcam"] + ["dslr"] * 4
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.parent.name == "files" for p in files)  # the W&B offline run is there too
    assert [p for p in files if head.token.encode() in p.read_bytes()] == []


@pytest.mark.slow
def test_driver_without_token_gets_a_one_line_error(head, data_root, tmp_path):
    """`RAY_ADDRESS=HEAD:6379 python -m ray_jobs.run` from a shell that lacks the token."""
    env = {**head.no_auth, "RAY_ADDRESS": head.gcs, "PYTHONPATH": str(PROJECT)}
    res = subprocess.run([sys.executable, *entry(data_root, tmp_path / "run")[1:]], env=env, capture_output=True,
                         text=True, timeout=REFUSED_WITHIN_S, cwd=PROJECT)
    assert res.returncode == 2, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]  # (Ray may log after it)
    assert len(errors) == 1, res.stderr[-3000:]
    last = errors[0]
    assert last.startswith(f"error: the Ray cluster at {head.gcs} needs its token")
    assert "RAY_AUTH_MODE=token" in last and "RAY_AUTH_TOKEN_PATH" in last
    assert not (tmp_path / "run").exists()  # stopped before the run folder was started
