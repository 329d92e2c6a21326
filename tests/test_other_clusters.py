"""Our runs beside another Ray cluster on the machine: a head started with `ray start --head` (token
authentication on, tests/ray_head.py) that is the machine's current cluster, where a bare `ray.init()` would
connect. Without --address, a run and a sweep start a Ray cluster of their own and finish; with --address auto a
run joins the head on purpose, says which cluster it joined, and runs there; `tools/ray_submit.sh` submits to the
head as soon as its job agent takes jobs. The head is stopped by killing its process group (never `ray stop`)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ray_head import ray_head

PROJECT = Path(__file__).resolve().parent.parent
RUN = ["--method", "fedavg", "--dataset", "office_caltech", "--domains", "webcam,dslr", "--rounds", "2",
       "--local-epochs", "1", "--client-fraction", "0.1", "--eval-max", "30", "--quiet"]
# (Office-Caltech's two smallest domains, as RUN: what is tested is where the runs go, not what they train on)
SWEEP = ["--table", "2", "--profile", "smoke", "--domains", "webcam,dslr", "--methods", "fedavg", "--seeds", "0",
         "--datasets", "office_caltech"]


@pytest.fixture(scope="module")
def head(slow_setup, tmp_path_factory):
    with ray_head(tmp_path_factory.mktemp("head")) as h:
        current = (h.tmpdir / "ray" / "ray_current_cluster").read_text().strip()  # the machine's current cluster
        assert current.split(":")[1] == h.gcs.split(":")[1]  # the head's GCS (on the machine's address)
        yield SimpleNamespace(**vars(h), current=current)
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", int(h.gcs.split(":")[1])), timeout=5):
        pass  # the head is gone


def python(module: str, args: list[str], env: dict) -> subprocess.CompletedProcess:
    """`python -m module args` from the project, W&B off, in the head's environment (its token and RAY_TMPDIR)."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=PROJECT, capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(PROJECT), "WANDB_MODE": "disabled"}, timeout=900)


def nodes(out: Path) -> set[str]:
    """The Ray nodes a run's driver and client actors ran on."""
    prov = json.loads((out / "config.json").read_text())["provenance"]
    return {prov["driver"]["ray_node"], *[a["ray_node"] for a in prov["actors"]]}


def complete(out: Path) -> bool:
    return json.loads((out / "summary.json").read_text())["complete"]


@pytest.mark.slow
def test_ray_submit_waits_for_the_job_agent(head):
    """Submitted as soon as the head's Jobs API answers (its job agent may not take jobs yet)."""
    res = subprocess.run(["bash", str(PROJECT / "tools" / "ray_submit.sh"), "--address", head.address,
                          "--submission-id", f"agent-{os.getpid()}", "--", "echo", "the-job-ran"],
                         env=head.env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "the-job-ran" in res.stdout and "succeeded" in res.stdout


@pytest.fixture(scope="module")
def joined(head, data_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("joined") / "run"
    res = python("ray_jobs.run", [*RUN, "--address", "auto", "--data-root", str(data_root), "--out", str(out)],
                 head.env)
    assert res.returncode == 0, res.stderr[-3000:]
    return res, out


def test_a_run_with_address_auto_joins_the_head_and_says_so(head, joined):
    res, out = joined
    dashboard = head.address.removeprefix("http://")
    assert (f"note: joined the Ray cluster at {head.current} (--address auto, dashboard http://{dashboard}; 1 node(s), "
            "3 CPUs, 0 GPUs)") in res.stdout.splitlines()
    assert complete(out) and len(nodes(out)) == 1  # the head's one node


@pytest.mark.slow
def test_a_run_and_a_sweep_without_address_finish_on_a_cluster_of_their_own(head, joined, data_root, tmp_path):
    on_head = nodes(joined[1])
    run = python("ray_jobs.run", [*RUN, "--data-root", str(data_root), "--out", str(tmp_path / "run")], head.env)
    assert run.returncode == 0, run.stderr[-3000:]
    sweep = python("ray_jobs.sweep", [*SWEEP, "--data-root", str(data_root), "--results-dir", str(tmp_path / "sweep")],
                   head.env)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert "joined" not in run.stdout + sweep.stdout
    (swept,) = (tmp_path / "sweep" / "runs").iterdir()
    for out in (tmp_path / "run", swept):
        assert complete(out) and nodes(out).isdisjoint(on_head)  # not on the head: on a cluster of its own


@pytest.mark.slow
def test_address_auto_after_the_head_was_sigkilled_stops_in_one_line(data_root, tmp_path, monkeypatch):
    """A head `ray start` started, then SIGKILLed (all its processes: its group), leaves its ray_current_cluster
    behind (under its own RAY_TMPDIR here; /tmp/ray's on a machine). `--address auto` reads it as Ray does and finds
    that nothing answers there: one error line naming the file and the address, exit code 2, no run folder; without
    any such file, one line saying no cluster was started. (Every other Ray on the machine is left alone.)"""
    from ray_jobs.run import RunError, check_ray_address

    with ray_head(tmp_path, num_cpus=1, dashboard=False) as h:
        pointer = h.tmpdir / "ray" / "ray_current_cluster"
        recorded = pointer.read_text().strip()  # the head's GCS, on the machine's address
        assert recorded.split(":")[1] == h.gcs.split(":")[1]
        with monkeypatch.context() as m:  # (this process's own Ray, if any, never sees it)
            m.setenv("RAY_TMPDIR", str(h.tmpdir))
            assert check_ray_address("auto", "--address auto") == recorded  # alive: auto is that head
        os.killpg(h.pgid, signal.SIGKILL)
        for _ in range(300):  # its GCS server's socket closes once its process is gone
            try:
                socket.create_connection(("127.0.0.1", int(h.gcs.split(":")[1])), timeout=5).close()
            except OSError:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the head's GCS at {h.gcs} still answers 30 s after its SIGKILL")
        assert pointer.read_text().strip() == recorded  # left behind
        out = tmp_path / "run"
        # (before 2026-12-01 it waited on Ray's reconnection to the dead head: still there after 600 s)
        res = subprocess.run([sys.executable, "-m", "ray_jobs.run", *RUN, "--address", "auto", "--data-root",
                              str(data_root), "--out", str(out)], cwd=PROJECT, capture_output=True, text=True,
                             env={**h.env, "PYTHONPATH": str(PROJECT), "WANDB_MODE": "disabled"}, timeout=180)
        assert res.returncode == 2, res.stderr[-3000:]
        assert res.stderr == (f"error: --address auto (the head {pointer} names, {recorded}) is unreachable "
                              "(Connection refused). Start the head with `ray start --head`, fix the address, or give "
                              "none (no --address, RAY_ADDRESS unset) to start a Ray cluster of this run's own.\n")
        assert not out.exists()

    with monkeypatch.context() as m, pytest.raises(RunError) as e:
        m.setenv("RAY_TMPDIR", str(tmp_path / "home"))  # no `ray start` there
        check_ray_address("auto", "RAY_ADDRESS=auto")
    assert str(e.value) == ("RAY_ADDRESS=auto: no Ray cluster was started with `ray start` on this machine "
                            f"({tmp_path / 'home' / 'ray' / 'ray_current_cluster'} is absent); start one with "
                            "`ray start --head`, give its host:port, or give none to start a Ray cluster of this run's "
                            "own.")
