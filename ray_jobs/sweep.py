"""`make table1|table2|table3|table-fedapc|table-all|...`: a table's sweep through Ray, resumable, then a report
beside the paper.

    python -m ray_jobs.sweep --table 2 [--profile full|smoke] [--domains mnist,usps,syn]
    python -m ray_jobs.sweep --table fedproto [--profile full|smoke]   # FedProto's Tables 1 and 2, its own report
    python -m ray_jobs.sweep --table fedapc    # FedAPC's Tables I and II under its 8-client protocol
    python -m ray_jobs.sweep --table all       # every registered method (not the ablation variants), FPL's protocol
    python -m ray_jobs.sweep --table fedplvm_fig4a   # a hyperparameter grid (FedPLVM's Figures 4, 5), its own report
    python -m ray_jobs.sweep --table 2 --methods fedavg,fpl --seeds 0 --datasets digits   # part of a table
    python -m ray_jobs.sweep --table 2 --dry-run   # what it would run (and resume), starting and writing nothing

The tables (their runs as method x preset, the paper's numbers, the metric, the seeds)
are data in `ray_jobs.tables`; `ray_jobs.plan` makes their runs, `ray_jobs.report` their reports
(`ray_jobs.report_fedproto` FedProto's, `ray_jobs.report_grid` a hyperparameter grid's).
A run whose complete summary.json exists is not run again, so an interrupted
sweep continues where it stopped; one of another protocol in a run's folder stops
the sweep before any run (a finished run is never replaced). Runs go to Ray concurrently as far as the
cluster's resources allow (a Ray cluster of the sweep's own, or the one --address or RAY_ADDRESS names);
with `--executor local`, as many at once as the CPU threads fit (`--parallel N`: N), in worker processes (no
Ray).
The `smoke` profile runs the same code paths with tiny settings; its reports go
to results/smoke/ and say so in their titles, never over a full-profile report.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import torch
from threadpoolctl import threadpool_limits
from tqdm import tqdm

from benchmark import checkpoint
from benchmark.data import DataError
from benchmark.protocols import ConfigError
from benchmark.results import WriteError, run_complete
from lightning_modules.clients import CLIENT_MEMORY
from ray_jobs import report_fedproto, report_grid
from ray_jobs.cli import OneLineParser
from ray_jobs.config import RunConfig
from ray_jobs.executors import threads_at_once
from ray_jobs.plan import (check_data, check_no_finished_run_replaced, foreign_domains_note, plan, reading_runs,
                           reported_runs, select)
from ray_jobs.progress import SweepProgress
from ray_jobs.report import log_wandb, report
from ray_jobs.run import ADDRESS_HELP, RunError, gpus_needed, init_ray, ray_only_note, run, run_gpu_shares
from ray_jobs.tables import GROUPS, PROFILES, TABLES, report_name

GPU_PARALLEL = 4  # local runs at once on a GPU by default; see local_concurrency
RESUME_HINT = "run the same sweep command again (it resumes its interrupted runs)"


def concurrency(todo: list[RunConfig], asked: int | None, address: str | None = None) -> tuple[int, str]:
    """How many of these runs go at once, and why (the sweep's plan line says it); under Ray, after starting or
    joining its cluster (`address`, `init_ray`)."""
    c = todo[0]
    if c.executor == "ray":
        n, why = ray_concurrency(c, asked, init_ray(c, address).cluster_resources())
    else:
        n, why = local_concurrency(todo, asked, c.device != "cpu" and torch.cuda.is_available(), os.cpu_count() or 1)
    return min(n, len(todo)), why


def ray_concurrency(c: RunConfig, asked: int | None, have: dict) -> tuple[int, str]:
    """As many runs at once as fit whole in the Ray cluster's resources `have` (a run holds its driver and all its
    actors for its whole life, so runs that only partly fit could wait on each other forever), at most `asked`."""
    cpus = c.driver_cpus + c.num_actors * c.cpus_per_actor
    fit = math.floor(have.get("CPU", 0) / cpus)
    shares = run_gpu_shares(c)
    while fit > 1 and gpus_needed(shares * fit) > have.get("GPU", 0):  # runs packed together on the GPUs
        fit -= 1
    fit = max(1, fit)
    gpus = f" and GPU shares {'+'.join(f'{g:g}' for g in shares if g)}" if any(shares) else ""
    why = (f"Ray: a run holds {cpus:g} CPUs{gpus}, the cluster has {have.get('CPU', 0):g} CPUs and "
           f"{have.get('GPU', 0):g} GPUs: {fit} fit" + (f"; --parallel {asked}" if asked else ""))
    return min(asked or fit, fit), why


def local_concurrency(todo: list[RunConfig], asked: int | None, cuda: bool, cores: int) -> tuple[int, str]:
    """How many of these local runs go at once: --parallel, else without a GPU to train on (`cuda`) as many as fit
    this machine's `cores` CPU threads, each on the most threads one of them keeps busy at once (`threads_at_once`:
    FPL's default, 2 client groups of 1 thread at the same time, 2), at least 1; with a GPU, GPU_PARALLEL: on one
    H100, 4 Office-Caltech runs at once took 314 to 342 s each against 261 s for FPL alone, about 3x the throughput
    of one at a time, and 7 at once 2.5 to 3x (2026-11-24, results/perf/h100-2026-11-24/README.md); more runs only
    add GPU memory and CPU contention. The runs' numbers are the same at any count: each run sets its own threads."""
    if cuda:
        fit = GPU_PARALLEL
        why = f"default on a GPU: {fit} runs at once gave about 3x the throughput of one on an H100"
    else:
        groups, each, driver = max(map(threads_at_once, todo), key=lambda t: max(t[0] * t[1], t[2]))
        threads = max(groups * each, driver)
        fit = max(1, cores // threads)
        why = (f"a run trains on at most {threads} CPU thread(s) at once ({groups} client group(s) at the same time "
               f"on {each} each, its driver on {driver} between their calls): {fit} fit this machine's {cores}")
    if asked:
        why = f"--parallel {asked}" + ("" if cuda else f"; {why}")
    else:
        why = ("" if cuda else "default without a GPU: ") + f"{why}; --parallel N to change"
    n = min(asked or fit, len(todo))
    return n, why + "; worker processes, output in <run folder>/run.log" * (n > 1)


def worker_threads(n: int) -> int:
    """Each of n worker processes' share of this machine's CPU threads: the most that what its run does not set
    itself may use (numpy's and scikit-learn's pools, torch's before the run sets its driver's and groups')."""
    return max(1, (os.cpu_count() or 1) // n)


def to_make(runs: list[RunConfig], parallel: int | None) -> list[RunConfig]:
    """The runs not complete yet, after the checks made before any run."""
    if parallel is not None and parallel < 1:
        raise ConfigError(f"--parallel takes a number of runs at once, 1 or more (got {parallel}).")
    todo = [c for c in runs if not run_complete(c)]
    check_no_finished_run_replaced(todo)
    return todo


def execute(runs: list[RunConfig], parallel: int | None, address: str | None = None) -> list[str]:
    """Run what is not complete yet, concurrently where resources allow; returns the names run. `address`: the
    Ray cluster to join (`init_ray`; default RAY_ADDRESS, else a cluster of the sweep's own)."""
    todo = to_make(runs, parallel)
    line = f"{len(runs) - len(todo)} of {len(runs)} runs already complete; running {len(todo)}"
    if not todo:
        print(line, flush=True)
        return []
    parallel, why = concurrency(todo, parallel, address)
    print(f"{line}, {parallel} at once ({why})", flush=True)
    progress = SweepProgress(len(todo), rounds={c.run_name: c.rounds - resume_round(c) for c in todo})
    if todo[0].executor == "local" and parallel > 1:
        failed = run_in_workers(todo, parallel, progress)
    else:
        failed = run_in_threads(todo, parallel, progress)
    elapsed = progress.close()
    print(f"sweep: {len(todo) - len(failed)} runs done, {len(failed)} failed, {len(runs) - len(todo)} already complete "
          f"({tqdm.format_interval(elapsed)})", flush=True)
    if failed:
        raise RunError(f"{len(failed)} of {len(todo)} runs failed, no report written: "
                       + "; ".join(f"{c.run_name} ({e})" for c, e in failed)
                       + ". Their folders hold error.txt; run the sweep again to retry them.")
    return [c.run_name for c in todo]


def resume_round(c: RunConfig) -> int:
    """The rounds a run's newest checkpoint holds (0 without one): where the sweep resumes it."""
    newest = checkpoint.newest_round(Path(c.out) / checkpoint.DIR)
    return 0 if newest is None else newest + 1


def avg_of(rec: dict) -> float | None:
    """A round record's AVG accuracy; None for a round the evaluation schedule skipped."""
    return None if rec.get("accuracy") is None else rec["accuracy"]["AVG"]


def dry_run(table: str, profile: str, runs: list[RunConfig], parallel: int | None) -> list[str]:
    """What `execute` would do with these runs, as lines, without running or writing anything: the runs to make
    (each with the round its checkpoint would resume after), after the checks it makes first. How many go at once
    under Ray is the cluster's to say when the sweep runs (not asked here: it would start Ray)."""
    todo = to_make(runs, parallel)
    lines = [f"dry run of --table {table} ({profile} profile): {len(runs) - len(todo)} of {len(runs)} runs already "
             f"complete; it would make {len(todo)}" + (":" if todo else ".")]
    for c in todo:
        first = resume_round(c)
        lines.append(f"  {c.out}" + (f"  (resumes after round {first - 1})" if first else ""))
    if todo:
        if todo[0].executor == "local":
            n, why = concurrency(todo, parallel)
            lines.append(f"  {n} at once ({why})")
        else:
            lines.append("  as many at once as the Ray cluster fits (the sweep says how many when it runs)")
    return [*lines, "No run started, nothing written (drop --dry-run to run them)."]


def run_in_threads(todo: list[RunConfig], parallel: int, progress: SweepProgress) -> list[tuple[RunConfig, Exception]]:
    """The runs from threads of this process (under Ray each run's work is in its actors); returns the failed ones."""
    def one(cfg: RunConfig):
        progress.started(cfg.run_name)
        try:
            summary = run(cfg, quiet=True, resume=True, resume_hint=RESUME_HINT,  # an interrupted run goes on
                          on_round=lambda rec: progress.round(cfg.run_name, rec["round"], cfg.rounds, avg_of(rec)))
        except Exception as e:
            progress.failed_run(cfg.run_name, str(e) or repr(e))
            raise
        progress.finished(cfg.run_name, summary)

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = [pool.submit(one, c) for c in todo]
    return [(c, f.exception()) for c, f in zip(todo, futures) if f.exception()]


def run_in_workers(todo: list[RunConfig], parallel: int, progress: SweepProgress) -> list[tuple[RunConfig, Exception]]:
    """Local runs, `parallel` at once, in as many worker processes (spawned: fresh interpreters), each with its
    share of the CPU threads, taking one run after another (an interpreter's start-up, importing torch and Lightning,
    took 4 to 5 CPU seconds, more than a FedProto smoke run trains: 2026-12-02) and writing each run's output to
    <run folder>/run.log; returns the failed runs. A failed run does not stop the others; a worker that died (killed,
    out of memory) fails its run and the next run goes to a new one, as does a run meant for a worker that died while
    idle (`send_run`). Ctrl-C stops every worker (its run writes error.txt and keeps its checkpoints) and raises
    RunError saying how to resume."""
    ctx = multiprocessing.get_context("spawn")
    threads = worker_threads(parallel)
    waiting, idle, running, failed = list(todo), [], {}, []
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                cfg = waiting.pop(0)
                conn, proc = send_run(cfg, idle, ctx, threads)
                running[conn] = (cfg, proc)
                progress.started(cfg.run_name)
            for conn in multiprocessing.connection.wait(list(running)):
                cfg, proc = running[conn]
                ok, result = worker_result(conn, proc, cfg)
                if ok == "round":  # (round index, AVG) of a round the run trained: it goes on
                    progress.round(cfg.run_name, result[0], cfg.rounds, result[1])
                    continue
                running.pop(conn)
                if ok:
                    progress.finished(cfg.run_name, result)
                else:
                    progress.failed_run(cfg.run_name, result)
                    failed.append((cfg, RunError(result)))
                if result != INTERRUPTED and proc.is_alive():  # (a worker stopped by SIGTERM ends after its run)
                    idle.append((conn, proc))
    except KeyboardInterrupt:
        for cfg, proc in running.values():  # each worker's run stops at once, writing error.txt
            proc.terminate()
        for conn, (cfg, proc) in running.items():
            proc.join(60)
            if proc.is_alive():  # stuck: its checkpoints stay whatever it was doing
                proc.kill()
                proc.join()
            conn.close()
        progress.close()
        names = ", ".join(cfg.run_name for cfg, _ in running.values())
        raise RunError(f"interrupted (Ctrl-C): stopped {len(running)} running run(s) ({names})"
                       + (f", {len(waiting)} not started" if waiting else "")
                       + f"; their folders keep their checkpoints. To continue, {RESUME_HINT}.") from None
    finally:
        for conn, proc in idle:  # no run left for them
            try:
                conn.send(None)
            except OSError:  # died meanwhile
                pass
            proc.join(60)
            conn.close()
    return failed


def send_run(cfg: RunConfig | None, idle: list, ctx, threads: int):
    """`cfg` sent to an idle worker (taken from `idle`), else to a new one; returns that worker (its pipe's end,
    its process). A worker that died while idle, between two runs (killed, out of memory), is passed over: its end
    of the pipe is closed, so the send fails."""
    while idle:
        conn, proc = idle.pop()
        try:
            conn.send(cfg)
            return conn, proc
        except OSError:  # BrokenPipeError
            proc.join()
            conn.close()
    conn, proc = start_worker(ctx, threads)
    conn.send(cfg)
    return conn, proc


def start_worker(ctx, threads: int):
    """A worker process (`worker`) and this end of its pipe; the worker holds the only other end, so that its death
    reads as EOF here."""
    conn, theirs = ctx.Pipe()
    proc = ctx.Process(target=worker, args=(threads, theirs), name="sweep worker")
    proc.start()
    theirs.close()
    return conn, proc


def worker_result(conn, proc, cfg: RunConfig) -> tuple[bool | str, dict | str | tuple]:
    """A worker's next word on its run: ("round", (round index, AVG or None)) after each round the run trains, then
    (True, summary) when the run completed, else (False, why it did not)."""
    try:
        return conn.recv()
    except EOFError:  # the process died without a word (killed, out of memory)
        proc.join()
        conn.close()
        code = proc.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
        return False, f"its worker process {proc.pid} died ({how}); see {Path(cfg.out) / 'run.log'}"


def worker(threads: int, conn) -> None:
    """A worker process: runs the configs the sweep sends, one after another until it sends None, each with its
    output to <run folder>/run.log (with this process's id and the run's start and end times), `threads` CPU threads
    at most, resumed from the folder's last checkpoint; sends each run's (True, summary) or (False, message). SIGTERM
    (the sweep's Ctrl-C) stops the run as Ctrl-C stops a run; SIGINT is the sweep's. A worker whose sweep died
    without stopping it (killed: `kill`, SIGKILL, a lost session) stops its run itself within ORPHAN_CHECK_S, as
    SIGTERM does, rather than train on unseen."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the run's clean-up then goes undisturbed
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    sweep_pid = os.getppid()

    def stop_when_orphaned():
        while os.getppid() == sweep_pid:  # a dead parent's children are re-parented
            time.sleep(ORPHAN_CHECK_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_orphaned, daemon=True, name="orphan check").start()

    def tell(rec: dict) -> None:  # each round trained, for the sweep's progress
        try:
            conn.send(("round", (rec["round"], avg_of(rec))))
        except OSError:  # the sweep is gone: the orphan check stops the run
            pass

    # each run then sets its own: its driver's thread's --driver-cpus, each client group's --cpus-per-actor
    # (`Driver`, `LocalExecutor`), whatever this share: the same numbers at any --parallel
    torch.set_num_threads(threads)
    threadpool_limits(threads)  # numpy's and scikit-learn's BLAS and OpenMP pools (FINCH)
    try:
        while (cfg := conn.recv()) is not None:
            out = Path(cfg.out)
            out.mkdir(parents=True, exist_ok=True)
            with open(out / "run.log", "a") as log:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                sys.stdout.reconfigure(line_buffering=True)
                sys.stderr.reconfigure(line_buffering=True)
                print(f"sweep worker pid {os.getpid()}: started {now()} ({threads} CPU thread{'s' * (threads > 1)})")
                try:
                    result = True, run(cfg, quiet=False, resume=True, resume_hint=RESUME_HINT, on_round=tell)
                except KeyboardInterrupt:
                    result = False, INTERRUPTED
                except Exception as e:
                    result = False, str(e) or repr(e)
                print(f"sweep worker pid {os.getpid()}: ended {now()} ({'complete' if result[0] else result[1]})")
                conn.send(result)
                if result[1] == INTERRUPTED:  # SIGTERM: this worker stops with its run
                    return
    except (EOFError, OSError, KeyboardInterrupt):  # the sweep is gone or stopping: its run folders say how they ended
        pass


INTERRUPTED = "interrupted (Ctrl-C)"  # what a worker says of a run SIGTERM stopped
ORPHAN_CHECK_S = 2.0  # how often a sweep worker checks that its sweep is alive


def now() -> str:
    return datetime.now().astimezone().isoformat(timespec="milliseconds")


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m ray_jobs.sweep", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", required=True, choices=sorted([*TABLES, *GROUPS]),
                    help="a table, or a group of tables swept together: "
                         + "; ".join(f"{g} = {', '.join(t)}" for g, t in GROUPS.items()))
    ap.add_argument("--profile", default="full", choices=sorted(PROFILES))
    ap.add_argument("--domains", default=None, help="comma-separated domains to use (others are left out)")
    ap.add_argument("--methods", default=None, help="comma-separated: run only these of the table's methods, at "
                    "any profile (the smoke profile's default rows are fewer; the report covers every run of them and "
                    "of these that is complete)")
    ap.add_argument("--seeds", default=None, help="comma-separated: run only these of the table's seeds")
    ap.add_argument("--values", default=None,
                    help="comma-separated: run only these values of a grid table's hyperparameter (FedPLVM's Figures "
                         "4 and 5; in a group, its other tables run nothing)")
    ap.add_argument("--datasets", default=None, help="comma-separated: run only the table's runs on these datasets")
    ap.add_argument("--readings", action="store_true",
                    help="make the table's readings of the chosen rows instead of the rows (Table.readings: the runs "
                         "its report's 'Readings of' sections read, at the full profile)")
    ap.add_argument("--results-dir", default=None, help="default results/ (full) or results/smoke/ (smoke)")
    ap.add_argument("--data-root", default=None)
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--report-only", action="store_true",
                      help="run nothing: write the report from the table's complete runs (those missing say so)")
    only.add_argument("--dry-run", action="store_true",
                      help="run and write nothing: list the runs the sweep would make (and those it would resume "
                           "from a checkpoint) after the checks it makes before any run")
    ap.add_argument("--parallel", type=int, default=None,
                    help="runs at once (default: Ray, as many as the cluster fits; local, without a GPU as many as "
                         "this machine's CPU threads fit, each run at the threads its client groups and driver keep "
                         f"busy at once (the plan line says), {GPU_PARALLEL} on one; the same numbers at any count)")
    ap.add_argument("--executor", default="ray", choices=["ray", "local"],
                    help="local: no Ray (not imported); one run in this process, or several in worker processes")
    ap.add_argument("--address", default=None, help=ADDRESS_HELP)
    ap.add_argument("--engine", default="auto", help="client training engine of every run: auto, sequential or fused")
    ap.add_argument("--precision", default="32-true",
                    help="32-true (as the references, and ray_jobs.run's default), bf16-mixed, or auto (bf16-mixed "
                         "on a CPU with native bfloat16, else 32-true); part of each run's protocol, recorded as "
                         "picked; a run away from 32-true has folders of its own (-bf16-mixed in their names)")
    ap.add_argument("--eval-every", type=int, default=None,
                    help="test every run after every K-th round (0: none) and the rounds the table's metric reads: the "
                         "last 5, or the final one (default: the table's full-profile schedule, every round at the "
                         "smoke profile); not part of a run's protocol")
    ap.add_argument("--participation", type=float, default=None,
                    help="the share of the clients that train in each round of every run (default: each preset's, "
                         "1 for the papers'); part of each run's protocol and of its folder's name")
    ap.add_argument("--checkpoint-every", type=int, default=1,
                    help="rounds between each run's checkpoints (a resume redoes at most N-1 rounds; 0: none)")
    ap.add_argument("--actor-restarts", type=int, default=3,
                    help="restarts of one client actor before its run stops; 0: a run's actors send their clients' "
                         "states only for its checkpoints, not every round (docs/reliability.md)")
    ap.add_argument("--gpus-per-actor", type=float, default=0.0,
                    help="Ray: each run's client actors' GPU share (fractions share a GPU: 0.1 puts several runs on "
                         "one); not part of a run's protocol")
    ap.add_argument("--driver-gpus", type=float, default=0.0, help="Ray: each run's driver's GPU share (it evaluates)")
    ap.add_argument("--client-memory", default=None, choices=CLIENT_MEMORY,
                    help="where each run's client groups keep the clients they are not training (default auto: host "
                         "memory under --participation below 1; docs/scale.md); not part of a run's protocol")
    ap.add_argument("--cudnn-benchmark", action=argparse.BooleanOptionalAction, default=None,
                    help="CUDA: cuDNN times each convolution shape's algorithms once and keeps the fastest "
                         "(torch.backends.cudnn.benchmark; on by default, --no-cudnn-benchmark for cuDNN's "
                         "heuristics); not part of a run's protocol")
    ap.add_argument("--spread", action="store_true",
                    help="Ray: place each run's client actors over as many nodes as possible (SPREAD); not part of a "
                         "run's protocol")
    args = ap.parse_args(argv)
    results_dir = Path(args.results_dir or ("results" if args.profile == "full" else "results/smoke"))
    extra = {"executor": args.executor, "engine": args.engine, "precision": args.precision,
             "checkpoint_every": args.checkpoint_every, "actor_restarts": args.actor_restarts,
             "gpus_per_actor": args.gpus_per_actor, "driver_gpus": args.driver_gpus,
             **({} if args.eval_every is None else {"eval_every": args.eval_every}),
             **({} if args.participation is None else {"participation": args.participation}),
             **({} if args.client_memory is None else {"client_memory": args.client_memory}),
             **({"spread": True} if args.spread else {}),
             **({} if args.cudnn_benchmark is None else {"cudnn_benchmark": args.cudnn_benchmark})}
    tables = GROUPS.get(args.table, (args.table,))
    try:
        if results_dir.exists() and not results_dir.is_dir():
            raise ConfigError(f"--results-dir {results_dir} is a file; a sweep writes its run folders and reports "
                              "under a folder there: name a folder (new or results/).")
        domains = args.domains.split(",") if args.domains is not None else None
        methods = args.methods.split(",") if args.methods else None
        # (at the smoke profile a table's default rows and those of the methods named: any method of the table)
        runs = {t: plan(t, args.profile, domains, results_dir, args.data_root, extra, methods=methods) for t in tables}
        if note := foreign_domains_note(args.table, tables, args.profile, domains):
            print(note, file=sys.stderr)
        try:
            seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
        except ValueError:
            raise ConfigError(f"--seeds takes comma-separated integers, e.g. 0,1,2 (got {args.seeds!r}).") from None
        datasets = args.datasets.split(",") if args.datasets else None
        try:
            values = [float(v) for v in args.values.split(",")] if args.values else None
        except ValueError:
            raise ConfigError(f"--values takes comma-separated numbers (got {args.values!r}).") from None
        chosen = {t: [] if values and len(tables) > 1 and TABLES[t].grid is None  # a group's other tables
                  else select(t, args.profile, runs[t], methods, seeds, datasets, values) for t in tables}
        if args.readings:
            chosen = {t: reading_runs(t, runs[t], chosen[t]) for t in tables}
        for t in tables if not args.report_only else ():
            check_data(chosen[t], t)
        if args.dry_run:
            print("\n".join(dry_run(args.table, args.profile,
                                    list({c.out: c for t in tables for c in chosen[t]}.values()), args.parallel)))
            return 0
        if not args.report_only:
            todo = list({c.out: c for t in tables for c in chosen[t]}.values())  # a run shared by tables: once
            if todo and (note := ray_only_note(todo[0])):
                print(note, flush=True)
            execute(todo, args.parallel, args.address)
        dfs, unreported = {}, []
        for t in tables:
            runs[t] = reported_runs(runs[t])  # a run made on fewer domains (--domains) stands in for a missing one
            try:
                # per stdev, n and inference rule, beside the paper's Tables 1 and 2 (ray_jobs.report_fedproto)
                if t == "fedproto":
                    dfs[t], figs = report_fedproto.report(args.profile, runs[t], results_dir)
                    log_wandb(t, args.profile, dfs[t], figs)
                elif TABLES[t].grid is not None:  # a hyperparameter grid (FedPLVM's Figures 4, 5): ray_jobs.report_grid
                    dfs[t], figs = report_grid.report(t, args.profile, runs[t], results_dir)
                    log_wandb(t, args.profile, dfs[t], figs)
                else:
                    dfs[t] = report(t, args.profile, runs[t], results_dir)
            except RunError:
                if len(tables) == 1:
                    raise
                unreported.append(t)  # a group's table without a complete run yet: the others are reported
        if not dfs:
            raise RunError(f"no complete run of any table of {args.table} to report; run its sweep first.")
    except (ConfigError, DataError, RunError, WriteError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if unreported:
        print(f"note: no complete run yet of {', '.join(unreported)}: not reported", file=sys.stderr)
    for t in dfs:
        name = report_name(t)
        print((results_dir / f"{name}.md").read_text())
        print(f"report: {results_dir / f'{name}.md'} and .csv ({len(dfs[t])} cells); "
              f"figures: {results_dir / 'figures' / name}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
