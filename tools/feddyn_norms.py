"""FedDyn's weights round by round: the norms of the model the server evaluates (avg, the clients' mean), of its drift
(the mean of the clients' h_k) and of the model it sends (avg + drift), beside the round's mean client loss and test
accuracy (docs/deviations.md, 9). Every FedDyn run records the norms in its metrics.jsonl
(`server_norms`), so a run made, or running, with `python -m ray_jobs.run` is read, not made again:

    python tools/feddyn_norms.py --run results/runs/feddyn-office_caltech-default-max_grad_norm10-seed0 --csv n.csv

Without --run it makes a run with the entry point's flags (the method is FedDyn) in this process (`--executor
local`), tested after every round, with nothing written to results/: a shortened protocol, for example

    python tools/feddyn_norms.py --preset fpl-office --rounds 20 --local-epochs 2 --hp max_grad_norm=10
"""
from __future__ import annotations

import csv
import itertools
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmark.data import DataError, resolve_data_root  # noqa: E402
from benchmark.protocols import ConfigError  # noqa: E402
from benchmark.results import METRICS_ARCHIVE, read_jsonl  # noqa: E402
from lightning_modules.registry import HyperparameterError  # noqa: E402
from ray_jobs.run import build_parser, config_from_args, plan_run_clients  # noqa: E402

COLUMNS = ("round", "evaluated_norm", "drift_norm", "sent_norm", "client_loss", "accuracy")


class RunFolderError(ValueError):
    """--run names no folder with a FedDyn run's recorded norms; the message says why."""


def row(rec: dict) -> dict:
    """A round's row (COLUMNS) from its metrics record."""
    if "server_norms" not in rec:
        raise RunFolderError(f"round {rec['round']} records no server_norms: not a FedDyn run, or made before FedDyn "
                         "recorded them (2026-11-30); make it again, or run this tool without --run")
    n = rec["server_norms"]
    return {"round": rec["round"], "evaluated_norm": n["evaluated"], "drift_norm": n["drift"], "sent_norm": n["sent"],
            "client_loss": rec["train_loss"], "accuracy": rec["accuracy"]["AVG"] if rec["evaluated"] else math.nan}


def recorded(run_dir: Path) -> list[dict]:
    """The rows of a run folder's rounds so far (metrics.jsonl, or the committed metrics.jsonl.gz)."""
    if not (run_dir / "metrics.jsonl").exists() and not (run_dir / METRICS_ARCHIVE).exists():
        raise RunFolderError(f"{run_dir} has no metrics.jsonl: give a run folder (results/runs/<run name>)")
    return [row(rec) for rec in read_jsonl(run_dir / "metrics.jsonl")]


def rounds(cfg):
    """Yield each round's row (COLUMNS) of a FedDyn run made in this process."""
    from ray_jobs.driver import Driver

    root = resolve_data_root(cfg.data_root)
    driver = Driver(cfg, plan_run_clients(cfg, root), str(root))
    for r in range(cfg.rounds):
        yield row(driver.run_round(r))


def print_row(r: dict) -> None:
    print(" ".join(f"{r[c]:>14.2f}" if isinstance(r[c], float) else f"{r[c]:>14}" for c in COLUMNS), flush=True)


def main(argv=None) -> int:
    parser = build_parser()
    parser.description = __doc__
    parser.add_argument("--csv", type=Path, help="also write the rows to this CSV file")
    parser.add_argument("--run", type=Path, help="read the rows of this run folder instead of making a run")
    args = parser.parse_args(argv)
    args.method, args.executor, args.eval_every = "feddyn", "local", 1
    rows = []
    try:
        if args.run:
            made = recorded(args.run)
        else:
            cfg = config_from_args(args)
            torch.set_num_threads(max(1, int(cfg.cpus_per_actor)))
            made = rounds(cfg)
            made = itertools.chain([next(made)], made)  # its first round: a bad data root errs before the header
        print(" ".join(f"{c:>14}" for c in COLUMNS), flush=True)
        for r in made:
            rows.append(r)
            print_row(r)
    except (ConfigError, HyperparameterError, DataError, RunFolderError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
