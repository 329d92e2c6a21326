"""`make demo`: FedAvg vs FPL on Office-Caltech-10 through Ray on the CPU, real data, about 10 minutes here.

A short version of the paper's Office-Caltech protocol (all 10 clients with
their full 20% shares and the full test sets, but 6 rounds of 5 local epochs
instead of 100 of 10), ending with a per-domain accuracy table, the accuracy
curves and the t-SNE feature maps of both final models (results/figures/demo/).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from benchmark.figures import DEMO_RUNS, demo_figures
from ray_jobs.cli import OneLineParser
from ray_jobs.config import RunConfig
from ray_jobs.run import DEFAULT_OUT, RunError, run

FIGURES = Path("results/figures/demo")
DEMO = dict(dataset="office_caltech", rounds=6, local_epochs=5, seed=0, num_actors=2, cpus_per_actor=1)


def main(argv: list[str] | None = None) -> int:
    OneLineParser(prog="python -m ray_jobs.demo", description=__doc__.split("\n\n")[0] + (
        f" Takes no options; writes {DEFAULT_OUT}/demo-fedavg-office_caltech, demo-fpl-office_caltech and "
        f"{FIGURES}/ (replacing an earlier demo's).")).parse_args(argv)  # --help, or one line for an option
    rows = {}
    for method, name in zip(("fedavg", "fpl"), DEMO_RUNS):
        cfg = RunConfig(method=method, name=name, wandb_group="demo", **DEMO)
        try:
            summary = run(cfg)
        except RunError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        rows[method] = summary["last5"]
    table = pd.DataFrame(rows).T
    print(f"\nOffice-Caltech-10, {DEMO['rounds']} rounds x {DEMO['local_epochs']} local epochs (paper: 100 x 10); "
          "accuracy (%) of the global model, mean of the last 5 rounds")
    print(table.to_string(float_format=lambda v: f"{v:6.2f}"))
    print(f"run folders: {DEFAULT_OUT}/demo-fedavg-office_caltech, {DEFAULT_OUT}/demo-fpl-office_caltech")
    figures = demo_figures([DEFAULT_OUT / n for n in DEMO_RUNS], FIGURES)
    print(f"figures: {', '.join(map(str, figures))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
