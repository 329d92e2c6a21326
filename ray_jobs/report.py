"""A table's report beside the paper: results/table<N>.md and .csv, its figures and its W&B report run.

Per method and domain our mean ± std over seeds of the table's metric, the paper's value and the difference, the AVG,
the change against FedAvg beside the paper's, the rank order, rows not run, and for each cell more than 2 points from
the paper what we know of why (`gap_note`). FedProto's Tables 1 and 2 have their own report
(`ray_jobs.report_fedproto`).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from benchmark import paper
from benchmark.data import DATASETS, STAND_INS
from benchmark.provenance import commit_label, hardware_label
from benchmark.results import LAST_K, atomic_write, read_jsonl, read_summary, run_complete, wandb_mode
from ray_jobs.config import RunConfig
from ray_jobs.figures import runs_line, table_figures
from ray_jobs.plan import reading_run
from ray_jobs.run import RunError
from benchmark.verdicts import ALPHA, CELL_KEYS, MARKS, MARKS_LEGEND, MAX_SEEDS, MIN_PAIRS, POWER, paired_claim
from ray_jobs.cells import build, plan_frame
from ray_jobs.tables import DOMAIN_MARGIN_WHY, GAP_NOTES, METRICS, TABLES, Reading, Table, make_target, report_name

FLAG_POINTS = 2.0
MB = 1e6
# why a dataset's planned runs may be missing from a report, by (table, dataset), "*" for any table (estimates: see
# README's make-target table)
NOT_RUN_WHY = {
    ("*", "digits"): "FPL's Digits protocol is about 40 h a run on a 2-core CPU (an estimate): GPU work "
                     "(docs/running.md, GPU runbook)",
    ("fedapc", "digits"): "FedAPC's Digits protocol is about 20 h a run on a 2-core CPU (an estimate, docs/fedapc.md): "
                          "GPU work (docs/running.md, GPU runbook)",
}


def not_run_why(table: str, dataset: str) -> str:
    """Why `table`'s runs on `dataset` may be missing: its own reason, the dataset's, or the default."""
    return NOT_RUN_WHY.get((table, dataset)) or NOT_RUN_WHY.get(("*", dataset), "run its sweep to fill them")


def gap_note(table: str, dataset: str, method: str, domain: str, diff: float, std: float, seeds: int,
             planned_seeds: int, test_size: int | None) -> str:
    """What we know of why a cell is far from the paper: the notes of `GAP_NOTES` that can explain a gap on its side of
    the paper (most specific first; only those that explain the whole gap, where one does), our seed spread when the
    gap is within two of its standard deviations, fewer seeds than planned, a test set so small that one image moves
    the accuracy by a point or more; or that we do not know."""
    side = "below" if diff < 0 else "above"
    found = [n for key in ((table, dataset, method, domain), (table, dataset, "*", domain),
                           (table, dataset, method, "*"), (table, dataset, "*", "*"), ("*", dataset, method, domain),
                           ("*", dataset, "*", domain), ("*", dataset, method, "*"), ("*", dataset, "*", "*"))
             for n in [GAP_NOTES.get(key)] if n and n.side in ("any", side)]
    notes = [n.text for n in found if n.whole] or [n.text for n in found]
    if seeds > 1 and abs(diff) <= 2 * std:
        notes.append(f"within two standard deviations of our seeds (± {std:.2f})")
    if seeds < planned_seeds:
        notes.append(f"{seeds} of {planned_seeds} seeds run (a seed's spread here can exceed the gap)")
    if test_size and 100 / test_size >= 1:
        notes.append(f"its test set is {test_size} images (one image is {100 / test_size:.1f} points)")
    return "; ".join(dict.fromkeys(notes)) or "not known"


def schedule_words(every: int, last: int) -> str:
    """The rounds a run with `eval_every` `every` and `eval_last` `last` tests after, in words."""
    if every == 1:
        return "every round"
    final = last == 1
    if every == 0:
        return "the final round" if final else f"the last {last} rounds"
    nth = f"{every}{'th' if every % 100 in (11, 12, 13) else {1: 'st', 2: 'nd', 3: 'rd'}.get(every % 10, 'th')}"
    return f"every {nth} round and " + ("the final one" if final else f"the last {last}")


def setting_line(cfg: RunConfig, domains: list[str], done: list[RunConfig] = ()) -> str:
    """A report's line on a dataset's runs: their protocol, the evaluation schedule the complete runs `done` used
    (from their config.json), and which of `domains` (those run) are stand-ins for the paper's data."""
    configs = [json.loads((Path(c.out) / "config.json").read_text()) for c in done]
    schedules = sorted({(c.get("eval_every", 1), c.get("eval_last", LAST_K)) for c in configs})
    evaluated = " or ".join(schedule_words(every, last) for every, last in schedules)
    return (f"Preset {cfg.preset}: {cfg.rounds} rounds x {cfg.local_epochs} local epochs, batch {cfg.batch_size}, "
            f"lr {cfg.lr:g}, momentum {cfg.momentum:g}, client fraction {cfg.client_fraction:g}"
            + (f", test sets capped at {cfg.eval_max}" if cfg.eval_max else "")
            + (f", Dirichlet label skew alpha {cfg.dirichlet_alpha:g} (each client's drawn class counts in its run's "
               f"config.json), weights averaged by {'sample count' if cfg.aggregation == 'samples' else 'client'}"
               if cfg.dirichlet_alpha is not None else "")
            + (f"; tested after {evaluated}" if evaluated else "") + "."
            + "".join(f" {d}: {note}." for d, note in STAND_INS.get(cfg.dataset, {}).items() if d in domains))


def title(heading: str, profile: str, without: dict[str, list[str]], complete: int, planned: int) -> str:
    """A report's first line: its table and profile (smoke: not comparable to the paper), the domains its runs leave
    out (dataset -> domains, `RunConfig.dropped_domains`) and, where fewer than the `planned` runs are complete, how
    many are."""
    return (f"# {heading}: reproduction ({profile} profile"
            + (", SMOKE SETTINGS: not comparable to the paper)" if profile == "smoke" else ")")
            + (" — without " + ", ".join(f"{d} ({ds})" for ds, doms in without.items() for d in doms) if without
               else "")
            + (f" — PARTIAL: {complete} of its {planned} runs" if complete < planned else ""))


def summary_words(k: dict[str, int], margin: float | None) -> str:
    """A table's counts in words: its primary cells, its domain cells, its claims."""
    band = "" if margin is None else f" ±{margin:.2f}"
    out = []
    for endpoint, what, bh in (("primary", "primary cells (each method's AVG per dataset)",
                                ", Benjamini-Hochberg over them"), ("secondary", "domain cells", "")):
        if k[f"{endpoint}_cells"]:
            out.append(f"{what}: {k[f'{endpoint}_equivalent']} equivalent within{band or ' the margin'}, "
                       f"{k[f'{endpoint}_differs']} differ ({k[f'{endpoint}_beyond']} beyond{band}{bh}), "
                       f"{k[f'{endpoint}_inconclusive']} inconclusive")
    if k["claims"]:
        out.append(f"claims: direction {k['claims_holds']} holding, {k['claims_reversed'] + k['claims_fails']} "
                   f"reversed or failing, {k['claims_undecided']} undecided; size {k['claims_size_reproduced']} "
                   f"within our interval, {k['claims_size_differs']} outside it")
    return "; ".join(out) or "nothing compared"


def paper_words(spec: Table) -> str:
    """What the paper's mean is over and what stands for its per-seed spread, in words."""
    runs, seeds = spec.paper_runs, spec.paper_seeds
    over = ("runs it does not count (taken as one)" if not runs else f"{runs} run{'s' * (runs != 1)}" + (
        f" of {'one seed' if seeds == 1 else f'{seeds} seeds'}" if seeds != runs else ""))
    spread = ("its printed std (seed-to-seed spread)" if spec.paper_std_is_seed_spread else
              "our pooled seed spread (its printed std is not seed-to-seed spread)" if spec.paper_std else
              "our pooled seed spread (it prints none)")
    return (f"its standard error counts the paper's mean as over {over} (`benchmark/paper.py` SEEDS), for whose "
            f"per-seed spread stands {spread}")


def verdict_rule(spec: Table) -> str:
    """How a table's cells and claims are tested, in words."""
    m = spec.margin
    return (f"Verdicts (`benchmark/verdicts.py`) at the margin ±δ = ±{m.avg:.2f} points: {m.why}; "
            f"{DOMAIN_MARGIN_WHY}. A cell: d = our mean − the paper's; {paper_words(spec)}; our seed spread "
            "pooled over the table's methods per dataset and domain (where Bartlett's test finds no difference "
            f"between their variances at {ALPHA:.0%}, else each cell's own). ✓ equivalent: d's 90% interval inside "
            "±δ (two one-sided tests at 5%); ✗ differs: its 95% interval excludes 0 (a primary cell: Benjamini-"
            "Hochberg's q < 5% over the table's primary cells), ✗✗ beyond ±δ where that interval lies wholly outside "
            "the band; ? inconclusive otherwise. The floor: the half-width of d's 90% interval with unlimited seeds "
            "of ours (the paper's own runs); where it exceeds δ, no number of seeds can show equivalence at ±δ. An "
            f"inconclusive cell: the seeds with which equivalence at ±δ would show at {POWER:.0%} power if ours and "
            f"the paper's agreed, at most {MAX_SEEDS}. A claim (the paper's gap between two rows' AVG), paired over "
            f"the seeds both rows have ({MIN_PAIRS} or more, else undecided): its direction by a one-sided paired "
            "t-test at 5% (holds; reversed in the other direction), its size by the paper's gap inside our paired "
            "95% interval; a comparable claim by a paired TOST at ±δ.")


def cell_mark(r) -> str:
    """A compared cell's mark: ✓ equivalent, ✗ differs, ✗✗ beyond the margin, ? inconclusive."""
    return MARKS[r.verdict] * (2 if r.beyond else 1)


def mark_counts(marks: list[str]) -> str:
    """How many of each mark: "4 ? 1 ✗" ("–" for none)."""
    got = Counter(marks)
    return " ".join(f"{got[k]} {k}" for k in ("✓", "✗", "✗✗", "?") if got[k]) or "–"


def needed_words(r) -> str:
    """What an inconclusive cell needs, in words."""
    if pd.notna(r.seeds_needed):
        return (f"{int(r.seeds_needed)} seeds would show equivalence at ±δ ({POWER:.0%} power, if ours and the "
                "paper's agree)")
    if r.needed_why.startswith("none would"):
        return (f"none would: even unlimited seeds leave the TOST at ±{r.margin:.2f} short of {POWER:.0%} power (the "
                f"paper's floor ±{r.floor:.2f})")
    return r.needed_why


def p_words(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def cell_words(r) -> str:
    """A compared cell's verdict with its numbers."""
    if pd.isna(r.p):
        return "inconclusive: no seed spread to test with (a second seed first)"
    q = "" if pd.isna(r.q) else f", BH q {p_words(r.q)}"
    if r.verdict == "equivalent":
        return (f"equivalent: 90% CI {r.ci90_low:+.2f} to {r.ci90_high:+.2f} inside ±{r.margin:.2f} (TOST p "
                f"{p_words(r.p_tost)})")
    if r.verdict == "differs":
        return f"differs{f' beyond ±{r.margin:.2f}' if r.beyond else ''}: p {p_words(r.p)}{q}"
    return f"inconclusive: p {p_words(r.p)}{q}, TOST p {p_words(r.p_tost)}; {needed_words(r)}"


def spread_words(r) -> str:
    return "–" if r.spread_how == "none" else f"{r.spread:.2f} ({r.spread_how}, df {int(r.spread_df)})"


def pooling_line(cells: pd.DataFrame) -> str:
    """A dataset's seed spread per domain: pooled over its methods, or each cell's own where Bartlett rejects."""
    parts = []
    for d, g in cells.groupby("domain", sort=False):
        r = g.iloc[0]
        check = ("" if pd.isna(r.bartlett_p) else
                 f"; Bartlett p {p_words(r.bartlett_p)}, variance ratio {r.var_ratio:.1f}")
        if (g.spread_how == "pooled").any():
            parts.append(f"{d} {r.spread:.2f} pooled over {r.pooled_methods} methods (df {int(r.spread_df)}{check})")
        elif r.pooled_methods > 1:
            parts.append(f"{d}: variances differ{check}: each cell's own")
        else:
            parts.append(f"{d}: {'one cell with a spread: its own' if r.pooled_methods else 'no spread (1 seed each)'}")
    return "Our seed spread per domain: " + "; ".join(parts) + "."


def cell_verdict_lines(cells: pd.DataFrame, dataset: str) -> list[str]:
    """A dataset's compared cells, one row each: ours, the paper's, d with its 95% interval, the margin and floor,
    the spread, the verdict."""
    mine = cells[(cells.dataset == dataset)]
    compared = mine[mine.compared]
    if compared.empty:
        return []
    rows = [f"| {r.method} | {r.domain} | {r.mean:.2f} ({r.seeds} seed{'s' * (r.seeds > 1)}) | {r.paper:.2f} | "
            + ("–" if pd.isna(r.diff) else f"{r.diff:+.2f} ({r.ci95_low:+.2f} to {r.ci95_high:+.2f})")
            + f" | ±{r.margin:.2f} | "
            + ("–" if pd.isna(r.floor) else f"±{r.floor:.2f}" + (" > δ" if r.floor > r.margin else ""))
            + f" | {spread_words(r)} | {cell_words(r)} |" for r in compared.itertuples()]
    return ["", "Each compared cell's verdict (ours − paper with its 95% interval; the floor: the finest margin the "
                "paper's own runs allow):", "",
            "| method | domain | ours | paper | ours − paper | ±δ | floor | our spread | verdict |",
            "|---" * 9 + "|",
            *rows, "", pooling_line(mine)]


def cell_columns(r) -> dict:
    """A cell's verdict columns in the report's csv (empty for a cell not compared but its spread and runs)."""
    always = ("endpoint", "paper_seeds", "spread", "spread_df", "spread_how", "runs")
    keys = (*always, "verdict", "beyond", "margin", "bartlett_p", "se", "df", "ci95_low", "ci95_high", "ci90_low",
            "ci90_high", "p", "q", "p_tost", "floor", "seeds_needed", "needed_why")

    def value(k: str):
        v = getattr(r, k)
        if (not r.compared and k not in always) or v is None or (not isinstance(v, str) and pd.isna(v)):
            return None
        return round(float(v), 6) if isinstance(v, float) else int(v) if k == "seeds_needed" else v
    return {k: value(k) for k in keys}


def direction_words(r) -> str:
    if r.pairs < MIN_PAIRS:
        return f"undecided ({r.pairs} shared seed{'s' * (r.pairs != 1)}: fewer than {MIN_PAIRS})"
    if r.kind == "comparable":
        return f"{r.direction} (paired TOST, p {p_words(r.p)})"
    side = "≥" if r.bound <= r.mean else "≤"
    return f"{r.direction} (one-sided paired t, p {p_words(r.p)}; at 95% ours {side} {r.bound:+.2f})"


def pairs_words(r) -> str:
    if r.direction != "undecided":
        return "–"
    return f"{int(r.pairs_needed)} pairs" if pd.notna(r.pairs_needed) else r.needed_why


def claim_lines(claims: pd.DataFrame, dataset: str) -> list[str]:
    """A dataset's claims, one row each: the paper's gap, ours (the mean of the differences over the seeds both rows
    have, with its 95% interval), the direction, the size, and the pairs an undecided one needs."""
    rows = claims[claims.dataset == dataset] if len(claims) else claims
    if rows.empty:
        return []
    return ["", "The paper's claims (a row minus another, the paper's gap beside ours, the mean of the differences "
                "over the seeds both rows have; of a dataset's AVG, the paper's on the domains run, or its own where "
                "it gives only an AVG; a comparable claim: the two rows within ±δ):", "",
            "| claim | paper | ours (95% CI) | direction | size | pairs needed |", "|---|---|---|---|---|---|",
            *(f"| {r.label}: {r.what}{' (comparable)' * (r.kind == 'comparable')} | "
              f"{r.words if isinstance(r.words, str) else f'{r.paper_gap:+.2f}'} | "
              + ("–" if pd.isna(r.mean) else f"{r.mean:+.2f}, {r.pairs} pair{'s' * (r.pairs > 1)}"
                 + ("" if pd.isna(r.ci95_low) else f" ({r.ci95_low:+.2f} to {r.ci95_high:+.2f})"))
              + f" | {direction_words(r)} | {r.size} | {pairs_words(r)} |" for r in rows.itertuples())]


def plan_lines(plan: pd.DataFrame, cells: pd.DataFrame, name: str) -> list[str]:
    """The runs that would decide the rest, step by step (a step: the runs that complete what it decides), with
    their cost; and how many inconclusive primary cells none would decide."""
    primary = cells[(cells.endpoint == "primary") & cells.compared & (cells.verdict == "inconclusive")] \
        if len(cells) else cells
    never = int(primary.needed_why.str.startswith("none would").sum()) if len(primary) else 0
    out = ["## Runs that would decide the rest", ""]
    if plan.empty:
        return out + [f"None planned: {never} inconclusive primary cell{'s' * (never != 1)} no number of our seeds "
                      "can decide at ±δ (the paper's floor)." if never else "Nothing left to decide.", ""]
    steps, start = [], 0
    for i, r in enumerate(plan.itertuples()):
        if r.decides:
            steps.append(plan.iloc[start:i + 1])
            start = i + 1

    def hours(s: pd.Series, how: pd.Series) -> str:
        if s.isna().all():
            return "not measured"
        guessed = how.str.startswith("estimate").any() or s.isna().any()
        return f"{s.sum() / 3600:.1f} h" + (" (some estimated)" if guessed else "")
    out += [f"In the order that decides the most per run ({len(plan)} runs; every run with its cost in "
            f"results/{name}-plan.csv, measured wall times of the table's committed runs, or estimates said so; seeds "
            "beyond the table's `seeds` need them listed there before its sweep makes and its report reads them):", ""]
    out += [f"{n}. " + "; ".join(f"{m} ({preset}) seed{'s' * (len(g) > 1)} {', '.join(map(str, g.seed))}"
                                 for (preset, m), g in step.groupby(["preset", "method"], sort=False))
            + f" ({len(step)} run{'s' * (len(step) > 1)}; GPU {hours(step.gpu_s, step.gpu_cost)}, CPU "
              f"{hours(step.cpu_s, step.cpu_cost)}): decides {step.decides.iloc[-1]}"
            for n, step in enumerate(steps, 1)]
    if never:
        out += ["", f"{never} inconclusive primary cell{'s' * (never != 1)} no number of our seeds can decide at ±δ "
                "(the paper's floor)."]
    return out + [""]


def reading_lines(spec: Table, dataset: str, planned: list[RunConfig], profile: str) -> list[str]:
    """The table's readings (`Table.readings`) on a dataset, a section per method: each one's metric AVG over the
    seeds it has run, and its gap to each control paired over the seeds both have (the paper's gap beside it where
    both are paper rows, and the paired test of `benchmark.verdicts`); a reading not run yet, with its command;
    nothing for a method none of whose readings has run, or on a dataset the table shows no readings for."""
    if profile != "full" or not spec.shows_readings(dataset):
        return []  # (a smoke run is not a reading's: the commands printed make full-protocol runs)
    seeds = spec.seeds_for(profile)
    preset = next(c.preset for c in planned if c.dataset == dataset)

    read: dict[tuple, dict[int, float]] = {}  # a control's summaries read once for every reading beside it

    def avgs(r: Reading, erasing: bool) -> dict[int, float]:
        key = (r.method, tuple(sorted(r.hparams.items())), erasing)
        if key not in read:
            got = {s: reading_run(planned, dataset, s, r, erasing) for s in seeds}
            read[key] = {s: read_summary(Path(c.out))[spec.metric]["AVG"] for s, c in got.items()
                         if c is not None and run_complete(c)}
        return read[key]

    def run_name(r: Reading, erasing: bool) -> str | None:
        """Its run's folder name less the seed (a hyperparameter at its default, or at the preset's, names none);
        None where the table has no such row."""
        c = reading_run(planned, dataset, seeds[0], r, erasing)
        return None if c is None else c.run_name.removesuffix(f"-seed{seeds[0]}")

    def row_run(r: Reading, erasing: bool) -> bool:  # its run is its method's row as the table runs it
        return run_name(r, erasing) == run_name(Reading("", r.method), False)

    def paper_gap(r: Reading, c: Reading, erasing: bool) -> float | None:
        """The paper's gap where both runs are its rows: each the run of its method's row (control `c` beside `r`,
        its run erasing or not: `Reading.beside`)."""
        plain = row_run(r, r.erasing) and row_run(c, erasing)
        rows = [spec.paper.get(m, {}).get(dataset, {}).get("AVG") for m in (r.method, c.method)]
        return rows[0] - rows[1] if plain and None not in rows else None

    header = ["reading", "seeds", "AVG", *(f"− {c.what}" for c in spec.reading_controls)]
    erased = any(c.erasing for c in spec.reading_controls)
    lines = []
    for method in dict.fromkeys(r.method for r in spec.readings):
        section, not_run = [], []
        for r in (r for r in spec.readings if r.method == method):
            mine = avgs(r, r.erasing)
            if not mine:
                not_run.append(r)
                continue
            cells = [r.what, ", ".join(map(str, mine)), f"{np.mean(list(mine.values())):.2f}"]
            for c, erasing in (c.beside(r) for c in spec.reading_controls):
                if run_name(c, erasing) == run_name(r, r.erasing):
                    cells.append("(itself)")
                    continue
                theirs = avgs(c, erasing)
                gap = paper_gap(r, c, erasing)
                v = paired_claim(mine, theirs, gap)
                cells.append("–" if v.mean is None else f"{v.mean:+.2f}" + ("" if gap is None else f" ({gap:+.2f})")
                             + f", {v.pairs} pair{'s' * (v.pairs > 1)}" + ("" if gap is None else f"; {v.verdict}"))
            section.append("| " + " | ".join(cells) + " |")
        if not section:  # none of this method's readings has run on this dataset
            continue
        lines += ["", f"Readings of {method}, each beside the rows it is paired with seed by seed (the mean of the "
                  "differences over the seeds both have; the paper's gap in brackets where both are its rows"
                  + ("; a control marked with erasing runs with the reading's erasing" * erased) + "):", "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header), *section]
        if not_run:
            lines += ["", "Not run yet: " + "; ".join(f"{r.what} (`{r.command(preset)}`)" for r in not_run) + "."]
    return lines


def report(table: str, profile: str, runs: list[RunConfig], results_dir: Path) -> pd.DataFrame:
    """results_dir/table<N>.md and .csv (`report_name`): ours (mean, std over seeds) beside the paper,
    differences and each cell's verdict, change against FedAvg, rank order, and where the table asks, what a client
    uploads and receives per round; rows more than 2 points from the paper flagged; the claims; the runs that would
    decide the rest. Beside it the data it is made from (`ray_jobs.cells`): <name>-seeds.csv (a row per seed),
    -claims.csv and -plan.csv."""
    spec = TABLES[table]
    name, comm = report_name(table), spec.communication
    every, runs = runs, [c for c in runs if run_complete(c)]  # a partial sweep: those run
    planned = len(every)
    if not runs:
        raise RunError(f"no complete run of table {table} to report; run its sweep first (make {make_target(table)}).")
    data = build(table, every)
    plan = plan_frame(data, every)
    view = data.cells.rename(columns={"mean": "ours"})
    if comm:
        view = view.join(data.seeds.groupby(CELL_KEYS)[["up_bytes", "down_bytes"]].mean(), on=CELL_KEYS)
    sizes = {k: None if pd.isna(n) else int(n)  # gap notes: a domain's test set
             for k, n in data.seeds.groupby(["dataset", "domain"]).test_size.first().items()}
    ref = spec.paper
    lines, csv_rows = [], []
    dropped = {c.dataset: c.dropped_domains for c in every if c.dropped_domains}
    seeds_note = (f"Seeds {list(spec.seeds_for(profile))}" if len(runs) == planned else
                  f"Seeds {list(spec.seeds_for(profile))} planned, not all run: a row is over the seeds it has, "
                  "marked (n seeds) when fewer")
    lines += [title(spec.title, profile, dropped, len(runs), planned), "",
              f"**Verdicts at ±{spec.margin.avg:.2f}: {summary_words(data.counts(), spec.margin.avg)}.** "
              f"{verdict_rule(spec)}", "",
              f"{seeds_note}; accuracy (%) of the evaluated model, "
              f"{METRICS[spec.metric]}; mean ± std over seeds (paper value, ours - paper) and the cell's verdict "
              f"({MARKS_LEGEND}). ⚠ = a compared cell more than {FLAG_POINTS:g} points from the paper."
              + (" Up / down MB: what one client uploads / receives per round (weights and prototypes; mean over "
                 "clients, rounds and seeds)." if comm else ""), ""]
    for ds in dict.fromkeys(c.dataset for c in every):
        doms = list(DATASETS[ds])
        kept = [d for d in doms if d not in dropped.get(ds, [])]
        methods = list(dict.fromkeys(c.method for c in runs if c.dataset == ds))
        not_run = [m for m in dict.fromkeys(c.method for c in every if c.dataset == ds) if m not in methods]
        c0 = next(c for c in every if c.dataset == ds)
        setting = setting_line(c0, kept, [c for c in runs if c.dataset == ds])
        sub = view[view.dataset == ds].set_index(["method", "domain"])
        avg_label = "AVG" if len(kept) == len(doms) else f"AVG of {len(kept)}"
        header = ["method", *doms, avg_label, "Δ FedAvg (paper)", "rank (paper)",
                  *(["up MB", "down MB"] if comm else []), "verdicts", "flag"]
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
            cells, flag, marks = [m if n_seeds == len(spec.seeds_for(profile))
                                  else f"{m} ({n_seeds} seed{'s' * (n_seeds > 1)})"], False, []
            for d in doms + ["AVG"]:
                if d in dropped.get(ds, []):
                    cells.append("not run")
                    continue
                r = sub.loc[(m, d)]
                ours, std = r.ours, r["std"]
                pv = None if pd.isna(r.paper) else float(r.paper)
                diff = None if pv is None else ours - pv
                flag |= diff is not None and abs(diff) > FLAG_POINTS
                if diff is not None and abs(diff) > FLAG_POINTS:
                    flagged.append((m, d, diff, 0.0 if np.isnan(std) else float(std), n_seeds))
                std_s = "" if np.isnan(std) else f" ± {std:.2f}"
                mark = cell_mark(r) if r.compared else ""
                marks += [mark] if mark else []
                cells.append(f"{ours:.2f}{std_s}" + ("" if pv is None else f" ({pv:.2f}, {diff:+.2f})")
                             + (f" {mark}" if mark else ""))
                csv_rows.append({"table": table, "profile": profile, "dataset": ds, "method": m,
                                 "domain": d if d != "AVG" else avg_label, "ours_mean": round(float(ours), 4),
                                 "ours_std": None if np.isnan(std) else round(float(std), 4),
                                 "seeds": int(r.seeds), "paper": pv,
                                 "diff": None if diff is None else round(float(diff), 4),
                                 "flag": diff is not None and abs(diff) > FLAG_POINTS,
                                 **cell_columns(r.rename({"ours": "mean"})),
                                 **({"up_bytes": r.up_bytes, "down_bytes": r.down_bytes} if comm else {})})
            if "fedavg" in our_avg:
                pd_ = (f"{paper_avg[m] - paper_avg['fedavg']:+.2f}" if m in paper_avg and "fedavg" in paper_avg
                       else "–")
                cells.append(f"{our_avg[m] - our_avg['fedavg']:+.2f} ({pd_})")
            else:
                cells.append("–")
            cells.append(f"{order.index(m) + 1} ({paper_order.index(m) + 1 if m in paper_order else '–'})")
            if comm:
                cells += [f"{sub.loc[(m, 'AVG'), k] / MB:.3f}" for k in ("up_bytes", "down_bytes")]
            cells += [mark_counts(marks), "⚠" if flag else ""]
            body.append(cells)
        for label, ms in (("not run", not_run), ("not implemented", spec.not_implemented)):  # the paper's row only
            for m in ms:
                pv = refs[m] or {}
                body.append([f"{m} ({label})", *("not run" if d not in kept else f"– ({pv[d]:.2f})" if d in pv
                                                 else "–" for d in doms),
                             f"– ({pv['AVG']:.2f})" if "AVG" in pv else "–", "–", "–",
                             *(["–", "–"] if comm else []), "–", ""])
        lines += [f"## {ds}" + (f" (without {', '.join(dropped[ds])}; compared on the remaining domains)"
                                if ds in dropped else ""), "",
                  setting, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
        if not_run:
            lines += ["", f"Not run yet: {', '.join(not_run)} ({not_run_why(table, ds)})."]
        if flagged:
            lines += ["", f"Cells more than {FLAG_POINTS:g} points from the paper, and what we know of why:", ""]
            lines += [f"- {m}, {d} ({diff:+.2f}): "
                      + gap_note(table, ds, m, d, diff, std, n_seeds, len(spec.seeds_for(profile)),
                                 sizes.get((ds, d)))
                      for m, d, diff, std, n_seeds in flagged]
        only_avg = {m: ref[m][ds]["AVG"] for m in methods if refs[m] is None and ds in ref.get(m, {})}
        if only_avg:  # the paper's AVG is over all of the dataset's domains: not compared with fewer
            lines += ["", "The paper gives only an AVG over all of its domains here (" + ", ".join(
                f"{m} {v:.2f}" for m, v in only_avg.items()) + "); not compared with an AVG over fewer domains."]
        if spec.prototypes_received:
            lines += ["", "Prototypes each client receives per round (mean over the rounds that send them and over "
                      "seeds; the paper's Table 4 beside it):", "", "| method | prototypes received | paper |",
                      "|---|---|---|"]
            for m in methods:
                got = [prototypes_received(Path(c.out)) for c in runs if c.dataset == ds and c.method == m]
                pv = paper.FEDPLVM_TABLE4_PROTOTYPES.get(m)
                lines.append(f"| {m} | {np.mean(got):.2f} | {'–' if pv is None else f'{pv:.2f}'} |")
        if spec.client_avg is not None:
            lines += client_avg_lines(spec, methods, sub, c0, kept, refs)
        lines += cell_verdict_lines(data.cells, ds) + claim_lines(data.claims, ds)
        lines += reading_lines(spec, ds, every, profile)
        lines.append("")
    lines += plan_lines(plan, data.cells, name)
    fig_dir = results_dir / "figures" / name
    figs = table_figures(table, [Path(c.out) for c in runs], fig_dir, f"{spec.title}, {profile} profile")
    rel = f"figures/{name}"
    lines += [f"Figures: accuracy over rounds per method, mean over seeds with a ± std band "
              f"([SVG]({rel}/curves.svg)); per-domain accuracy ({METRICS[spec.metric]}) beside the paper's "
              f"([SVG]({rel}/bars.svg)).", "",
              f"![accuracy over rounds]({rel}/curves.png)", "",
              f"![per-domain accuracy beside the paper]({rel}/bars.png)", ""]
    if "local_prototypes" in figs:
        lines += [f"Figure 9 of FedPLVM: {spec.prototype_count_figure}'s local clustered prototypes per class over "
                  f"rounds, per domain ([SVG]({rel}/local_prototypes.svg)).", "",
                  f"![local prototypes per class]({rel}/local_prototypes.png)", ""]
    df = write_report(results_dir, name, lines, csv_rows, runs,
                      {"seeds": data.seeds, "claims": data.claims, "plan": plan})
    log_wandb(table, profile, df, figs)
    return df


def write_report(results_dir: Path, name: str, lines: list[str], csv_rows: list[dict],
                 runs: list[RunConfig], data: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    """results_dir/<name>.md (`lines`, then the runs, the code's commits and the hardware), <name>.csv
    (`csv_rows`) and each of `data` as <name>-<key>.csv; returns the csv's frame."""
    lines = [*lines, runs_line(runs), ""]
    provs = [json.loads((Path(c.out) / "config.json").read_text()).get("provenance") for c in runs]
    lines += [f"Code: commit {' | '.join(sorted({commit_label(p) for p in provs}))}. "
              f"Hardware: {' | '.join(sorted({hardware_label(p) for p in provs}))}.", ""]
    results_dir.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(csv_rows)
    texts = {f"{name}.csv": df.to_csv(index=False),
             **{f"{name}-{key}.csv": frame.to_csv(index=False) for key, frame in (data or {}).items()},
             f"{name}.md": "\n".join(lines)}
    for file, text in texts.items():  # the report last: each file whole, the report written once its data is
        atomic_write(results_dir / file, text)
    return df


def client_avg(spec, method: str, ours: dict[str, float], layout: dict[str, int],
               ref: dict) -> tuple[float, float | None]:
    """A method's AVG over clients (FedPLVM's Table 10's Avg) on the domains run, those of `ours` (its accuracy per
    domain): each domain's accuracy weighted by its clients in `layout`; ours and the paper's (its printed Avg when
    every domain ran, else the same weighting of its values `ref` on the domains run, None without them)."""
    n = {d: layout[d] for d in ours}
    mine = sum(n[d] * v for d, v in ours.items()) / sum(n.values())
    if len(ours) == len(layout) and method in spec.client_avg:
        return mine, spec.client_avg[method]
    if all(d in ref for d in ours):
        return mine, sum(n[d] * ref[d] for d in ours) / sum(n.values())
    return mine, None


def client_avg_lines(spec, methods: list[str], sub: pd.DataFrame, cfg: RunConfig, kept: list[str],
                     refs: dict) -> list[str]:
    """A table whose paper averages over clients (FedPLVM's Table 10): per method `client_avg`, ours and the
    paper's, beside the AVG over domains; the clients of domains not run are named."""
    layout = cfg.layout
    n = {d: layout[d] for d in kept}
    out = ["", f"AVG over clients, the paper's Avg in this table (each domain's accuracy weighted by its clients: "
           + ", ".join(f"{d} {k}" for d, k in layout.items()) + "); the AVG column above is the mean over domains "
           "(FPL's):", "", "| method | clients run | AVG over clients | paper | AVG over domains | paper |",
           "|---|---|---|---|---|---|"]
    for m in methods:
        ref = refs.get(m) or {}
        ours, pv = client_avg(spec, m, {d: float(sub.loc[(m, d), "ours"]) for d in kept}, layout, ref)
        dom = float(sub.loc[(m, "AVG"), "ours"])
        out.append(f"| {m} | {sum(n.values())} | {ours:.2f} | {'–' if pv is None else f'{pv:.2f}'} | {dom:.2f} | "
                   f"{'–' if 'AVG' not in ref else format(ref['AVG'], '.2f')} |")
    missing = {d: k for d, k in layout.items() if d not in kept}
    if missing:
        out += ["", "Not run: " + ", ".join(f"{d}'s {k} client{'s' * (k > 1)}" for d, k in missing.items())
                + " (" + ("SVHN: only 1,083 of its training images and no test set are available offline" if "svhn"
                          in missing else "domains left out") + "); both averages are over the clients and domains "
                "run, the paper's values weighted the same way."]
    return out


def log_wandb(table: str, profile: str, df: pd.DataFrame, figs: dict) -> None:
    """The sweep's report run in the sweep's group: the report as a table, a line chart of AVG per round per
    method for each dataset (where the figures have curves), and the figures."""
    mode = wandb_mode()
    if mode == "disabled":
        return
    import wandb

    name = report_name(table)
    run = wandb.init(project="fedproto-bench", group=f"{name}-{profile}", name=f"{name}-{profile}-report",
                     mode=mode, job_type="report", reinit="create_new")
    charts = {}
    curves = figs["curves"][figs["curves"].domain == "AVG"] if "curves" in figs else pd.DataFrame(columns=["dataset"])
    for ds, sub in curves.groupby("dataset", sort=False):  # a grid table's report has no curves
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
