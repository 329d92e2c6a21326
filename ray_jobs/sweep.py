"""`make table1|table2|table3|table-fedapc|table-all|...`: a table's sweep through Ray, resumable, then a report
beside the paper.

    python -m ray_jobs.sweep --table 2 [--profile full|smoke] [--domains mnist,usps,syn]
    python -m ray_jobs.sweep --table fedproto [--profile full|smoke]   # FedProto's Table 1, its own report
    python -m ray_jobs.sweep --table fedapc    # FedAPC's Tables I and II under its 8-client protocol
    python -m ray_jobs.sweep --table all       # every registered method (not the ablation variants), FPL's protocol
    python -m ray_jobs.sweep --table 2 --methods fedavg,fpl --seeds 0 --datasets digits   # part of a table

The tables (their runs as method x preset, the paper's numbers, the metric, the seeds)
are data in `ray_jobs.tables`; `ray_jobs.plan` makes their runs, `ray_jobs.report` their reports.
A run whose complete summary.json exists is not run again, so an interrupted
sweep continues where it stopped. Runs go to Ray concurrently as far as the
cluster's resources allow (RAY_ADDRESS for a cluster, else a local instance).
The `smoke` profile runs the same code paths with tiny settings; its reports go
to results/smoke/ and say so in their titles, never over a full-profile report.
"""
from __future__ import annotations

import argparse
import math
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

from benchmark.data import DataError
from benchmark.protocols import ConfigError
from benchmark.results import run_complete
from ray_jobs import report_fedproto
from ray_jobs.config import RunConfig
from ray_jobs.plan import check_data, plan, select
from ray_jobs.progress import SweepProgress
from ray_jobs.report import log_wandb, report
from ray_jobs.run import OneLineParser, RunError, gpus_needed, init_ray, run, run_gpu_shares
from ray_jobs.tables import GROUPS, PROFILES, TABLES, report_name


def execute(runs: list[RunConfig], parallel: int | None) -> list[str]:
    """Run what is not complete yet, concurrently where resources allow; returns the names run."""
    todo = [c for c in runs if not run_complete(c)]
    print(f"{len(runs) - len(todo)} of {len(runs)} runs already complete; running {len(todo)}", flush=True)
    if not todo:
        return []
    if todo[0].executor == "ray":
        # as many runs at once as fit whole (a run holds its driver and all its actors for its whole life,
        # so runs that only partly fit could wait on each other forever)
        c, have = todo[0], init_ray(todo[0]).cluster_resources()
        fit = math.floor(have.get("CPU", 0) / (c.driver_cpus + c.num_actors * c.cpus_per_actor))
        shares = run_gpu_shares(c)
        while fit > 1 and gpus_needed(shares * fit) > have.get("GPU", 0):  # runs packed together on the GPUs
            fit -= 1
        parallel = min(parallel or fit, max(1, fit))
    parallel = 1 if todo[0].executor == "local" else parallel
    progress = SweepProgress(len(todo))

    def one(cfg: RunConfig):
        progress.started(cfg.run_name)
        try:
            summary = run(cfg, quiet=True, resume=True,  # an interrupted run continues from its last round
                          resume_hint="run the same sweep command again (it resumes its interrupted runs)")
        except Exception as e:
            progress.failed_run(cfg.run_name, str(e) or repr(e))
            raise
        progress.finished(cfg.run_name, summary)

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = [pool.submit(one, c) for c in todo]
    failed = [(c, f.exception()) for c, f in zip(todo, futures) if f.exception()]
    elapsed = progress.close()
    print(f"sweep: {len(todo) - len(failed)} runs done, {len(failed)} failed, {len(runs) - len(todo)} already complete "
          f"({tqdm.format_interval(elapsed)})", flush=True)
    if failed:
        raise RunError(f"{len(failed)} of {len(todo)} runs failed, no report written: "
                       + "; ".join(f"{c.run_name} ({e})" for c, e in failed)
                       + ". Their folders hold error.txt; run the sweep again to retry them.")
    return [c.run_name for c in todo]


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
    ap.add_argument("--parallel", type=int, default=None, help="runs at once (default: as many as the cluster fits)")
    ap.add_argument("--executor", default="ray", choices=["ray", "local"],
                    help="local: every run in this process, one after another (Ray is not imported)")
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
                         "states only for its checkpoints, not every round (docs/reliability.md)")
    args = ap.parse_args(argv)
    results_dir = Path(args.results_dir or ("results" if args.profile == "full" else "results/smoke"))
    extra = {"executor": args.executor, "engine": args.engine, "precision": args.precision,
             "checkpoint_every": args.checkpoint_every, "actor_restarts": args.actor_restarts,
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
            if t == "fedproto":  # per n and inference rule, beside the paper's Table 1 (ray_jobs.report_fedproto)
                dfs[t], figs = report_fedproto.report(args.profile, runs[t], results_dir)
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
