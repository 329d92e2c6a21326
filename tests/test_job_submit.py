"""Ray token authentication, for real: the session's local instance runs with it, and `ray job submit`
to a token-protected Ray head on 127.0.0.1 succeeds with the token (the run writes its results) and is
refused without it or with a wrong one; a driver without the token gets a one-line error."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmark.results import read_jsonl
from conftest import write_token

PROJECT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
REFUSED_WITHIN_S = 120  # a refused submission must fail, never hang


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """One Ray head for the module, started as the README says: RAY_AUTH_MODE=token and a new token in a
    file (mode 600) named by RAY_AUTH_TOKEN_PATH. In its own process group (`ray start --block`); every port
    explicit, so it cannot collide with the session's local Ray instance; killed with its group afterwards.
    HOME is a fresh folder for the head and every client, so no ~/.ray/auth_token is read or written."""
    tmp = tmp_path_factory.mktemp("head")
    temp_dir = Path(tempfile.mkdtemp(prefix="rh", dir="/tmp"))  # AF_UNIX socket paths must stay short
    token_path = tmp / "token"
    token = write_token(token_path)
    names = ["port", "dashboard-port", "node-manager-port", "object-manager-port", "ray-client-server-port",
             "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port",
             "metrics-export-port"]
    (tmp / "home").mkdir()
    no_auth = {k: v for k, v in os.environ.items()
               if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    no_auth.update(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", HOME=str(tmp / "home"), RAY_USAGE_STATS_ENABLED="0")
    head_env = {**no_auth, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}
    # a port found free can be taken by another process (the other test worker's Ray or W&B) before the head binds
    # it: the head then exits, and starts once more on fresh ports
    proc = log = None
    try:
        for attempt in (1, 2):
            ports = dict(zip(names, free_ports(len(names))))
            cmd = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=3",
                   "--num-gpus=0", "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--temp-dir={temp_dir}",
                   "--min-worker-port=0", "--max-worker-port=0", *[f"--{k}={v}" for k, v in ports.items()]]
            log_path = tmp / f"head{attempt}.log"
            log = open(log_path, "w")
            proc = subprocess.Popen(cmd, env=head_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            address = f"http://127.0.0.1:{ports['dashboard-port']}"
            deadline, up = time.time() + 120, False
            while time.time() < deadline and proc.poll() is None and not up:
                up = subprocess.run([str(BIN / "ray"), "job", "list", "--address", address], env=head_env,
                                    capture_output=True, timeout=60).returncode == 0
                time.sleep(0 if up else 2)
            if up and proc.poll() is None:
                break
            exited = proc.poll() is not None
            stop(proc)  # and what it started before it exited
            log.close()
            if attempt == 2 or not exited:
                pytest.fail("the Ray head did not come up:\n" + log_path.read_text()[-3000:])
        yield SimpleNamespace(address=address, gcs=f"127.0.0.1:{ports['port']}", token=token, no_auth=no_auth)
    finally:
        if proc is not None:
            stop(proc)
            log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def stop(proc: subprocess.Popen) -> None:
    """A process started in its own session, and everything it started: SIGTERM, then SIGKILL after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def entry(data_root: Path, out: Path) -> list[str]:
    return ["python", "-m", "ray_jobs.run", "--method", "fpl", "--dataset", "office_caltech", "--rounds", "2",
            "--local-epochs", "1", "--client-fraction", "0.1", "--eval-max", "50", "--data-root", str(data_root),
            "--out", str(out), "--quiet"]


def submit(head, env: dict, job_id: str, data_root: Path, out: Path, timeout: float) -> subprocess.CompletedProcess:
    """The README's submission:
    `ray job submit --address http://HEAD:8265 --working-dir . -- python -m ray_jobs.run ...`."""
    job_env = {"env_vars": {k: os.environ[k] for k in os.environ if k.startswith("WANDB_")}}
    return subprocess.run([str(BIN / "ray"), "job", "submit", "--address", head.address, "--working-dir", str(PROJECT),
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


def test_submission_without_token_is_refused(ray_head, data_root, tmp_path):
    res = submit(ray_head, ray_head.no_auth, f"fedproto-bench-no-token-{os.getpid()}", data_root, tmp_path / "run",
                 REFUSED_WITHIN_S)
    assert res.returncode != 0
    assert "Unauthorized: Missing authentication token" in res.stdout + res.stderr, res.stderr[-3000:]
    assert not (tmp_path / "run").exists()


def test_submission_with_wrong_token_is_refused(ray_head, data_root, tmp_path):
    env = {**ray_head.no_auth, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    res = submit(ray_head, env, f"fedproto-bench-wrong-token-{os.getpid()}", data_root, tmp_path / "run",
                 REFUSED_WITHIN_S)
    assert res.returncode != 0
    assert "Forbidden: Invalid authentication token" in res.stdout + res.stderr, res.stderr[-3000:]
    assert not (tmp_path / "run").exists()


def test_ray_job_submit_with_token(ray_head, data_root, tmp_path):
    """The submitting machine gets the token through RAY_AUTH_TOKEN; the job's driver (on the head)
    connects to the cluster with the head's token and writes the run folder."""
    out = tmp_path / "run"
    job_id = f"fedproto-bench-test-{os.getpid()}"
    env = {**ray_head.no_auth, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": ray_head.token}
    res = submit(ray_head, env, job_id, data_root, out, 900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(ray_head.address, headers={"Authorization": f"Bearer {ray_head.token}"})
    assert client.get_job_status(job_id) == JobStatus.SUCCEEDED
    assert [j.submission_id for j in client.list_jobs()] == [job_id]  # the refused submissions left no job
    summary = json.loads((out / "summary.json").read_text())
    rounds = read_jsonl(out / "metrics.jsonl")
    assert summary["complete"] and summary["rounds"] == 2 and summary["method"] == "fpl"
    assert summary["final"] == rounds[-1]["accuracy"]
    assert [c["domain"] for c in summary["clients"]] == ["caltech"] * 3 + ["amazon"] * 2 + ["webcam"] + ["dslr"] * 4
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.parent.name == "files" for p in files)  # the W&B offline run is there too
    assert [p for p in files if ray_head.token.encode() in p.read_bytes()] == []


def test_driver_without_token_gets_a_one_line_error(ray_head, data_root, tmp_path):
    """`RAY_ADDRESS=HEAD:6379 python -m ray_jobs.run` from a shell that lacks the token."""
    env = {**ray_head.no_auth, "RAY_ADDRESS": ray_head.gcs, "PYTHONPATH": str(PROJECT)}
    res = subprocess.run([sys.executable, *entry(data_root, tmp_path / "run")[1:]], env=env, capture_output=True,
                         text=True, timeout=REFUSED_WITHIN_S, cwd=PROJECT)
    assert res.returncode == 2, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]  # (Ray may log after it)
    assert len(errors) == 1, res.stderr[-3000:]
    last = errors[0]
    assert last.startswith(f"error: the Ray cluster at {ray_head.gcs} needs its token")
    assert "RAY_AUTH_MODE=token" in last and "RAY_AUTH_TOKEN_PATH" in last
    assert not (tmp_path / "run").exists()  # stopped before the run folder was started
