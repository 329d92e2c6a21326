"""One table of cells per paper table, built once from its run folders, with every verdict computed over it; the
reports (`ray_jobs.report`, `ray_jobs.report_fedproto`, `ray_jobs.report_grid`), docs/results.md and the README's
Results (`ray_jobs.results_table`) render it.

- `seed_rows`: the tidy frame, one row per (table, dataset, method, domain, seed): our value, the paper's value, the
  runs its mean is over and the independent seeds those are (`Table.paper_runs`, `paper_seeds`), the cell's margin
  (`Table.margin`), its endpoint (each method's AVG per dataset primary, its domains secondary), the run's preset,
  folder, test set, wall time and hardware. Each report writes it beside itself (results/table<N>-seeds.csv): every
  number behind a verdict, one `pandas.read_csv` away.
- `benchmark.verdicts.cell_frame` over it: a row per cell (the report's .csv).
- `claim_frame`: a row per claim, paired seed by seed over the AVG rows both have (results/table<N>-claims.csv).
- `plan_frame`: the runs that would decide the inconclusive primary cells and the undecided claims, in the order that
  decides the most of them per run, with their measured cost (results/table<N>-plan.csv).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from benchmark import paper
from benchmark.data import DATASETS
from benchmark.results import read_summary, run_complete
from benchmark.verdicts import CELL_KEYS, MIN_PAIRS, cell_frame, claim_verdict, pooled_pairs
from ray_jobs.config import RunConfig
from ray_jobs.run import RunError
from ray_jobs.tables import TABLES, Claim, Table, claim_gap

ON = ("GPU", "CPU")  # the hardware a run's cost is measured on


def hardware(config: dict) -> str:
    """GPU where a run's driver or an actor had a GPU (its config.json's provenance), else CPU."""
    prov = config.get("provenance") or {}
    return "GPU" if any(p.get("gpu") for p in [prov.get("driver") or {}, *(prov.get("actors") or [])]) else "CPU"


def kept_domains(every: list[RunConfig]) -> dict[str, list[str]]:
    """dataset -> the domains its planned runs run (those of `DATASETS` not dropped for want of data)."""
    dropped = {c.dataset: c.dropped_domains for c in every if c.dropped_domains}
    return {ds: [d for d in DATASETS[ds] if d not in dropped.get(ds, [])]
            for ds in dict.fromkeys(c.dataset for c in every)}


def seed_rows(table: str, every: list[RunConfig]) -> pd.DataFrame:
    """The tidy frame of the table's complete runs among `every` (its plan): one row per dataset, method, domain
    (and "AVG", over the domains run) and seed, the paper's value (NaN where it has none on the domains run)."""
    spec = TABLES[table]
    kept = kept_domains(every)
    rows = []
    for cfg in (c for c in every if run_complete(c)):
        out = Path(cfg.out)
        s, config = read_summary(out), json.loads((out / "config.json").read_text())
        if s[spec.metric] is None:  # a run made for a table that reads the final round only (eval_last 1)
            raise RunError(f"{cfg.out}: its summary has no {spec.metric} (its run tested the final round only, for a "
                           f"table that reads that); delete its summary.json and sweep again to run it for this table.")
        doms = list(DATASETS[cfg.dataset])
        ref = paper.reference(spec.paper, cfg.method, cfg.dataset, kept[cfg.dataset], doms) or {}
        stds = spec.paper_std.get(cfg.method, {}).get(cfg.dataset, {}) if spec.paper_std_is_seed_spread else {}
        comm = s.get("communication", {}).get("per_client_per_round", {})
        for dom, acc in s[spec.metric].items():
            size = config.get("test_sizes", {}).get(dom)
            rows.append({"table": table, "dataset": cfg.dataset, "method": cfg.method, "domain": dom,
                         "seed": cfg.seed, "value": acc, "paper": ref.get(dom, math.nan),
                         "paper_runs": spec.paper_runs, "paper_seeds": spec.paper_seeds or 1,
                         "paper_std": stds.get(dom, math.nan) if dom != "AVG" or kept[cfg.dataset] == doms
                         else math.nan,
                         "margin": spec.margin.avg if dom == "AVG" else spec.margin.domain(size),
                         "endpoint": "primary" if dom == "AVG" else "secondary", "test_size": size,
                         "preset": cfg.preset, "run": out.name, "wall_time_s": s.get("wall_time_s"),
                         "hardware": hardware(config), "up_bytes": comm.get("up_bytes", math.nan),
                         "down_bytes": comm.get("down_bytes", math.nan)})
    return pd.DataFrame(rows)


def with_runs(cells: pd.DataFrame, seeds: pd.DataFrame) -> pd.DataFrame:
    """`cells` with each one's runs (their folders, joined): two tables' cells with the same runs and paper value are
    one cell, counted once across tables."""
    runs = seeds.groupby(CELL_KEYS, sort=False).run.agg(lambda r: ";".join(sorted(r))).rename("runs")
    return cells.join(runs, on=CELL_KEYS)


def claim_paper_gap(spec: Table, claim: Claim, kept: list[str], doms: list[str]) -> float:
    """The paper's gap of a claim: its own number where it gives one (Fig. 5), else the minuend's AVG minus the
    subtrahend's over the domains run (`paper.reference`), or, where it gives only an AVG, its gap on its own AVGs
    (`claim_gap`, the one the table's margin is ranked by)."""
    if claim.paper is None:
        refs = [paper.reference(spec.paper, m, claim.dataset, kept, doms) for m in (claim.minuend, claim.subtrahend)]
        if all(refs):
            return refs[0]["AVG"] - refs[1]["AVG"]
    return claim_gap(spec.paper, claim)


def claim_frame(table: str, items: list[tuple[Claim, float | None, dict[int, float], dict[int, float]]]
                ) -> pd.DataFrame:
    """A row per claim of `items` (the claim, the paper's gap (None: in words), the minuend's and the subtrahend's
    seed -> value): its verdict over the seeds both have; the pairs an undecided one needs, from the paired
    differences' spread pooled over the claims of its dataset that have 2 or more pairs."""
    margin = TABLES[table].margin
    diffs = [[a[s] - b[s] for s in sorted(set(a) & set(b))] for _, _, a, b in items]
    pooled = {ds: pooled_pairs([d for (c, *_), d in zip(items, diffs) if c.dataset == ds])
              for ds in dict.fromkeys(c.dataset for c, *_ in items)}
    rows = []
    for (c, gap, a, b), d in zip(items, diffs):
        v = claim_verdict(d, gap, c.kind, None if margin is None else margin.avg, pooled[c.dataset])
        rows.append({"table": table, "label": c.label, "what": c.what, "dataset": c.dataset, "kind": c.kind,
                     "minuend": c.minuend, "subtrahend": c.subtrahend, "minuend_value": c.minuend_value,
                     "subtrahend_value": c.subtrahend_value, "words": c.words, "paper_gap": gap,
                     "margin": None if margin is None else margin.avg, "pairs": v.pairs,
                     "seeds": " ".join(str(s) for s in sorted(set(a) & set(b))), "mean": v.mean,
                     "ci95_low": None if v.ci95 is None else v.ci95[0],
                     "ci95_high": None if v.ci95 is None else v.ci95[1], "p": v.p, "bound": v.bound,
                     "direction": v.direction,
                     "size": v.size, "pairs_needed": v.needed, "needed_why": v.needed_why,
                     "spread": pooled[c.dataset].std, "spread_df": pooled[c.dataset].df})
    return pd.DataFrame(rows, columns=None if rows else ["table", "dataset", "direction", "size"])


@dataclass
class TableData:
    """A table's tidy seed rows, its cells with their verdicts and its claims with theirs."""
    table: str
    seeds: pd.DataFrame
    cells: pd.DataFrame
    claims: pd.DataFrame

    def counts(self) -> dict[str, int]:
        """How many primary (and secondary) cells are equivalent, differ (beyond the margin), are inconclusive; how
        many claims' direction holds (is reversed or fails, is undecided), and whose size is reproduced."""
        return counts(self.cells, self.claims)


def counts(cells: pd.DataFrame, claims: pd.DataFrame) -> dict[str, int]:
    """`TableData.counts` of any cells and claims (the README's: every table's, a shared cell once)."""
    out = {}
    compared = cells[cells.compared] if len(cells) else cells
    for endpoint in ("primary", "secondary"):
        got = compared[compared.endpoint == endpoint] if len(compared) else compared
        for v in ("equivalent", "differs", "inconclusive"):
            out[f"{endpoint}_{v}"] = int((got.verdict == v).sum()) if len(got) else 0
        out[f"{endpoint}_beyond"] = int(got.beyond.sum()) if len(got) else 0
        out[f"{endpoint}_cells"] = len(got)
    for d in ("holds", "reversed", "fails", "undecided"):
        out[f"claims_{d}"] = int((claims.direction == d).sum()) if len(claims) else 0
    out["claims_size_reproduced"] = int((claims["size"] == "reproduced").sum()) if len(claims) else 0
    out["claims_size_differs"] = int((claims["size"] == "differs").sum()) if len(claims) else 0
    out["claims"] = len(claims)
    return out


def avg_by_seed(seeds: pd.DataFrame, dataset: str, method: str) -> dict[int, float]:
    rows = seeds[(seeds.dataset == dataset) & (seeds.method == method) & (seeds.domain == "AVG")]
    return dict(zip(rows.seed, rows.value))


def build(table: str, every: list[RunConfig]) -> TableData:
    """The table's data from its plan `every` (those complete): seed rows, cells, claims on the datasets planned."""
    spec = TABLES[table]
    seeds = seed_rows(table, every)
    kept = kept_domains(every)
    cells = with_runs(cell_frame(seeds), seeds) if len(seeds) else pd.DataFrame()
    items = [(c, claim_paper_gap(spec, c, kept[c.dataset], list(DATASETS[c.dataset])),
              avg_by_seed(seeds, c.dataset, c.minuend), avg_by_seed(seeds, c.dataset, c.subtrahend))
             for c in spec.claims if c.dataset in kept] if len(seeds) else []
    return TableData(table, seeds, cells, claim_frame(table, items))


def next_seeds(have: dict[tuple[str, str], set[int]], units: list[tuple[str, str]], seeds: int) -> set[tuple]:
    """The runs (preset, method, seed) that give every unit (preset, method) of `units` seeds 0 to `seeds` - 1."""
    return {(*u, s) for s in range(seeds) for u in units if s not in have.get(u, set())}


def costs(seeds: pd.DataFrame) -> Callable[[tuple[str, str], str], tuple[float, str]]:
    """(preset, method), hardware -> (seconds a run, how known): the median wall time of its complete runs on that
    hardware, else an estimate (the median of its preset's other methods there), else NaN (not measured)."""
    runs = seeds.drop_duplicates("run") if len(seeds) else pd.DataFrame(
        columns=["preset", "method", "hardware", "wall_time_s"])
    own = runs.groupby(["preset", "method", "hardware"]).wall_time_s.median()
    preset = runs.groupby(["preset", "hardware"]).wall_time_s.median()

    def cost(unit: tuple[str, str], hw: str) -> tuple[float, str]:
        if (*unit, hw) in own.index:
            return float(own[(*unit, hw)]), "measured"
        if (unit[0], hw) in preset.index:
            return float(preset[(unit[0], hw)]), "estimate: the preset's other methods"
        return math.nan, "not measured"
    return cost


def plan_frame(data: TableData, every: list[RunConfig],
               units: Callable[[str, str, str], list[tuple[str, str]]] | None = None,
               not_run: list[tuple[str, str]] | None = None) -> pd.DataFrame:
    """The runs that would decide the table's inconclusive primary cells (the seeds `seeds_needed` names, or the
    table's seeds, at least `MIN_PAIRS`, where there is no spread yet), its rows `not_run` that the paper has an AVG
    for (default: those of its plan `every` with no complete run), and its undecided claims (the pairs they need),
    in the order that decides the most of them per run (greedy: first the target whose missing runs complete the
    most targets per run), each run with its cost on a GPU and on a CPU (`costs`). Targets none would decide are
    left out (their cells say so). `units(dataset, method, domain)`: the (preset, method) runs a cell ("AVG": a
    claim's row) is made of (default: its dataset's preset in `every`)."""
    spec, seeds, cells, claims = TABLES[data.table], data.seeds, data.cells, data.claims
    have: dict[tuple[str, str], set[int]] = {}
    for (pr, m), g in (seeds.groupby(["preset", "method"]) if len(seeds) else ()):
        have[(pr, m)] = set(g.seed)
    planned_units = {}
    for c in every:
        planned_units.setdefault((c.dataset, c.method), {})[(c.preset, c.method)] = None
    units = units or (lambda ds, m, dom: list(planned_units.get((ds, m), {})))
    if not_run is None:
        done = set(zip(seeds.dataset, seeds.method)) if len(seeds) else set()
        not_run = [u for u in planned_units if u not in done and spec.paper.get(u[1], {}).get(u[0], {}).get("AVG")]
    targets = []  # (what it decides, the runs it needs)
    primary = cells[(cells.endpoint == "primary") & cells.compared & (cells.verdict == "inconclusive")] \
        if len(cells) else cells
    for r in primary.itertuples():
        if pd.notna(r.seeds_needed) or r.needed_why.startswith("no spread"):
            n = int(r.seeds_needed) if pd.notna(r.seeds_needed) else max(MIN_PAIRS, len(spec.seeds))
            targets.append((f"{r.dataset} {r.method} {r.domain} ({n} seeds)",
                            next_seeds(have, units(r.dataset, r.method, r.domain), n)))
    for ds, m in not_run:
        n = max(MIN_PAIRS, len(spec.seeds))
        targets.append((f"{ds} {m} AVG (not run: {n} seeds)", next_seeds(have, units(ds, m, "AVG"), n)))
    for r in (claims[claims.direction == "undecided"].itertuples() if len(claims) else ()):
        if pd.notna(r.pairs_needed) or r.pairs < MIN_PAIRS:
            n = int(r.pairs_needed) if pd.notna(r.pairs_needed) else MIN_PAIRS
            targets.append((f"{r.label}: {r.what} on {r.dataset} ({n} pairs)", next_seeds(
                have, units(r.dataset, r.minuend, "AVG") + units(r.dataset, r.subtrahend, "AVG"), n)))
    targets = [t for t in targets if t[1]]
    cost, dataset_of = costs(seeds), {c.preset: c.dataset for c in every}
    rows, planned = [], set()

    def gain(target) -> tuple[float, int]:  # targets completed per new run, then the fewer runs
        new = target[1] - planned
        return sum(r <= planned | new for _, r in targets) / len(new), -len(new)

    while targets:
        new = sorted(max(targets, key=gain)[1] - planned)
        planned |= set(new)
        decided = [w for w, r in targets if r <= planned]
        targets = [t for t in targets if not t[1] <= planned]
        for i, (preset, method, seed) in enumerate(new):
            known = {hw: cost((preset, method), hw) for hw in ON}
            rows.append({"table": data.table, "order": len(rows) + 1, "dataset": dataset_of[preset], "preset": preset,
                         "method": method, "seed": seed, "decides": "; ".join(decided) if i == len(new) - 1 else "",
                         **{f"{hw.lower()}_s": known[hw][0] for hw in ON},
                         **{f"{hw.lower()}_cost": known[hw][1] for hw in ON}, "in_table_seeds": seed in spec.seeds,
                         "command": f"python -m ray_jobs.sweep --table {data.table} --datasets {dataset_of[preset]} "
                                    f"--methods {method} --seeds {seed}"})
    return pd.DataFrame(rows, columns=None if rows else ["table", "order", "dataset", "method", "seed", "decides"])
