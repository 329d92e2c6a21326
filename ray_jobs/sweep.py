"""`make table1|table2|table3|table-fedapc|table-all|...`: a table's sweep through Ray, resumable, then a report
beside the paper.

    python -m ray_jobs.sweep --table 2 [--profile full|smoke] [--domains mnist,usps,syn]
    python -m ray_jobs.sweep --table fedproto [--profile full|smoke]   # FedProto's Table 1, its own report
    python -m ray_jobs.sweep --table fedapc    # FedAPC's Tables I and II under its 8-client protocol
    python -m ray_jobs.sweep --table all       # every registered method (not the ablation variants), FPL's protocol
    python -m ray_jobs.sweep --table 2 --methods fedavg,fpl --seeds 0 --datasets digits   # part of a table

The tables (their runs as method x preset, the paper's numbers, the metric, the seeds)
are data in `benchmark.tables`.
A run whose complete summary.json exists is not run again, so an interrupted
sweep continues where it stopped. Runs go to Ray concurrently as far as the
cluster's resources allow (RAY_ADDRESS for a cluster, else a local instance);
with `--executor local --parallel N`, N at once in worker processes (no Ray).
The `smoke` profile runs the same code paths with tiny settings; its reports go
to results/smoke/ and say so in their titles, never over a full-profile report.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from threadpoolctl import threadpool_limits
from tqdm import tqdm

from benchmark import paper
from benchmark.config import PRESETS, ConfigError, RunConfig
from benchmark.data import DATASETS, STAND_INS, DataError, check_domains_present, resolve_data_root
from benchmark.figures import RUNS_LINE, table_figures
from benchmark.provenance import commit_label, hardware_label
from benchmark.results import atomic_write, read_jsonl, read_summary, run_complete, wandb_mode
from benchmark.tables import GAP_NOTES, GROUPS, METRICS, PROFILES, TABLES, make_target, report_name
from ray_jobs import table_fedproto
from ray_jobs.progress import SweepProgress
from ray_jobs.run import OneLineParser, RunError, gpus_needed, init_ray, run, run_gpu_shares

FLAG_POINTS = 2.0
MB = 1e6
# why a dataset's planned runs may be missing from a report
NOT_RUN_WHY = {"digits": "FPL's Digits protocol is about 40 h a run on a 2-core CPU: GPU work (README, GPU runbook)"}


def gap_note(table: str, dataset: str, method: str, domain: str, diff: float, std: float, seeds: int,
             planned_seeds: int, test_size: int | None) -> str:
    """What we know of why a cell is far from the paper: the notes of `GAP_NOTES` (most specific first), our seed
    spread when the gap is within two of its standard deviations, fewer seeds than planned, a test set so small
    that one image moves the accuracy by a point or more; or that we do not know."""
    notes = [n for key in ((table, dataset, method, domain), (table, dataset, "*", domain), (table, dataset, method, "*"),
                           (table, dataset, "*", "*"), ("*", dataset, "*", domain), ("*", dataset, "*", "*"))
             for n in [GAP_NOTES.get(key)] if n]
    if seeds > 1 and abs(diff) <= 2 * std:
        notes.append(f"within two standard deviations of our seeds (± {std:.2f})")
    if seeds < planned_seeds:
        notes.append(f"{seeds} of {planned_seeds} seeds run (a seed's spread here can exceed the gap)")
    if test_size and 100 / test_size >= 1:
        notes.append(f"its test set is {test_size} images (one image is {100 / test_size:.1f} points)")
    return "; ".join(dict.fromkeys(notes)) or "not known"


def domains_for(dataset: str, requested: list[str] | None) -> list[str]:
    """The requested domains that belong to `dataset`; all of its domains when none do."""
    mine = [d for d in DATASETS[dataset] if requested and d in requested]
    return mine or list(DATASETS[dataset])


def plan(table: str, profile: str, requested_domains: list[str] | None, results_dir: Path, data_root: str | None,
         extra: dict | None = None) -> list[RunConfig]:
    """Every run of the table (its data is checked by `check_data`, for the runs a sweep will make)."""
    spec = TABLES[table]
    root = resolve_data_root(data_root)
    every = list(dict.fromkeys(d for ds in DATASETS.values() for d in ds))
    unknown = sorted(set(requested_domains or []) - set(every))
    if unknown:
        raise ConfigError(f"unknown domain(s) {unknown}; choose from {', '.join(every)}.")
    rows = spec.row_list()
    dataset_of = {p: PRESETS[p]["dataset"] for _, p in rows}
    runs = []
    for method, preset in rows:
        for seed in spec.seeds_for(profile):
            cfg = RunConfig.from_preset(preset, method=method, domains=domains_for(dataset_of[preset], requested_domains),
                                        seed=seed, data_root=str(root), wandb_group=f"{report_name(table)}-{profile}",
                                        **{**spec.overrides(profile), **(extra or {})})
            runs.append(dataclasses.replace(cfg, out=str(results_dir / "runs" / cfg.run_name)))
    return runs


def select(table: str, profile: str, runs: list[RunConfig], methods: list[str] | None = None,
           seeds: list[int] | None = None, datasets: list[str] | None = None) -> list[RunConfig]:
    """The planned runs of the given methods, seeds and datasets (None: all), for a sweep that runs part of a
    table."""
    have = {"method": list(dict.fromkeys(c.method for c in runs)), "seed": list(TABLES[table].seeds_for(profile)),
            "dataset": list(dict.fromkeys(c.dataset for c in runs))}
    for key, asked in (("method", methods), ("seed", seeds), ("dataset", datasets)):
        bad = [a for a in asked or [] if a not in have[key]]
        if bad:
            raise ConfigError(f"{key}(s) {bad} not in table {table} at the {profile} profile; choose from "
                              f"{', '.join(map(str, have[key]))}.")
    return [c for c in runs if (not methods or c.method in methods) and (not seeds or c.seed in seeds)
            and (not datasets or c.dataset in datasets)]


def check_data(runs: list[RunConfig], table: str) -> None:
    """Stop before any run when a domain that one of `runs` reads is absent or corrupt in the data root; the
    data of runs the sweep does not make (other datasets, other domains) is not read."""
    for (ds, root), doms in {(c.dataset, c.data_root): tuple(c.domains) for c in runs}.items():
        try:
            check_domains_present(Path(root), ds, list(doms))
        except DataError as e:
            raise DataError(f"{e} The sweep started no run. To go on without a domain, name the ones to use, "
                            f"for example DOMAINS={','.join(d for d in doms if d != 'svhn')} make {make_target(table)}.") from None


GPU_PARALLEL = 4  # local runs at once on a GPU by default; see local_concurrency
RESUME_HINT = "run the same sweep command again (it resumes its interrupted runs)"


def concurrency(todo: list[RunConfig], asked: int | None) -> tuple[int, str]:
    """How many of these runs go at once, and why (the sweep's plan line says it)."""
    n, why = (ray_concurrency if todo[0].executor == "ray" else local_concurrency)(todo[0], asked)
    return min(n, len(todo)), why


def ray_concurrency(c: RunConfig, asked: int | None) -> tuple[int, str]:
    """As many runs at once as fit whole (a run holds its driver and all its actors for its whole life, so runs that
    only partly fit could wait on each other forever), at most `asked`."""
    have = init_ray(c).cluster_resources()
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


def local_concurrency(c: RunConfig, asked: int | None) -> tuple[int, str]:
    """--parallel, else 1 without a GPU and GPU_PARALLEL on one: on one H100, 4 Office-Caltech runs at once took 314
    to 342 s each against 261 s for FPL alone, about 3x the throughput of one at a time, and 7 at once 2.5 to 3x
    (2026-11-24, results/perf/h100-2026-11-24/README.md); more runs only add GPU memory and CPU contention."""
    if asked:
        why = f"--parallel {asked}"
    elif c.device != "cpu" and torch.cuda.is_available():
        asked, why = GPU_PARALLEL, (f"default on a GPU: {GPU_PARALLEL} runs at once gave about 3x the throughput of one "
                                    "on an H100; --parallel N to change")
    else:
        asked, why = 1, "default without a GPU; --parallel N to change"
    if asked > 1:
        why += f"; worker processes of at most {worker_threads(asked)} CPU thread(s) each, output in <run folder>/run.log"
    return asked, why


def worker_threads(n: int) -> int:
    """Each of n worker processes' share of this machine's CPU threads."""
    return max(1, (os.cpu_count() or 1) // n)


def execute(runs: list[RunConfig], parallel: int | None) -> list[str]:
    """Run what is not complete yet, concurrently where resources allow; returns the names run."""
    if parallel is not None and parallel < 1:
        raise ConfigError(f"--parallel takes a number of runs at once, 1 or more (got {parallel}).")
    todo = [c for c in runs if not run_complete(c)]
    line = f"{len(runs) - len(todo)} of {len(runs)} runs already complete; running {len(todo)}"
    if not todo:
        print(line, flush=True)
        return []
    parallel, why = concurrency(todo, parallel)
    print(f"{line}, {parallel} at once ({why})", flush=True)
    progress = SweepProgress(len(todo))
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


def run_in_threads(todo: list[RunConfig], parallel: int, progress: SweepProgress) -> list[tuple[RunConfig, Exception]]:
    """The runs from threads of this process (under Ray each run's work is in its actors); returns the failed ones."""
    def one(cfg: RunConfig):
        progress.started(cfg.run_name)
        try:
            summary = run(cfg, quiet=True, resume=True, resume_hint=RESUME_HINT)  # an interrupted run goes on
        except Exception as e:
            progress.failed_run(cfg.run_name, str(e) or repr(e))
            raise
        progress.finished(cfg.run_name, summary)

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = [pool.submit(one, c) for c in todo]
    return [(c, f.exception()) for c, f in zip(todo, futures) if f.exception()]


def run_in_workers(todo: list[RunConfig], parallel: int, progress: SweepProgress) -> list[tuple[RunConfig, Exception]]:
    """Local runs, `parallel` at once, each in a worker process of its own (spawned: a fresh interpreter) with its
    share of the CPU threads and its output in <run folder>/run.log; returns the failed ones. A failed run does not
    stop the others. Ctrl-C stops every worker (its run writes error.txt and keeps its checkpoints) and raises
    RunError saying how to resume."""
    ctx = multiprocessing.get_context("spawn")
    threads = worker_threads(parallel)
    waiting, running, failed = list(todo), {}, []
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                cfg = waiting.pop(0)
                receiver, sender = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=worker, args=(cfg, threads, sender), name=f"sweep worker {cfg.run_name}")
                proc.start()
                sender.close()  # the worker holds the only sending end: its death reads as EOF here
                running[receiver] = (cfg, proc)
                progress.started(cfg.run_name)
            for receiver in multiprocessing.connection.wait(list(running)):
                cfg, proc = running.pop(receiver)
                ok, result = worker_result(receiver, proc, cfg)
                if ok:
                    progress.finished(cfg.run_name, result)
                else:
                    progress.failed_run(cfg.run_name, result)
                    failed.append((cfg, RunError(result)))
    except KeyboardInterrupt:
        for cfg, proc in running.values():  # each worker's run stops at once, writing error.txt
            proc.terminate()
        for receiver, (cfg, proc) in running.items():
            proc.join(60)
            if proc.is_alive():  # stuck: its checkpoints stay whatever it was doing
                proc.kill()
                proc.join()
            receiver.close()
        progress.close()
        names = ", ".join(cfg.run_name for cfg, _ in running.values())
        raise RunError(f"interrupted (Ctrl-C): stopped {len(running)} running run(s) ({names})"
                       + (f", {len(waiting)} not started" if waiting else "")
                       + f"; their folders keep their checkpoints. To continue, {RESUME_HINT}.") from None
    return failed


def worker_result(receiver, proc, cfg: RunConfig) -> tuple[bool, dict | str]:
    """(True, summary) of a worker whose run completed, else (False, why it did not)."""
    try:
        ok, result = receiver.recv()
    except EOFError:  # the process died without a word (killed, out of memory)
        proc.join()
        code = proc.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
        ok, result = False, f"its worker process {proc.pid} died ({how}); see {Path(cfg.out) / 'run.log'}"
    proc.join()
    receiver.close()
    return ok, result


def worker(cfg: RunConfig, threads: int, sender) -> None:
    """One run in a worker process: output to <run folder>/run.log (with this process's id and its start and end
    times), `threads` CPU threads at most, resumed from the folder's last checkpoint; sends (True, summary) or
    (False, message). SIGTERM (the sweep's Ctrl-C) stops the run as Ctrl-C stops a run; SIGINT is the sweep's."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the run's clean-up then goes undisturbed
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "run.log", "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
        torch.set_num_threads(threads)  # a run may lower it (--cpus-per-actor, --driver-cpus), never raise it
        threadpool_limits(threads)  # numpy's and scikit-learn's BLAS and OpenMP pools (FINCH)
        print(f"sweep worker pid {os.getpid()}: started {now()} ({threads} CPU thread{'s' * (threads > 1)})")
        try:
            result = True, run(cfg, quiet=False, resume=True, resume_hint=RESUME_HINT)
        except KeyboardInterrupt:
            result = False, "interrupted (Ctrl-C)"
        except Exception as e:
            result = False, str(e) or repr(e)
        print(f"sweep worker pid {os.getpid()}: ended {now()} ({'complete' if result[0] else result[1]})")
        sender.send(result)


def now() -> str:
    return datetime.now().astimezone().isoformat(timespec="milliseconds")


def collect(runs: list[RunConfig], metric: str = "last5") -> pd.DataFrame:
    """One row per (method, dataset, domain): mean and std over seeds of the accuracy by `metric`."""
    rows = []
    for cfg in runs:
        s = read_summary(Path(cfg.out))
        comm = s.get("communication", {}).get("per_client_per_round", {})
        for dom, acc in s[metric].items():
            rows.append({"method": cfg.method, "dataset": cfg.dataset, "domain": dom, "seed": cfg.seed, "acc": acc,
                         "up_bytes": comm.get("up_bytes", np.nan), "down_bytes": comm.get("down_bytes", np.nan)})
    df = pd.DataFrame(rows)
    return df.groupby(["method", "dataset", "domain"], sort=False).agg(
        ours=("acc", "mean"), std=("acc", "std"), seeds=("acc", "count"), up_bytes=("up_bytes", "mean"),
        down_bytes=("down_bytes", "mean")).reset_index()


def setting_line(cfg: RunConfig, domains: list[str], done: list[RunConfig] = ()) -> str:
    """A report's line on a dataset's runs: their protocol, the evaluation schedule the complete runs `done` used
    (from their config.json), and which of `domains` (those run) are stand-ins for the paper's data."""
    schedules = sorted({json.loads((Path(c.out) / "config.json").read_text()).get("eval_every", 1) for c in done})
    evaluated = " or ".join("every round" if k == 1 else f"every {k}th round and the last 5" for k in schedules)
    return (f"Preset {cfg.preset}: {cfg.rounds} rounds x {cfg.local_epochs} local epochs, batch {cfg.batch_size}, "
            f"lr {cfg.lr:g}, momentum {cfg.momentum:g}, client fraction {cfg.client_fraction:g}"
            + (f", test sets capped at {cfg.eval_max}" if cfg.eval_max else "")
            + (f"; tested after {evaluated}" if evaluated else "") + "."
            + "".join(f" {d}: {note}." for d, note in STAND_INS.get(cfg.dataset, {}).items() if d in domains))


def report(table: str, profile: str, runs: list[RunConfig], results_dir: Path) -> pd.DataFrame:
    """results_dir/table<N>.md and .csv (`report_name`): ours (mean, std over seeds) beside the paper,
    differences, change against FedAvg, rank order, and where the table asks, what a client uploads and
    receives per round; rows more than 2 points from the paper flagged."""
    spec = TABLES[table]
    name, comm = report_name(table), spec.communication
    every, runs = runs, [c for c in runs if run_complete(c)]  # a partial sweep: those run
    planned = len(every)
    if not runs:
        raise RunError(f"no complete run of table {table} to report; run its sweep first ({make_target(table)}).")
    agg = collect(runs, spec.metric)
    ref = spec.paper
    lines, csv_rows = [], []
    dropped = {c.dataset: c.dropped_domains for c in every if c.dropped_domains}
    title = f"# {spec.title}: reproduction ({profile} profile"
    title += ", SMOKE SETTINGS: not comparable to the paper)" if profile == "smoke" else ")"
    if dropped:
        title += " — without " + ", ".join(f"{d} ({ds})" for ds, ds_d in dropped.items() for d in ds_d)
    if len(runs) < planned:
        title += f" — PARTIAL: {len(runs)} of its {planned} runs"
    seeds_note = (f"Seeds {list(spec.seeds_for(profile))}" if len(runs) == planned else
                  f"Seeds {list(spec.seeds_for(profile))} planned, not all run: a row is over the seeds it has, "
                  "marked (n seeds) when fewer")
    lines += [title, "", f"{seeds_note}; accuracy (%) of the evaluated model, "
              f"{METRICS[spec.metric]}; mean ± std over seeds (paper value, ours - paper). "
              f"⚠ = a compared cell more than {FLAG_POINTS:g} points from the paper."
              + (" Up / down MB: what one client uploads / receives per round (weights and prototypes; mean over "
                 "clients, rounds and seeds)." if comm else ""), ""]
    for ds in dict.fromkeys(c.dataset for c in every):
        doms = list(DATASETS[ds])
        kept = [d for d in doms if d not in dropped.get(ds, [])]
        methods = list(dict.fromkeys(c.method for c in runs if c.dataset == ds))
        not_run = [m for m in dict.fromkeys(c.method for c in every if c.dataset == ds) if m not in methods]
        c0 = next(c for c in every if c.dataset == ds)
        setting = setting_line(c0, kept, [c for c in runs if c.dataset == ds])
        sub = agg[agg.dataset == ds].set_index(["method", "domain"])
        avg_label = "AVG" if len(kept) == len(doms) else f"AVG of {len(kept)}"
        header = ["method", *doms, avg_label, "Δ FedAvg (paper)", "rank (paper)", *(["up MB", "down MB"] if comm else []),
                  "flag"]
        body = []
        # the paper's AVG when every domain ran, else the mean of its values on the domains that ran
        refs = {m: paper.reference(ref, m, ds, kept, doms) for m in [*methods, *not_run, *spec.not_implemented]}
        paper_avg = {m: r["AVG"] for m, r in refs.items() if r and m in methods}
        our_avg = {m: float(sub.loc[(m, "AVG"), "ours"]) for m in methods}
        order = sorted(methods, key=lambda m: -our_avg[m])
        paper_order = sorted(paper_avg, key=lambda m: -paper_avg[m])
        flagged = []  # (method, domain, ours - paper, seeds) of the cells more than FLAG_POINTS from the paper
        for m in methods:
            n_seeds = int(sub.loc[(m, "AVG"), "seeds"])
            cells, flag = [m if n_seeds == len(spec.seeds_for(profile)) else f"{m} ({n_seeds} seed{'s' * (n_seeds > 1)})"], False
            for d in doms + ["AVG"]:
                if d in dropped.get(ds, []):
                    cells.append("not run")
                    continue
                ours, std = sub.loc[(m, d), "ours"], sub.loc[(m, d), "std"]
                pv = (refs[m] or {}).get(d)
                diff = None if pv is None else ours - pv
                flag |= diff is not None and abs(diff) > FLAG_POINTS
                if diff is not None and abs(diff) > FLAG_POINTS:
                    flagged.append((m, d, diff, 0.0 if np.isnan(std) else float(std), n_seeds))
                std_s = "" if np.isnan(std) else f" ± {std:.2f}"
                cells.append(f"{ours:.2f}{std_s}" + ("" if pv is None else f" ({pv:.2f}, {diff:+.2f})"))
                csv_rows.append({"table": table, "profile": profile, "dataset": ds, "method": m,
                                 "domain": d if d != "AVG" else avg_label, "ours_mean": round(float(ours), 4),
                                 "ours_std": None if np.isnan(std) else round(float(std), 4),
                                 "seeds": int(sub.loc[(m, d), "seeds"]), "paper": pv,
                                 "diff": None if diff is None else round(float(diff), 4),
                                 "flag": diff is not None and abs(diff) > FLAG_POINTS,
                                 **({"up_bytes": sub.loc[(m, d), "up_bytes"], "down_bytes": sub.loc[(m, d), "down_bytes"]}
                                    if comm else {})})
            if "fedavg" in our_avg:
                pd_ = f"{paper_avg[m] - paper_avg['fedavg']:+.2f}" if m in paper_avg and "fedavg" in paper_avg else "–"
                cells.append(f"{our_avg[m] - our_avg['fedavg']:+.2f} ({pd_})")
            else:
                cells.append("–")
            cells.append(f"{order.index(m) + 1} ({paper_order.index(m) + 1 if m in paper_order else '–'})")
            if comm:
                cells += [f"{sub.loc[(m, 'AVG'), k] / MB:.3f}" for k in ("up_bytes", "down_bytes")]
            cells.append("⚠" if flag else "")
            body.append(cells)
        for label, ms in (("not run", not_run), ("not implemented", spec.not_implemented)):  # the paper's row only
            for m in ms:
                pv = refs[m] or {}
                body.append([f"{m} ({label})", *("not run" if d not in kept else f"– ({pv[d]:.2f})" if d in pv else "–"
                                                 for d in doms),
                             f"– ({pv['AVG']:.2f})" if "AVG" in pv else "–", "–", "–", *(["–", "–"] if comm else []), ""])
        lines += [f"## {ds}" + (f" (without {', '.join(dropped[ds])}; compared on the remaining domains)" if ds in dropped else ""), "",
                  setting, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
        if not_run:
            lines += ["", f"Not run yet: {', '.join(not_run)} ({NOT_RUN_WHY.get(ds, 'run its sweep to fill them')})."]
        if flagged:
            lines += ["", f"Cells more than {FLAG_POINTS:g} points from the paper, and what we know of why:", ""]
            sizes = json.loads((Path(next(c for c in runs if c.dataset == ds).out) / "config.json").read_text())["test_sizes"]
            lines += [f"- {m}, {d} ({diff:+.2f}): "
                      + gap_note(table, ds, m, d, diff, std, n_seeds, len(spec.seeds_for(profile)), sizes.get(d))
                      for m, d, diff, std, n_seeds in flagged]
        only_avg = {m: ref[m][ds]["AVG"] for m in methods if refs[m] is None and ds in ref.get(m, {})}
        if only_avg:  # the paper's AVG is over all of the dataset's domains: not compared with fewer
            lines += ["", "The paper gives only an AVG over all of its domains here (" + ", ".join(
                f"{m} {v:.2f}" for m, v in only_avg.items()) + "); not compared with an AVG over fewer domains."]
        if spec.prototypes_received:
            lines += ["", "Prototypes each client receives per round (mean over the rounds that send them and over "
                      "seeds; the paper's Table 4 beside it):", "", "| method | prototypes received | paper |", "|---|---|---|"]
            for m in methods:
                got = [prototypes_received(Path(c.out)) for c in runs if c.dataset == ds and c.method == m]
                pv = paper.FEDPLVM_TABLE4_PROTOTYPES.get(m)
                lines.append(f"| {m} | {np.mean(got):.2f} | {'–' if pv is None else f'{pv:.2f}'} |")
        if table == "3" and ds == "office_caltech" and {"fpl_cpcl_only", "fpl_cpcl_global"} <= set(our_avg):
            gap = our_avg["fpl_cpcl_only"] - our_avg["fpl_cpcl_global"]
            lines += ["", f"Fig. 5 (CPCL only, cluster minus global prototypes, AVG): ours {gap:+.2f}, "
                      f"paper {paper.FIG5_CLUSTER_MINUS_GLOBAL_AVG:+.2f}."]
        lines.append("")
    fig_dir = results_dir / "figures" / name
    figs = table_figures(table, [Path(c.out) for c in runs], fig_dir, f"{spec.title}, {profile} profile")
    rel = f"figures/{name}"
    lines += [f"Figures: accuracy over rounds per method, mean over seeds with a ± std band ([SVG]({rel}/curves.svg)); "
              f"per-domain accuracy ({METRICS[spec.metric]}) beside the paper's ([SVG]({rel}/bars.svg)).", "",
              f"![accuracy over rounds]({rel}/curves.png)", "", f"![per-domain accuracy beside the paper]({rel}/bars.png)", ""]
    lines += [RUNS_LINE + ", ".join(sorted({c.run_name for c in runs})), ""]
    provs = [json.loads((Path(c.out) / "config.json").read_text()).get("provenance") for c in runs]
    lines += [f"Code: commit {' | '.join(sorted({commit_label(p) for p in provs}))}. "
              f"Hardware: {' | '.join(sorted({hardware_label(p) for p in provs}))}.", ""]
    results_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(results_dir / f"{name}.md", "\n".join(lines))
    df = pd.DataFrame(csv_rows)
    atomic_write(results_dir / f"{name}.csv", df.to_csv(index=False))
    log_wandb(table, profile, df, figs)
    return df


def log_wandb(table: str, profile: str, df: pd.DataFrame, figs: dict) -> None:
    """The sweep's report run in the sweep's group: the report as a table, a line chart of AVG per round per
    method for each dataset, and the figures."""
    mode = wandb_mode()
    if mode == "disabled":
        return
    import wandb

    name = report_name(table)
    run = wandb.init(project="fedproto-bench", group=f"{name}-{profile}", name=f"{name}-{profile}-report",
                     mode=mode, job_type="report", reinit="create_new")
    curves = figs["curves"][figs["curves"].domain == "AVG"]
    charts = {}
    for ds, sub in curves.groupby("dataset", sort=False):
        lines = {m: g.sort_values("round") for m, g in sub.groupby("method", sort=False)}
        charts[f"avg_per_round/{ds}"] = wandb.plot.line_series(
            xs=[g["round"].tolist() for g in lines.values()], ys=[g["mean"].tolist() for g in lines.values()],
            keys=list(lines), title=f"{ds}: AVG accuracy per round (mean over seeds)", xname="round")
    images = {f"figures/{p.stem}": wandb.Image(str(p)) for p in figs["files"] if p.suffix == ".png"}
    run.log({name: wandb.Table(dataframe=df), **charts, **images})
    run.finish()


def prototypes_received(run_dir: Path) -> float:
    """A run's prototypes per client per round, over the rounds whose clients received some (round 0: none)."""
    counts = [r["prototypes_received"] for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("prototypes_received")]
    return float(np.mean(counts)) if counts else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m ray_jobs.sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", required=True, choices=sorted([*TABLES, *GROUPS]),
                    help="a table, or a group of tables swept together: " + "; ".join(f"{g} = {', '.join(t)}" for g, t in GROUPS.items()))
    ap.add_argument("--profile", default="full", choices=sorted(PROFILES))
    ap.add_argument("--domains", default=None, help="comma-separated domains to use (others are left out)")
    ap.add_argument("--methods", default=None, help="comma-separated: run only these of the table's methods "
                    "(the report covers every run of the table that is complete)")
    ap.add_argument("--seeds", default=None, help="comma-separated: run only these of the table's seeds")
    ap.add_argument("--datasets", default=None, help="comma-separated: run only the table's runs on these datasets")
    ap.add_argument("--results-dir", default=None, help="default results/ (full) or results/smoke/ (smoke)")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: write the report from the table's complete runs (those missing say so)")
    ap.add_argument("--parallel", type=int, default=None,
                    help="runs at once (default: Ray, as many as the cluster fits; local, 1 without a GPU and "
                         f"{GPU_PARALLEL} on one)")
    ap.add_argument("--executor", default="ray", choices=["ray", "local"],
                    help="local: no Ray (not imported); one run in this process, or --parallel N worker processes")
    ap.add_argument("--engine", default="auto", help="client training engine of every run: auto, sequential or fused")
    ap.add_argument("--precision", default="32-true",
                    help="32-true (as the references) or bf16-mixed; part of each run's protocol (a run at another precision is run again)")
    ap.add_argument("--eval-every", type=int, default=None,
                    help="test every run after every K-th round and the last 5 (default: the table's full-profile "
                         "schedule, every round at the smoke profile); not part of a run's protocol")
    ap.add_argument("--checkpoint-every", type=int, default=1,
                    help="rounds between each run's checkpoints (a resume redoes at most N-1 rounds)")
    ap.add_argument("--actor-restarts", type=int, default=3,
                    help="restarts of one client actor before its run stops; 0: a run's actors send their clients' "
                         "states only for its checkpoints, not every round (README, Reliability)")
    ap.add_argument("--gpus-per-actor", type=float, default=0.0,
                    help="Ray: each run's client actors' GPU share (fractions share a GPU: 0.1 puts several runs on "
                         "one); not part of a run's protocol")
    ap.add_argument("--driver-gpus", type=float, default=0.0, help="Ray: each run's driver's GPU share (it evaluates)")
    args = ap.parse_args(argv)
    results_dir = Path(args.results_dir or ("results" if args.profile == "full" else "results/smoke"))
    extra = {"executor": args.executor, "engine": args.engine, "precision": args.precision,
             "checkpoint_every": args.checkpoint_every, "actor_restarts": args.actor_restarts,
             "gpus_per_actor": args.gpus_per_actor, "driver_gpus": args.driver_gpus,
             **({} if args.eval_every is None else {"eval_every": args.eval_every})}
    tables = GROUPS.get(args.table, (args.table,))
    try:
        runs = {t: plan(t, args.profile, args.domains.split(",") if args.domains else None, results_dir,
                        args.data_root, extra) for t in tables}
        methods = args.methods.split(",") if args.methods else None
        try:
            seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
        except ValueError:
            raise ConfigError(f"--seeds takes comma-separated integers (got {args.seeds!r}).") from None
        datasets = args.datasets.split(",") if args.datasets else None
        chosen = {t: select(t, args.profile, runs[t], methods, seeds, datasets) for t in tables}
        for t in tables if not args.report_only else ():
            check_data(chosen[t], t)
        if not args.report_only:
            execute(list({c.out: c for t in tables for c in chosen[t]}.values()), args.parallel)  # a shared run once
        dfs = {}
        for t in tables:
            if t == "fedproto":  # per n and inference rule, beside the paper's Table 1 (ray_jobs.table_fedproto)
                dfs[t], figs = table_fedproto.report(args.profile, runs[t], results_dir)
                log_wandb(t, args.profile, dfs[t], figs)
            else:
                dfs[t] = report(t, args.profile, runs[t], results_dir)
    except (ConfigError, DataError, RunError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for t in tables:
        name = report_name(t)
        print((results_dir / f"{name}.md").read_text())
        print(f"report: {results_dir / f'{name}.md'} and .csv ({len(dfs[t])} cells); "
              f"figures: {results_dir / 'figures' / name}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
