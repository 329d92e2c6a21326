"""The report of a hyperparameter grid table (FedPLVM's Figures 4 and 5): results/table<name>.md and .csv and the figure
of accuracy against the value (figures/table<name>/grid.png).

    python -m ray_jobs.sweep --table fedplvm_fig4a   # or the whole group: make table-fedplvm

The runs are the table's (method, preset) rows once per grid value (`ray_jobs.tables` `Table.grid`, planned as every
table's by `ray_jobs.plan`); a value equal to the method's default is its plain run, the one Tables 1 and 2 report.
The paper gives these figures as plots only: no numbers to compare, so the cells are ours alone, per method, value and
domain the mean ± std over seeds of the table's metric (FedPLVM's: the final round). What the paper says of them in
words is the table's claims (`Table.claims`: a row above another), each tested paired over the seeds both rows have
(`benchmark.verdicts.claim_verdict`, as every table's claims: `ray_jobs.cells.claim_frame`).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from benchmark.data import DATASETS
from benchmark.results import read_summary, run_complete
from benchmark.verdicts import ALPHA, MIN_PAIRS
from lightning_modules.registry import METHODS
from ray_jobs.config import RunConfig
from ray_jobs.figures import table_figures
from ray_jobs.cells import TableData, claim_frame
from ray_jobs.report import claim_lines, setting_line, write_report
from ray_jobs.run import RunError
from ray_jobs.tables import METRICS, TABLES, make_target, report_name


def grid_cell(mean: float, std: float, seeds: int, planned: int) -> str:
    """A grid cell: the mean ± std over seeds (no ± for one seed), "(n seeds)" where fewer ran than planned. Both
    first rounded to 6 places: the same runs summed in another order (the report's, the README's) differ in the last
    bits, enough to print 66.525 as 66.52 in one and 66.53 in the other."""
    seeds, mean, std = int(seeds), round(float(mean), 6), round(float(std), 6)
    return (f"{mean:.2f}" + ("" if np.isnan(std) else f" ± {std:.2f}")
            + ("" if seeds == planned else f" ({seeds} seed{'s' * (seeds > 1)})"))


def row_runs(table: str, profile: str, every: list[RunConfig], dataset: str, method: str,
             value: float | None) -> list[RunConfig]:
    """The planned runs of a grid's row on `dataset`: the method's at the grid `value`, or its plain run (None) even
    where the method is no row of the grid (Figure 5's FPL: its runs of Tables 1 and 2, planned here as there)."""
    spec = TABLES[table]
    hparam, _ = spec.grid
    mine = [c for c in every if c.dataset == dataset]
    if any(c.method == method for c in mine):
        value = METHODS[method].defaults[hparam] if value is None else value
        return [c for c in mine if c.method == method and c.hparams[hparam] == value]
    if value is not None:
        return []
    plain = []
    for c in {c.seed: c for c in mine}.values():
        cfg = RunConfig.from_preset(c.preset, method=method, seed=c.seed, domains=c.domains, data_root=c.data_root,
                                    wandb_group=c.wandb_group, **spec.overrides(profile))
        plain.append(dataclasses.replace(cfg, out=str(Path(c.out).parent / cfg.run_name)))
    return plain


def grid_verdicts(table: str, profile: str, every: list[RunConfig]) -> TableData:
    """The verdict of each of the grid's claims on the datasets it has runs of: the differences of the two rows' AVG
    (the table's metric) seed by seed over the seeds both have complete, against the paper's words (minuend
    above)."""
    spec, rows = TABLES[table], {}

    def avg(dataset: str, method: str, value: float | None) -> dict[int, float]:  # a row's, read once
        if (dataset, method, value) not in rows:
            rows[(dataset, method, value)] = {c.seed: read_summary(Path(c.out))[spec.metric]["AVG"] for c in
                                              row_runs(table, profile, every, dataset, method, value)
                                              if run_complete(c)}
        return rows[(dataset, method, value)]

    return TableData(table, pd.DataFrame(), pd.DataFrame(), claim_frame(
        table, [(c, None, avg(c.dataset, c.minuend, c.minuend_value), avg(c.dataset, c.subtrahend, c.subtrahend_value))
                for c in spec.claims if any(r.dataset == c.dataset for r in every)]))


def report(table: str, profile: str, runs: list[RunConfig], results_dir: Path) -> tuple[pd.DataFrame, dict]:
    """results_dir/table<name>.md and .csv, and the grid figure; returns the report's cells and the figures. Every
    planned (method, value) has a row; those without a complete run say "not run"."""
    spec = TABLES[table]
    hparam, _ = spec.grid
    name = report_name(table)
    every, runs = runs, [c for c in runs if run_complete(c)]
    if not runs:
        raise RunError(f"no complete run of table {table} to report; run its sweep first (make {make_target(table)}).")
    fig_dir = results_dir / "figures" / name
    figs = table_figures(table, [Path(c.out) for c in runs], fig_dir, f"{spec.title}, {profile} profile")
    data = figs["grid"].set_index(["dataset", "method", "value", "domain"])
    planned_seeds = len(spec.seeds_for(profile))
    title = f"# {spec.title}: reproduction ({profile} profile"
    title += ", SMOKE SETTINGS)" if profile == "smoke" else ")"
    if len(runs) < len(every):
        title += f" — PARTIAL: {len(runs)} of its {len(every)} runs"
    values = list(dict.fromkeys(c.hparams[hparam] for c in every))
    defaults = {m: METHODS[m].defaults[hparam] for m in dict.fromkeys(c.method for c in every)}
    lines = [title, "",
             f"Grid: {hparam} in {', '.join(f'{v:g}' for v in values)} (our choice, docs/deviations.md 38: the paper "
             f"shows this figure as a plot only, no numbers to compare); the default, "
             + ", ".join(f"{m} {v:g}" for m, v in defaults.items())
             + ", is the method's plain run, the one of Tables 1 and 2 (`fedplvm12`). Accuracy (%) of the global "
             f"model, {METRICS[spec.metric]}; mean ± std over seeds {list(spec.seeds_for(profile))}"
             + ("" if len(runs) == len(every) else ", (n seeds) where fewer ran") + ".", ""]
    ver = grid_verdicts(table, profile, every)
    if len(ver.claims):
        k = ver.counts()
        lines += [f"Claims: what the paper says of this figure in words, a row above another, each tested on the "
                  f"differences of the rows' AVG seed by seed over the seeds both have (a one-sided paired t-test at "
                  f"{ALPHA:.0%}, with {MIN_PAIRS} pairs or more; the paper gives no number, so no size, and no gap to "
                  f"plan more pairs against): {k['claims_holds']} holding, {k['claims_reversed']} reversed, "
                  f"{k['claims_undecided']} undecided.", ""]
    csv_rows = []
    for ds in dict.fromkeys(c.dataset for c in every):
        mine = [c for c in every if c.dataset == ds]
        kept = [d for d in DATASETS[ds] if d in mine[0].domains]
        avg = "AVG" if len(kept) == len(DATASETS[ds]) else f"AVG of {len(kept)}"
        lines += [f"## {ds}" + (f" (without {', '.join(mine[0].dropped_domains)})" if mine[0].dropped_domains else ""),
                  "", setting_line(mine[0], kept, [c for c in runs if c.dataset == ds]), "",
                  f"| method | {hparam} | " + " | ".join([*kept, avg]) + " |", "|" + "---|" * (len(kept) + 3)]
        for m in dict.fromkeys(c.method for c in mine):
            for v in dict.fromkeys(c.hparams[hparam] for c in mine if c.method == m):
                label = f"{v:g}" + (" (default)" if v == defaults[m] else "")
                if (ds, m, v, "AVG") not in data.index:
                    lines.append(f"| {m} | {label} | " + " | ".join(["not run"] * (len(kept) + 1)) + " |")
                    continue
                cells = []
                for d in [*kept, "AVG"]:
                    row = data.loc[(ds, m, v, d)]
                    std = None if np.isnan(row["std"]) else float(row["std"])
                    n = int(row["seeds"])
                    cells.append(grid_cell(row["mean"], row["std"], n, planned_seeds))
                    csv_rows.append({"table": table, "profile": profile, "dataset": ds, "method": m, "hparam": hparam,
                                     "value": v, "default": v == defaults[m], "domain": d if d != "AVG" else avg,
                                     "ours_mean": round(float(row["mean"]), 4),
                                     "ours_std": None if std is None else round(std, 4), "seeds": n})
                lines.append(f"| {m} | {label} | " + " | ".join(cells) + " |")
        lines += [*claim_lines(ver.claims, ds), ""]
    rel = f"figures/{name}"
    lines += [f"Figure: {METRICS[spec.metric]} against {hparam}, a line per method and domain (AVG thick), error bars "
              f"± std over seeds ([SVG]({rel}/grid.svg)).", "", f"![accuracy against {hparam}]({rel}/grid.png)", ""]
    return write_report(results_dir, name, lines, csv_rows, runs, {"claims": ver.claims}), figs
