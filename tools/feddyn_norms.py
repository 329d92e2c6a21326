"""FedDyn's weights round by round: the norms of the model the server evaluates (avg, the clients' mean), of its drift
(the mean of the clients' h_k) and of the model it sends (avg + drift), beside the round's mean client loss and test
accuracy. A run's own code (`ray_jobs.run`'s flags, its driver and client groups in this process), with nothing
written to results/: only the table below, and the rows as CSV with --csv (docs/fpl.md, FedDyn's stability).

    python tools/feddyn_norms.py --preset fpl-office --rounds 20 --local-epochs 2 --csv norms.csv
    python tools/feddyn_norms.py --preset fpl-office --rounds 20 --local-epochs 2 --hp max_grad_norm=10

Every flag of `python -m ray_jobs.run` is taken (the method is FedDyn); the run is always in process (`--executor
local`) and tests the evaluated model after every round, not only the table's rounds.
"""
from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmark.data import DataError, resolve_data_root  # noqa: E402
from benchmark.protocols import ConfigError  # noqa: E402
from lightning_modules.registry import HyperparameterError  # noqa: E402
from ray_jobs.run import build_parser, config_from_args, plan_run_clients  # noqa: E402

COLUMNS = ("round", "evaluated_norm", "drift_norm", "sent_norm", "client_loss", "accuracy")


def norm(state: dict, keys) -> float:
    """The L2 norm of the parameters `keys` of a state dict, all of them as one vector (float64)."""
    return math.sqrt(sum(float(state[k].double().pow(2).sum()) for k in keys))


def rounds(cfg):
    """Yield each round's row (COLUMNS) of a FedDyn run made in this process."""
    from ray_jobs.driver import Driver

    root = resolve_data_root(cfg.data_root)
    driver = Driver(cfg, plan_run_clients(cfg, root), str(root))
    keys = driver.rule.param_keys
    for r in range(cfg.rounds):
        rec = driver.run_round(r)
        rule = driver.rule
        yield {"round": r, "evaluated_norm": norm(rule.avg, keys), "drift_norm": norm(rule.drift, keys),
               "sent_norm": norm(driver.global_state, keys), "client_loss": rec["train_loss"],
               "accuracy": rec["accuracy"]["AVG"]}


def main(argv=None) -> int:
    parser = build_parser()
    parser.description = __doc__
    parser.add_argument("--csv", type=Path, help="also write the rows to this CSV file")
    args = parser.parse_args(argv)
    args.method, args.executor, args.eval_every = "feddyn", "local", 1
    rows = []
    try:
        cfg = config_from_args(args)
        torch.set_num_threads(max(1, int(cfg.cpus_per_actor)))
        print(" ".join(f"{c:>14}" for c in COLUMNS), flush=True)
        for row in rounds(cfg):
            rows.append(row)
            print(" ".join(f"{row[c]:>14.2f}" if isinstance(row[c], float) else f"{row[c]:>14}" for c in COLUMNS),
                  flush=True)
    except (ConfigError, HyperparameterError, DataError) as e:
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
