"""`make table2 EXECUTOR=local PARALLEL=N`: a local sweep's runs side by side in worker processes (no Ray), with the
numbers of one run at a time; a failed worker does not stop the others; Ctrl-C stops them all, resumably."""
from __future__ import annotations

import gc
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmark.results import MODEL_FILE, computed_metrics, read_jsonl
from ray_jobs.config import RunConfig
from ray_jobs.run import RunError, run
from ray_jobs.sweep import execute, local_concurrency, main, ray_concurrency, send_run, start_worker
from ray_jobs.tables import TABLES

ROOT = Path(__file__).resolve().parent.parent
# Table 2's Office-Caltech smoke runs of FedAvg and FPL on its two smallest domains (webcam, dslr: several times
# cheaper than all four), by the names the smoke profile's departures give them
SMOKE = RunConfig.from_preset("fpl-office", **TABLES["2"].overrides("smoke")).departures_name
RUNS = tuple(f"{m}-office_caltech-no_caltech_amazon-default{SMOKE}-seed0" for m in ("fedavg", "fpl"))
TRANSIENT_MIB = 2048  # freed before the runs: their peak memory must not count it
WORKER_LINE = re.compile(r"^sweep worker pid (\d+): (started|ended) (\S+) ", re.M)


def worker_pid(run_dir: Path) -> int:
    """The pid of the worker that made the run, from <run folder>/run.log (its started and ended lines)."""
    lines = WORKER_LINE.findall((run_dir / "run.log").read_text())
    assert [what for _, what, _ in lines] == ["started", "ended"] and lines[0][0] == lines[1][0]
    return int(lines[0][0])


def provenance(run_dir: Path) -> dict:
    return json.loads((run_dir / "config.json").read_text())["provenance"]


def vm_kib(field: str) -> int:
    """This process's VmRSS (resident now) or VmHWM (its peak), in KiB, as Linux reports them."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def driver_pid(run_dir: Path) -> int:
    return provenance(run_dir)["driver"]["pid"]


@pytest.mark.slow
def test_parallel_2_gives_the_numbers_of_one_run_at_a_time(data_root, tmp_path, capsys, monkeypatch):
    """Table 2's two Office-Caltech rows of FedAvg and FPL at the smoke profile on webcam and dslr, one at a time in
    this process (--parallel 1, the default on a machine of fewer than 4 CPU threads), then two at once in worker
    processes: the same accuracies bit for bit (CPU). (That two workers' runs are in flight at once is shown by the
    Ctrl-C test, where both wait before a round: here one smoke run can end before the other's worker has started.)"""
    monkeypatch.setenv("WANDB_MODE", "disabled")  # inherited by the workers
    args = ["--table", "2", "--profile", "smoke", "--methods", "fedavg,fpl", "--datasets", "office_caltech",
            "--domains", "webcam,dslr", "--data-root", str(data_root), "--executor", "local"]
    gc.collect()  # cycles left by earlier tests freed now, not while the runs' peaks are counted
    rss_idle = vm_kib("VmRSS") / 2**10
    transient = np.ones(TRANSIENT_MIB * 2**20 // 8)  # this process's peak resident set raised by 2 GiB, then freed
    rss_during = vm_kib("VmRSS") / 2**10  # (not rss_idle + 2 GiB: other memory freed meanwhile, 68 MiB in one CI)
    del transient
    hwm_before = vm_kib("VmHWM") / 2**10
    assert rss_during >= rss_idle + TRANSIENT_MIB / 2 and hwm_before >= rss_during - 4  # (4 MiB: see peaks[-1])
    rss_before = vm_kib("VmRSS") / 2**10  # this process's size as the runs start
    assert main([*args, "--results-dir", str(tmp_path / "one"), "--parallel", "1"]) == 0
    hwm_after = vm_kib("VmHWM") / 2**10
    cpus = os.cpu_count()
    threads = ("a run trains on at most 2 CPU thread(s) at once (2 client group(s) at the same time on 1 each, its "
               f"driver on 1 between their calls): {max(1, cpus // 2)} fit this machine's {cpus}")
    assert f"0 of 2 runs already complete; running 2, 1 at once (--parallel 1; {threads})" in capsys.readouterr().out
    assert main([*args, "--results-dir", str(tmp_path / "two"), "--parallel", "2"]) == 0
    out = capsys.readouterr().out
    assert (f"0 of 2 runs already complete; running 2, 2 at once (--parallel 2; {threads}; worker processes, output in "
            "<run folder>/run.log)") in out
    for name in RUNS:  # each worker's rounds reach the sweep's progress
        final = json.loads((tmp_path / "two" / "runs" / name / "summary.json").read_text())["final"]
        assert f"] {name}: round 2/2, AVG {final['AVG']:.2f}\n" in out
    for name in RUNS:
        one, two = tmp_path / "one" / "runs" / name, tmp_path / "two" / "runs" / name
        s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (one, two))
        assert (s2["final"], s2["last5"]) == (s1["final"], s1["last5"])
        numbers = lambda d: [{k: r[k] for k in ("accuracy", "train_loss", "client_loss")}  # noqa: E731
                             for r in read_jsonl(d / "metrics.jsonl")]
        assert numbers(two) == numbers(one)  # the losses too: smoke accuracies alone could agree by chance
        assert driver_pid(one) == os.getpid() and not (one / "run.log").exists()  # in this process
        log = (two / "run.log").read_text()  # the worker's output: its plain per-round lines
        assert f"[{name}] round 2/2 " in log and log.rstrip().endswith("(complete)")
    pid_a, pid_b = (worker_pid(tmp_path / "two" / "runs" / n) for n in RUNS)
    assert len({pid_a, pid_b, os.getpid()}) == 3
    assert [driver_pid(tmp_path / "two" / "runs" / n) for n in RUNS] == [pid_a, pid_b]  # the run was in the worker
    # this process's peak resident set, counted from each run's start (not over the process's life): above its size
    # before the runs, below the peak of the 2 GiB freed before them; the last run's within the process's peak after
    peaks = []
    for n in RUNS:
        peak = json.loads((tmp_path / "one" / "runs" / n / "summary.json").read_text())["peak_memory"]
        assert peak["driver"]["pid"] == os.getpid() and [a["pid"] for a in peak["actors"]] == [os.getpid()] * 2
        peaks.append(peak["driver"]["peak_rss_mib"])
    # (the lower bound allows 64 MiB of this process's memory freed after rss_before: seen 4.8 MiB in CI)
    assert rss_before - 64 <= min(peaks) and max(peaks) <= hwm_before - TRANSIENT_MIB / 2
    # (the kernel counts a resident set approximately, in per-CPU or per-thread batches of pages, so two reads of one
    # peak can differ: seen 0.2 MiB in CI; 4 MiB allowed)
    assert peaks[-1] <= hwm_after + 4
    for n in RUNS:  # each run says how many CPU threads it trained on: its driver_cpus' (1), in or out of a worker
        assert [provenance(tmp_path / x / "runs" / n)["driver"]["torch_threads"] for x in ("one", "two")] == [1, 1]
    assert main([*args, "--results-dir", str(tmp_path / "two"), "--parallel", "0"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: --parallel takes a number of runs at once, 1 or more (got 0)."
    # GPU shares (Ray's: `make table2 GPUS_PER_ACTOR=0.1 DRIVER_GPUS=0.1`) are no part of a run's protocol
    assert main([*args, "--results-dir", str(tmp_path / "two"), "--gpus-per-actor", "0.1", "--driver-gpus", "0.1"]) == 0
    assert "2 of 2 runs already complete; running 0\n" in capsys.readouterr().out
    assert main([*args, "--results-dir", str(tmp_path / "two"), "--gpus-per-actor", "nan"]) == 2
    assert capsys.readouterr().err.strip() == "error: gpus-per-actor must be a finite number, 0 or more (got nan)."


# Office-Caltech's two smallest domains (5 clients): the workers' tests need runs, not large ones
SMALL = dict(dataset="office_caltech", domains=["webcam", "dslr"], local_epochs=1, client_fraction=0.05, eval_max=50,
             executor="local")
BASE = dict(method="fpl", dataset="office_caltech", executor="local", device="cpu")  # (on a GPU machine too)


# 5 clients (webcam 1, dslr 4), 2 client groups of 1 thread each, a driver of 2: its kernels unlike its groups'
TWO_DRIVER_THREADS = dict(dataset="office_caltech", domains=["webcam", "dslr"], rounds=2, local_epochs=1,
                          client_fraction=0.1, eval_max=30, num_actors=2, cpus_per_actor=1, driver_cpus=2)


@pytest.mark.slow
def test_workers_and_ray_give_the_numbers_of_a_run_in_the_calling_thread_with_a_driver_of_2_threads(
        ray_cluster, data_root, tmp_path, monkeypatch):
    """MOON (each client's previous model kept across rounds) and FPL (FINCH on the driver) with --driver-cpus 2
    beside --cpus-per-actor 1 (the driver aggregates and evaluates on 2 threads, each group trains on 1): made in
    this test's own thread (the local executor's groups in threads of it), two at once in sweep worker processes
    (each worker's share of the CPU threads, the cores over 2, below its driver's 2 on this project's 2-core
    machine), and MOON through Ray (a driver actor of 2 CPUs, two client actors of 1): the same metrics and final
    models bit for bit, every driver on 2 threads and every group on 1."""
    monkeypatch.setenv("WANDB_MODE", "disabled")  # inherited by the workers

    def config(method: str, where: str, executor: str) -> RunConfig:
        return RunConfig(method=method, **TWO_DRIVER_THREADS, executor=executor, data_root=str(data_root),
                         out=str(tmp_path / where / method), name=method)

    for method in ("moon", "fpl"):
        run(config(method, "here", "local"), quiet=True)
    assert execute([config(m, "workers", "local") for m in ("moon", "fpl")], 2) == ["moon", "fpl"]
    run(config("moon", "ray", "ray"), quiet=True)
    made = {"here": ("moon", "fpl"), "workers": ("moon", "fpl"), "ray": ("moon",)}
    drivers = {}
    for where, methods in made.items():
        for method in methods:
            one, other = tmp_path / "here" / method, tmp_path / where / method
            assert computed_metrics(other) == computed_metrics(one), (where, method)
            a, b = (torch.load(d / MODEL_FILE, weights_only=True) for d in (one, other))
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), (where, method)
            seen = provenance(other)
            assert seen["driver"]["torch_threads"] == 2 and [g["torch_threads"] for g in seen["actors"]] == [1, 1]
            drivers[where, method] = seen["driver"]["pid"]
    assert drivers["here", "moon"] == drivers["here", "fpl"] == os.getpid()  # in this process
    assert len({drivers["workers", "moon"], drivers["workers", "fpl"], drivers["ray", "moon"], os.getpid()}) == 4
    assert computed_metrics(tmp_path / "here" / "moon") != computed_metrics(tmp_path / "here" / "fpl")


@pytest.mark.slow
def test_a_failed_worker_does_not_stop_the_others(data_root, tmp_path, capsys, monkeypatch):
    """FPL with tau 0.01 stops in round 1 (non-finite loss) in its worker; FedAvg, beside it, completes; the
    failure is reported as with one run at a time."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    runs = [RunConfig(method="fpl", hparams={"tau": 0.01}, out=str(tmp_path / "fail"), name="fail", rounds=2,
                      data_root=str(data_root), **SMALL),
            RunConfig(method="fedavg", out=str(tmp_path / "ok"), name="ok", rounds=2, data_root=str(data_root),
                      **SMALL)]
    with pytest.raises(RunError, match=r"^1 of 2 runs failed, no report written: fail \(non-finite loss in round 1"):
        execute(runs, 2)
    assert (tmp_path / "ok" / "summary.json").exists() and not (tmp_path / "fail" / "summary.json").exists()
    assert (tmp_path / "fail" / "error.txt").read_text().startswith("non-finite loss in round 1")
    out = capsys.readouterr().out
    assert "] fail FAILED: non-finite loss in round 1" in out and "] ok: AVG " in out
    assert "sweep: 1 runs done, 1 failed, 0 already complete" in out
    assert "(non-finite loss in round 1" in (tmp_path / "fail" / "run.log").read_text().splitlines()[-1]


def test_a_worker_that_died_while_idle_is_passed_over():
    """A worker killed between two runs (idle, its end of the pipe closed): the next run goes to a new worker
    rather than stopping the sweep with BrokenPipeError (review of 2026-12-02). None, a worker's word to end, stands
    for the run: the new worker takes it and exits cleanly."""
    ctx = multiprocessing.get_context("spawn")
    dead_conn, dead = start_worker(ctx, 1)
    os.kill(dead.pid, signal.SIGKILL)
    dead.join()
    idle = [(dead_conn, dead)]
    conn, proc = send_run(None, idle, ctx, 1)
    proc.join(60)
    assert (idle, dead.exitcode, proc.exitcode) == ([], -signal.SIGKILL, 0) and proc.pid != dead.pid
    assert dead_conn.closed
    conn.close()


ROUNDS = 3


@pytest.mark.slow
def test_ctrl_c_stops_every_worker_and_the_same_sweep_resumes_their_runs(data_root, tmp_path):
    """SIGINT to a sweep process running two runs in workers (as Ctrl-C, but to the sweep alone: it stops its
    workers itself): one line saying how to resume, every worker gone, each run folder with its checkpoints and
    error.txt; the same sweep again resumes both after their last checkpoint and completes them. Both runs wait
    before round 1 until a file exists (test-only `hold_before_round`), so the signal finds both running whatever
    the machine's speed (with runs of 3, 6 and 20 rounds a CI machine finished one before the other began); the
    file is made before the sweep runs again."""
    go = tmp_path / "go"
    hold = {"hold_before_round": [1, str(go)]}
    script = textwrap.dedent(f"""
        import sys
        from ray_jobs.config import RunConfig
        from ray_jobs.run import RunError, run
        from ray_jobs.sweep import execute
        runs = [RunConfig(method=m, out={str(tmp_path)!r} + "/" + m, name=m, rounds={ROUNDS}, """
        # the script's line goes on: split here only to keep the source within 120 columns
        f"""data_root={str(data_root)!r},
                          test_faults={hold!r}, **{SMALL!r}) for m in ("fedavg", "fedprox")]
        try:
            execute(runs, 2)
        except RunError as e:
            print(f"error: {{e}}", file=sys.stderr)
            sys.exit(2)
        """)
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    # SIGINT's default action restored in the child: a suite started in the background (nohup, `&`) ignores SIGINT,
    # its children inherit that and the sweep would never see the signal
    sweep = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    folders = [tmp_path / "fedavg", tmp_path / "fedprox"]
    deadline = time.monotonic() + 300
    while not all(list((d / "checkpoints").glob("round_*.pt")) for d in folders):
        assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()
        time.sleep(0.2)
    in_flight = {d: WORKER_LINE.findall((d / "run.log").read_text()) for d in folders}
    for lines in in_flight.values():  # both runs in flight at once: each started, neither ended
        assert [what for _, what, _ in lines] == ["started"], lines
    pids = {d: int(lines[0][0]) for d, lines in in_flight.items()}
    assert len(set(pids.values())) == 2  # in two workers
    sweep.send_signal(signal.SIGINT)
    out, err = sweep.communicate(timeout=120)
    assert sweep.returncode == 2, err
    assert err.strip().splitlines()[-1] == (
        "error: interrupted (Ctrl-C): stopped 2 running run(s) (fedavg, fedprox); their folders keep their "
        "checkpoints. To continue, run the same sweep command again (it resumes its interrupted runs).")
    kept = {}
    for d in folders:
        with pytest.raises(ProcessLookupError):  # the worker is gone
            os.kill(pids[d], 0)
        assert not (d / "summary.json").exists()
        assert (d / "error.txt").read_text().startswith("interrupted (Ctrl-C). The run folder keeps its rounds up to ")
        kept[d] = max(int(p.stem.split("_")[1]) for p in (d / "checkpoints").glob("round_*.pt"))
        assert kept[d] == 0  # held before round 1
    go.touch()
    resumed = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    for d in folders:
        assert f"note: resuming {d.name} after round {kept[d]} of {ROUNDS}" in (d / "run.log").read_text()
        assert [r["round"] for r in read_jsonl(d / "metrics.jsonl")] == list(range(ROUNDS))
        assert (d / "summary.json").exists()


@pytest.mark.slow
def test_workers_of_a_killed_sweep_stop_their_runs_and_keep_their_checkpoints(data_root, tmp_path):
    """SIGKILL to a sweep running two runs in workers (it cannot stop them: `kill -9`, a lost session; SIGTERM's
    default action is the same): each worker sees its sweep gone within seconds and stops its run as Ctrl-C does,
    error.txt and checkpoints kept, rather than train on unseen. Found on 2026-11-26: the workers of a killed
    sweep trained on. Both runs wait before round 1 (test-only `hold_before_round`) until the kill."""
    go = tmp_path / "go"
    script = textwrap.dedent(f"""
        from ray_jobs.config import RunConfig
        from ray_jobs.sweep import execute
        execute([RunConfig(method=m, out={str(tmp_path)!r} + "/" + m, name=m, rounds=2, data_root={str(data_root)!r},
                           test_faults={{"hold_before_round": [1, {str(go)!r}]}}, **{SMALL!r})
                 for m in ("fedavg", "fedprox")], 2)
        """)
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    sweep = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    folders = [tmp_path / "fedavg", tmp_path / "fedprox"]
    deadline = time.monotonic() + 300
    while not all(list((d / "checkpoints").glob("round_*.pt")) for d in folders):
        assert sweep.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    pids = [int(WORKER_LINE.search((d / "run.log").read_text()).group(1)) for d in folders]
    sweep.kill()
    sweep.wait()
    deadline = time.monotonic() + 60
    for d, pid in zip(folders, pids):
        while (d / "error.txt").exists() is False or WORKER_LINE.findall((d / "run.log").read_text())[-1][1] != "ended":
            assert time.monotonic() < deadline, (d / "run.log").read_text()
            time.sleep(0.2)
        while True:  # its exit follows its last line
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert (d / "error.txt").read_text().startswith("interrupted (Ctrl-C). The run folder keeps its rounds up to ")
        assert not (d / "summary.json").exists()
        assert [int(p.stem.split("_")[1]) for p in (d / "checkpoints").glob("round_*.pt")] == [0]


def test_ray_packs_as_many_whole_runs_as_its_cpus_and_gpu_shares_hold():
    """The plan line's count under Ray, from the cluster's resources (as `cluster_resources()` gives them): a run of
    FPL's shape holds its driver and 2 actors, 3 CPUs, and here a GPU share on each."""
    def fit(shares: float, have: dict, asked: int | None = None) -> tuple[int, str]:
        c = RunConfig(method="fpl", dataset="office_caltech", gpus_per_actor=shares, driver_gpus=shares)
        return ray_concurrency(c, asked, have)

    # 16 CPUs hold 5 runs; 5 runs' 15 shares of 0.05 fit one GPU
    assert fit(0.05, {"CPU": 16, "GPU": 1}) == (
        5, "Ray: a run holds 3 CPUs and GPU shares 0.05+0.05+0.05, the cluster has 16 CPUs and 1 GPUs: 5 fit")
    # shares of 0.3: 3 fit a GPU, so one run (3 shares) fits one GPU, two runs need 2
    assert fit(0.3, {"CPU": 16, "GPU": 1})[0] == 1 and fit(0.3, {"CPU": 16, "GPU": 2})[0] == 2
    assert fit(0.3, {"CPU": 16, "GPU": 4})[0] == 4  # 12 shares on 4 GPUs; the CPUs would hold 5
    assert fit(0.05, {"CPU": 16, "GPU": 1}, asked=2) == (
        2, "Ray: a run holds 3 CPUs and GPU shares 0.05+0.05+0.05, the cluster has 16 CPUs and 1 GPUs: 5 fit; "
           "--parallel 2")
    assert fit(0.05, {"CPU": 16, "GPU": 1}, asked=9)[0] == 5  # never more than fit whole
    assert fit(0, {"CPU": 7}) == (2, "Ray: a run holds 3 CPUs, the cluster has 7 CPUs and 0 GPUs: 2 fit")
    whole = RunConfig(method="fpl", dataset="office_caltech", gpus_per_actor=1)  # 2 whole GPUs a run
    assert ray_concurrency(whole, None, {"CPU": 64, "GPU": 5})[0] == 2


def test_a_local_sweep_with_a_gpu_runs_gpu_parallel_at_once_in_workers():
    """The local executor's plan with a GPU to train on: GPU_PARALLEL (4) worker processes by default; --parallel
    wins; never more than the runs."""
    todo = [RunConfig(method="fpl", dataset="office_caltech", executor="local")] * 24
    assert local_concurrency(todo, None, cuda=True, cores=16) == (
        4, "default on a GPU: 4 runs at once gave about 3x the throughput of one on an H100; --parallel N to change; "
           "worker processes, output in <run folder>/run.log")
    assert local_concurrency(todo, 7, cuda=True, cores=16)[0] == 7
    assert local_concurrency(todo, 1, cuda=True, cores=16) == (1, "--parallel 1")
    assert local_concurrency(todo[:3], None, cuda=True, cores=16)[0] == 3


def test_a_cpu_sweep_runs_as_many_at_once_as_the_cores_hold_each_run_on_the_threads_it_keeps_busy():
    """Without a GPU a run in process keeps busy, at once, its client groups' threads (one group per --num-actors,
    at most one per client, each on its whole --cpus-per-actor CPUs, at least 1) while they train beside each other,
    its driver's (--driver-cpus) between their calls: the default --parallel is the cores over the larger, at least
    1, at most the runs. By hand (Office-Caltech: 10 clients; its webcam and dslr: 5)."""
    def n(cores, runs=24, **kw):
        return local_concurrency([RunConfig(**{**BASE, **kw})] * runs, None, cuda=False, cores=cores)[0]

    assert [n(cores) for cores in (1, 2, 3, 4, 5, 16)] == [1, 1, 1, 2, 2, 8]  # 2 groups of 1: 2 threads a run
    assert n(16, runs=3) == 3 and n(16, runs=1) == 1
    assert n(2, num_actors=1) == 2 and n(16, num_actors=1) == 16  # 1 group of 1, a driver of 1: 1 thread a run
    assert n(16, num_actors=3, cpus_per_actor=2, driver_cpus=4) == 2  # 3 x 2 = 6 threads, the driver's 4 between
    assert n(16, driver_cpus=8) == 2 and n(16, driver_cpus=3) == 5  # the driver's 8 (3) more than the groups' 2
    assert n(16, cpus_per_actor=0.5) == 8 and n(16, cpus_per_actor=2.7) == 4  # 2 x 1 and 2 x 2 threads
    assert n(16, num_actors=20) == 1 and n(16, num_actors=20, domains=["webcam", "dslr"]) == 3  # 10 and 5 groups
    assert n(16, engine="fused") == 16  # its groups train one after another (not in threads): 1 thread at once
    proto = dict(method="fedproto", dataset="mnist")  # FedProto's CNN, its dropout on torch's global stream
    assert n(16, **proto) == 16 and n(2, **proto) == 2
    mixed = [RunConfig(**{**BASE, **proto}), RunConfig(**BASE)]  # the busiest run counts
    assert local_concurrency(mixed * 4, None, cuda=False, cores=4)[0] == 2
    todo = [RunConfig(**BASE, num_actors=3, cpus_per_actor=2, driver_cpus=4)] * 24
    threads = ("a run trains on at most 6 CPU thread(s) at once (3 client group(s) at the same time on 2 each, its "
               "driver on 4 between their calls)")
    assert local_concurrency(todo, None, cuda=False, cores=16) == (
        2, f"default without a GPU: {threads}: 2 fit this machine's 16; --parallel N to change; worker processes, "
           "output in <run folder>/run.log")
    assert local_concurrency(todo, None, cuda=False, cores=5) == (
        1, f"default without a GPU: {threads}: 1 fit this machine's 5; --parallel N to change")
    assert local_concurrency(todo, 3, cuda=False, cores=5) == (
        3, f"--parallel 3; {threads}: 1 fit this machine's 5; worker processes, output in <run folder>/run.log")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the plan of a machine without a GPU (the sweep's runs: auto)")
def test_a_dry_run_says_how_many_runs_the_cores_hold(data_root, tmp_path, capsys):
    """A real sweep's plan (Table 2's smoke rows of FedAvg and FPL on Office-Caltech, 2 runs of 2 client groups of
    1 thread): the cores over 2, at least 1, at most 2 (1 on this project's 2-core machine)."""
    cores = os.cpu_count()
    fit = max(1, cores // 2)
    assert main(["--table", "2", "--profile", "smoke", "--methods", "fedavg,fpl", "--datasets", "office_caltech",
                 "--executor", "local", "--dry-run", "--data-root", str(data_root),
                 "--results-dir", str(tmp_path)]) == 0
    workers = "; worker processes, output in <run folder>/run.log" * (fit > 1)
    assert (f"\n  {min(2, fit)} at once (default without a GPU: a run trains on at most 2 CPU thread(s) at once (2 "
            "client group(s) at the same time on 1 each, its driver on 1 between their calls): "
            f"{fit} fit this machine's {cores}; --parallel N to change{workers})\n") in capsys.readouterr().out
    assert not any(tmp_path.iterdir())
