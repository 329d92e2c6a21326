"""`ray job submit` against a real Ray head on 127.0.0.1: submit, wait for SUCCEEDED, check the files, stop the head."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmark.results import read_jsonl

PROJECT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture
def ray_head(tmp_path):
    import tempfile

    temp_dir = Path(tempfile.mkdtemp(prefix="rh", dir="/tmp"))  # AF_UNIX socket paths must stay short
    """A Ray head in its own process group (`ray start --block`); every port explicit, so it
    cannot collide with the session's local Ray instance; killed with its group afterwards."""
    names = ["port", "dashboard-port", "node-manager-port", "object-manager-port", "ray-client-server-port",
             "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port"]
    ports = dict(zip(names, free_ports(len(names))))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=3", "--num-gpus=0",
           "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--temp-dir={temp_dir}",
           "--min-worker-port=0", "--max-worker-port=0", *[f"--{k}={v}" for k, v in ports.items()]]
    log = open(tmp_path / "head.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{ports['dashboard-port']}"
    deadline = time.time() + 120
    while time.time() < deadline:
        ok = subprocess.run([str(BIN / "ray"), "job", "list", "--address", address], env=env, capture_output=True)
        if ok.returncode == 0:
            break
        assert proc.poll() is None, (tmp_path / "head.log").read_text()
        time.sleep(2)
    else:
        pytest.fail("the Ray head did not come up:\n" + (tmp_path / "head.log").read_text()[-3000:])
    yield address, env
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()
    shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_job_submit(ray_head, data_root, tmp_path):
    address, env = ray_head
    out = tmp_path / "run"
    entry = ["python", "-m", "ray_jobs.run", "--method", "fpl", "--dataset", "office_caltech", "--rounds", "2",
             "--local-epochs", "1", "--client-fraction", "0.1", "--eval-max", "50", "--data-root", str(data_root),
             "--out", str(out), "--quiet"]
    job_env = {"env_vars": {k: os.environ[k] for k in os.environ if k.startswith("WANDB_")}}
    job_id = f"fedproto-bench-test-{os.getpid()}"
    res = subprocess.run([str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", str(PROJECT),
                          "--submission-id", job_id,
                          "--runtime-env-json", json.dumps(job_env), "--", *entry],
                         env=env, capture_output=True, text=True, timeout=900, cwd=PROJECT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    from ray.job_submission import JobStatus, JobSubmissionClient

    assert JobSubmissionClient(address).get_job_status(job_id) == JobStatus.SUCCEEDED
    summary = json.loads((out / "summary.json").read_text())
    rounds = read_jsonl(out / "metrics.jsonl")
    assert summary["complete"] and summary["rounds"] == 2 and summary["method"] == "fpl"
    assert summary["final"] == rounds[-1]["accuracy"]
    assert [c["domain"] for c in summary["clients"]] == ["caltech"] * 3 + ["amazon"] * 2 + ["webcam"] + ["dslr"] * 4
