"""A table's report beside the paper: results/table<N>.md and .csv, its figures and its W&B report run.

Per method and domain our mean ± std over seeds of the table's metric, the paper's value and the difference, the AVG,
the change against FedAvg beside the paper's, the rank order, rows not run, and for each cell more than 2 points from
the paper what we know of why (`gap_note`). FedProto's Tables 1 and 2 have their own report
(`ray_jobs.report_fedproto`).
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
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
from benchmark.verdicts import (ALPHA, MAX_SEEDS, POWER, CellVerdict, ClaimVerdict, cell_verdict, mark_counts,
                                paired_claim)
from ray_jobs.tables import GAP_NOTES, METRICS, TABLES, Claim, Reading, Table, make_target, report_name

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


def collect(runs: list[RunConfig], metric: str = "last5") -> pd.DataFrame:
    """One row per (method, dataset, domain): mean and std over seeds of the accuracy by `metric`."""
    rows = []
    for cfg in runs:
        s = read_summary(Path(cfg.out))
        comm = s.get("communication", {}).get("per_client_per_round", {})
        if s[metric] is None:  # a run made for a table that reads the final round only (eval_last 1)
            raise RunError(f"{cfg.out}: its summary has no {metric} (its run tested the final round only, for a "
                           f"table that reads that); delete its summary.json and sweep again to run it for this table.")
        for dom, acc in s[metric].items():
            rows.append({"method": cfg.method, "dataset": cfg.dataset, "domain": dom, "seed": cfg.seed, "acc": acc,
                         "up_bytes": comm.get("up_bytes", np.nan), "down_bytes": comm.get("down_bytes", np.nan)})
    df = pd.DataFrame(rows)
    return df.groupby(["method", "dataset", "domain"], sort=False).agg(
        ours=("acc", "mean"), std=("acc", "std"), seeds=("acc", "count"), up_bytes=("up_bytes", "mean"),
        down_bytes=("down_bytes", "mean"), values=("acc", list), seed_list=("seed", list)).reset_index()


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


def claim_paper_gap(spec: Table, claim: Claim, kept: list[str], doms: list[str]) -> float:
    """The paper's gap of a claim: its own number where it gives one (Fig. 5), else the minuend's AVG minus the
    subtrahend's over the domains run (`paper.reference`), or over all its domains where it gives only an AVG."""
    if claim.paper is not None:
        return claim.paper
    refs = [paper.reference(spec.paper, m, claim.dataset, kept, doms) for m in (claim.minuend, claim.subtrahend)]
    rows = refs if all(refs) else [spec.paper[m][claim.dataset] for m in (claim.minuend, claim.subtrahend)]
    return rows[0]["AVG"] - rows[1]["AVG"]


@dataclass
class Verdicts:
    """A table's verdicts: per compared cell (dataset, method, domain) and per claim (with the paper's gap)."""
    cells: dict[tuple[str, str, str], CellVerdict] = field(default_factory=dict)
    claims: list[tuple[Claim, float, ClaimVerdict]] = field(default_factory=list)

    def counts(self) -> tuple[Counter, Counter]:
        """How many cells are consistent, differ, undecided; how many claims hold, are reversed, undecided."""
        return Counter(v.verdict for v in self.cells.values()), Counter(v.verdict for *_, v in self.claims)

    def summary(self) -> str:
        cells, claims = self.counts()
        return (f"cells {cells['consistent']} consistent, {cells['differs']} differ, {cells['undecided']} undecided; "
                f"claims {claims['holds']} holding, {claims['reversed']} reversed, {claims['undecided']} undecided")


def verdicts(spec: Table, agg: pd.DataFrame, kept: dict[str, list[str]]) -> Verdicts:
    """Every compared cell's verdict (a method run on a domain the paper has a value for) and every claim's on the
    datasets run (`kept`: dataset -> the domains run), from `collect`'s frame."""
    out = Verdicts()
    for ds, domains in kept.items():
        doms = list(DATASETS[ds])
        sub = agg[agg.dataset == ds].set_index(["method", "domain"])
        for m in dict.fromkeys(sub.index.get_level_values(0)):
            ref = paper.reference(spec.paper, m, ds, domains, doms) or {}
            stds = spec.paper_std.get(m, {}).get(ds, {})
            for d in [x for x in [*domains, "AVG"] if x in ref]:
                std = stds.get(d) if d != "AVG" or domains == doms else None  # a printed std is of the printed AVG
                out.cells[(ds, m, d)] = cell_verdict(sub.loc[(m, d), "values"], ref[d], std, spec.paper_runs)
        for claim in (c for c in spec.claims if c.dataset == ds):
            avg = {m: dict(zip(sub.loc[(m, "AVG"), "seed_list"], sub.loc[(m, "AVG"), "values"]))
                   if (m, "AVG") in sub.index else {} for m in (claim.minuend, claim.subtrahend)}
            gap = claim_paper_gap(spec, claim, domains, doms)
            out.claims.append((claim, gap, paired_claim(avg[claim.minuend], avg[claim.subtrahend], gap)))
    return out


def verdict_rule(spec: Table) -> str:
    """How a table's cells and claims are tested, in words."""
    runs = f"{spec.paper_runs} run{'s' * (spec.paper_runs != 1)}" if spec.paper_runs else "runs it does not count"
    cell = (f"Welch's t-test of our seeds' mean ± std against the paper's over its {runs} where the paper prints a "
            "std, a one-sample t-test of our seeds against its value where it prints none"
            if spec.paper_std else f"a one-sample t-test of our seeds against the paper's value (a mean over {runs} "
            "without a std)")
    return (f"Verdicts at {ALPHA:.0%} (`benchmark/verdicts.py`): a cell, {cell}: ✓ consistent, ✗ differs (with the "
            "p-value and our mean's 95% interval; a consistent cell also the smallest difference our seeds could "
            f"detect at {POWER:.0%} power: a consistent cell that could not have seen a gap of many points says "
            "little), ? undecided with 1 seed. A claim (the paper's gap between two rows' AVG, its "
            "sign the claim), paired over the seeds both rows have: a paired t-test with 3 pairs or more, a sign test "
            "with fewer: holds, reversed, or undecided. An undecided one: the seeds that would decide it at "
            f"{POWER:.0%} power, from our spread (one seed: the paper's std, where it prints one), at most "
            f"{MAX_SEEDS}.")


def cell_verdict_lines(cells: dict[tuple[str, str, str], CellVerdict], dataset: str, sub: pd.DataFrame,
                       refs: dict) -> list[str]:
    """A dataset's compared cells, one row each: ours, the paper's, the test and its verdict."""
    rows = [(m, d, v) for (ds, m, d), v in cells.items() if ds == dataset]
    if not rows:
        return []
    return ["", "Each compared cell's verdict:", "", "| method | domain | ours | paper | verdict |", "|---|" * 5,
            *(f"| {m} | {d} | {sub.loc[(m, d), 'ours']:.2f} ({v.seeds} seed{'s' * (v.seeds > 1)}) | {refs[m][d]:.2f} | "
              f"{v.words()} |" for m, d, v in rows)]


def verdict_columns(v: CellVerdict | None) -> dict:
    """A cell's verdict as the report's csv has it (empty for a cell not compared)."""
    if v is None:
        return {"verdict": None, "test": None, "p_value": None, "ci_low": None, "ci_high": None, "detectable": None,
                "seeds_needed": None}
    return {"verdict": v.verdict, "test": v.test or None, "p_value": None if v.p is None else round(v.p, 6),
            **{k: None if v.ci is None else round(x, 4) for k, x in zip(("ci_low", "ci_high"), v.ci or (0, 0))},
            "detectable": None if v.detectable is None else round(v.detectable, 4), "seeds_needed": v.needed}


def claim_lines(claims: list[tuple[Claim, float, ClaimVerdict]], dataset: str) -> list[str]:
    """A dataset's claims, one row each: the paper's gap, ours (the mean over the seeds both rows have), the test."""
    rows = [(c, gap, v) for c, gap, v in claims if c.dataset == dataset]
    if not rows:
        return []
    return ["", "The paper's claims (a row minus another, the paper's gap beside ours, the mean of the differences "
                "over the seeds both rows have; of a dataset's AVG, the paper's on the domains run, or its own where "
                "it gives only an AVG):", "",
            "| claim | paper | ours | verdict |", "|---|---|---|---|",
            *(f"| {c.label}: {c.what} | {c.words or f'{gap:+.2f}'} | " + ("–" if v.mean is None else f"{v.mean:+.2f}")
              + f" | {v.words()} |" for c, gap, v in rows)]


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
                v = paired_claim(mine, theirs, 0.0 if gap is None else gap)
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
    differences, change against FedAvg, rank order, and where the table asks, what a client uploads and
    receives per round; rows more than 2 points from the paper flagged."""
    spec = TABLES[table]
    name, comm = report_name(table), spec.communication
    every, runs = runs, [c for c in runs if run_complete(c)]  # a partial sweep: those run
    planned = len(every)
    if not runs:
        raise RunError(f"no complete run of table {table} to report; run its sweep first (make {make_target(table)}).")
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
    ver = verdicts(spec, agg, {ds: [d for d in DATASETS[ds] if d not in dropped.get(ds, [])]
                               for ds in dict.fromkeys(c.dataset for c in every)})
    lines += [title, "", f"**Verdicts: {ver.summary()}.** {verdict_rule(spec)}", "",
              f"{seeds_note}; accuracy (%) of the evaluated model, "
              f"{METRICS[spec.metric]}; mean ± std over seeds (paper value, ours - paper) and the cell's verdict. "
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
            cells, flag = [m if n_seeds == len(spec.seeds_for(profile))
                           else f"{m} ({n_seeds} seed{'s' * (n_seeds > 1)})"], False
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
                v = ver.cells.get((ds, m, d))
                cells.append(f"{ours:.2f}{std_s}" + ("" if pv is None else f" ({pv:.2f}, {diff:+.2f})")
                             + ("" if v is None else f" {v.mark()}"))
                csv_rows.append({"table": table, "profile": profile, "dataset": ds, "method": m,
                                 "domain": d if d != "AVG" else avg_label, "ours_mean": round(float(ours), 4),
                                 "ours_std": None if np.isnan(std) else round(float(std), 4),
                                 "seeds": int(sub.loc[(m, d), "seeds"]), "paper": pv,
                                 "diff": None if diff is None else round(float(diff), 4),
                                 "flag": diff is not None and abs(diff) > FLAG_POINTS, **verdict_columns(v),
                                 **({"up_bytes": sub.loc[(m, d), "up_bytes"],
                                     "down_bytes": sub.loc[(m, d), "down_bytes"]} if comm else {})})
            if "fedavg" in our_avg:
                pd_ = (f"{paper_avg[m] - paper_avg['fedavg']:+.2f}" if m in paper_avg and "fedavg" in paper_avg
                       else "–")
                cells.append(f"{our_avg[m] - our_avg['fedavg']:+.2f} ({pd_})")
            else:
                cells.append("–")
            cells.append(f"{order.index(m) + 1} ({paper_order.index(m) + 1 if m in paper_order else '–'})")
            if comm:
                cells += [f"{sub.loc[(m, 'AVG'), k] / MB:.3f}" for k in ("up_bytes", "down_bytes")]
            cells.append(mark_counts([v for (ds_, m_, _), v in ver.cells.items() if (ds_, m_) == (ds, m)]))
            cells.append("⚠" if flag else "")
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
            sizes = json.loads((Path(next(c for c in runs if c.dataset == ds).out)
                                / "config.json").read_text())["test_sizes"]
            lines += [f"- {m}, {d} ({diff:+.2f}): "
                      + gap_note(table, ds, m, d, diff, std, n_seeds, len(spec.seeds_for(profile)), sizes.get(d))
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
        lines += cell_verdict_lines(ver.cells, ds, sub, refs) + claim_lines(ver.claims, ds)
        lines += reading_lines(spec, ds, every, profile)
        lines.append("")
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
    df = write_report(results_dir, name, lines, csv_rows, runs)
    log_wandb(table, profile, df, figs)
    return df


def write_report(results_dir: Path, name: str, lines: list[str], csv_rows: list[dict],
                 runs: list[RunConfig]) -> pd.DataFrame:
    """results_dir/<name>.md (`lines`, then the runs, the code's commits and the hardware) and <name>.csv
    (`csv_rows`); returns the csv's frame."""
    lines = [*lines, runs_line(runs), ""]
    provs = [json.loads((Path(c.out) / "config.json").read_text()).get("provenance") for c in runs]
    lines += [f"Code: commit {' | '.join(sorted({commit_label(p) for p in provs}))}. "
              f"Hardware: {' | '.join(sorted({hardware_label(p) for p in provs}))}.", ""]
    results_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(results_dir / f"{name}.md", "\n".join(lines))
    df = pd.DataFrame(csv_rows)
    atomic_write(results_dir / f"{name}.csv", df.to_csv(index=False))
    return df


def client_avg_lines(spec, methods: list[str], sub: pd.DataFrame, cfg: RunConfig, kept: list[str],
                     refs: dict) -> list[str]:
    """A table whose paper averages over clients (FedPLVM's Table 10): per method each domain's accuracy weighted
    by its clients, ours and the paper's (its printed Avg when every domain ran, else the same weighting of its
    values on the domains run); the clients of domains not run are named."""
    layout = cfg.layout
    n = {d: layout[d] for d in kept}
    out = ["", f"AVG over clients, the paper's Avg in this table (each domain's accuracy weighted by its clients: "
           + ", ".join(f"{d} {k}" for d, k in layout.items()) + "); the AVG column above is the mean over domains "
           "(FPL's):", "", "| method | clients run | AVG over clients | paper | AVG over domains | paper |",
           "|---|---|---|---|---|---|"]
    for m in methods:
        ours = sum(n[d] * float(sub.loc[(m, d), "ours"]) for d in kept) / sum(n.values())
        ref = refs.get(m) or {}
        if len(kept) == len(layout) and m in spec.client_avg:
            pv = spec.client_avg[m]
        elif all(d in ref for d in kept):
            pv = sum(n[d] * ref[d] for d in kept) / sum(n.values())
        else:
            pv = None
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
