"""A Ray head started as docs/running.md says (`ray start --head`, RAY_AUTH_MODE=token, a new token in a file of
mode 600 named by RAY_AUTH_TOKEN_PATH), for the tests that need a cluster that is not theirs. In its own process
group (`ray start --block`); every port explicit, so it cannot collide with the session's local Ray instance; killed
with its group afterwards (never `ray stop`, which would end every Ray process on the machine). Its files are under
a temp folder of its own, RAY_TMPDIR (`env` has it): that folder's ray/ray_current_cluster names the head, as
/tmp/ray/ray_current_cluster names the last `ray start`'s on a machine, so a process with that RAY_TMPDIR sees it as
the machine's current cluster (where a bare `ray.init()` or `--address auto` connects). HOME is a fresh folder for
the head and every client, so no ~/.ray/auth_token is read or written."""
from __future__ import annotations

import contextlib
import os
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

from conftest import write_token

BIN = Path(sys.executable).parent
PORTS = ["port", "dashboard-port", "node-manager-port", "object-manager-port", "ray-client-server-port",
         "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port"]


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@contextlib.contextmanager
def ray_head(tmp: Path, num_cpus: int = 3, dashboard: bool = True):
    """The head, up (`ray start` has named it the current cluster and, with its `dashboard`, its Jobs API answers):
    address (the dashboard's URL), gcs (host:port), token, tmpdir (RAY_TMPDIR), no_auth (an environment without
    Ray's address or token), env (no_auth with the token, as the head's own) and pgid (its process group: the
    head's processes, every one)."""
    temp = Path(tempfile.mkdtemp(prefix="rh", dir="/tmp"))  # AF_UNIX socket paths must stay short
    token_path = tmp / "token"
    token = write_token(token_path)
    (tmp / "home").mkdir()
    no_auth = {k: v for k, v in os.environ.items()
               if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    no_auth.update(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", HOME=str(tmp / "home"), RAY_USAGE_STATS_ENABLED="0",
                   RAY_TMPDIR=str(temp))
    env = {**no_auth, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}
    # a port found free can be taken by another process (the other test worker's Ray or W&B) before the head binds
    # it: the head then exits, and starts once more on fresh ports
    proc = log = None
    try:
        for attempt in (1, 2):
            ports = dict(zip(PORTS, free_ports(len(PORTS))))
            cmd = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
                   f"--num-cpus={num_cpus}", "--num-gpus=0", f"--include-dashboard={str(dashboard).lower()}",
                   "--dashboard-host=127.0.0.1",
                   "--min-worker-port=0", "--max-worker-port=0", *[f"--{k}={v}" for k, v in ports.items()]]
            log_path = tmp / f"head{attempt}.log"
            log = open(log_path, "w")
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            address = f"http://127.0.0.1:{ports['dashboard-port']}"
            deadline, up = time.time() + 120, False
            while time.time() < deadline and proc.poll() is None and not up:  # (`ray start` names it last)
                up = (temp / "ray" / "ray_current_cluster").exists() and (not dashboard or subprocess.run(
                    [str(BIN / "ray"), "job", "list", "--address", address], env=env, capture_output=True,
                    timeout=60).returncode == 0)
                time.sleep(0 if up else 2)
            if up and proc.poll() is None:
                break
            exited = proc.poll() is not None
            stop(proc)  # and what it started before it exited
            log.close()
            if attempt == 2 or not exited:
                pytest.fail("the Ray head did not come up:\n" + log_path.read_text()[-3000:])
        yield SimpleNamespace(address=address, gcs=f"127.0.0.1:{ports['port']}", token=token, tmpdir=temp,
                              no_auth=no_auth, env=env, pgid=proc.pid)
    finally:
        if proc is not None:
            stop(proc)
            log.close()
        shutil.rmtree(temp, ignore_errors=True)


def stop(proc: subprocess.Popen) -> None:
    """A process started in its own session, and everything it started: SIGTERM, then SIGKILL after 5 s or to
    whatever of its group outlives it. (`ray start --block` stops its raylet on SIGTERM but does not exit: 30 s
    after it, its GCS server and monitor still ran, measured 2026-11-29; the wait was 30 s of each module's
    teardown, a minute of the suite.)"""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
