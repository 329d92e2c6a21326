"""`make table-fedproto`: the report of FedProto's Tables 1 and 2 (AAAI 2022; MNIST, n-way k-shot, stdev of n 2 and 3).

    python -m ray_jobs.sweep --table fedproto [--profile full|smoke]

The runs (table "fedproto" of `ray_jobs.tables`, planned and run as every sweep's, resumable): the paper's
eight rows, Local, FeSEM, FedProx, FedPer, FedAvg, FedRep, FedProto and FedProto-mh, on the presets
`fedproto-mnist-n3|n4|n5` (stdev 2, Table 1) and `fedproto-mnist-n3|n4|n5-s3` (stdev 3, Table 2's second
rows), the same split and model for all; and Figure 3's, FedProto and FedAvg at n = 3 with k training samples per
class (presets `fedproto-mnist-n3-k<k>`; k = 100 is Table 1's n = 3). The report: per method, stdev and n, mean ±
std over seeds of the final round's mean client accuracy, beside the paper's value (whose ± is the std over
clients); beside them our mean ± std over clients (`per client`), and for FedProto's rows the official code's scorer,
whose counters are never reset across clients (`official_scores`), applied to our final per-client counts: the
statistic the paper's FedProto rows report, where its baselines report a per-client one. FedProto's headline is its
prototype inference; its classifier's argmax has a row of its own. Parameters per round are what the clients
upload, counted from the tensors that travel (the run's `communication`): a model per client for FedAvg, FedProx and
FeSEM, the body (the convolutions) for FedPer and FedRep, a 50-d prototype per class held for FedProto, 0 for Local;
the paper's column beside them. Figure 3: the final mean
client accuracy against k, a table and its plot (the paper gives a plot only). Figure 2: t-SNE maps of the n = 3
runs of FedProto, FedAvg, FeSEM and FedPer, from the test features each run saved at its end (`features.npz`).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from benchmark import paper
from benchmark.fewshot import SHOTS, TEST_SHOTS
from benchmark.protocols import FEDPROTO_FIGURE3_SHOTS
from benchmark.results import FEATURES_FILE, atomic_write, read_jsonl, read_summary, run_complete
from ray_jobs.config import RunConfig
from ray_jobs.figures import runs_line, table_figures
from benchmark.verdicts import MARKS_LEGEND, cell_frame
from ray_jobs.cells import TableData, claim_frame, hardware, plan_frame, with_runs
from ray_jobs.report import (cell_columns, cell_mark, cell_verdict_lines, claim_lines, gap_note, mark_counts,
                             plan_lines, summary_words, verdict_rule)
from ray_jobs.run import RunError
from ray_jobs.tables import TABLES

WAYS = [3, 4, 5]
STDEVS = [2, 3]  # of n: Table 1, Table 2's second rows
FEDPROTO_METHODS = ("fedproto_orig", "fedproto_mh")  # rows of both inference rules


def uploaded_params(summary: dict) -> int:
    """Parameters all clients upload per round, counted from the tensors that travelled (weights and prototypes;
    the mean over the run's rounds)."""
    per_client = summary["communication"]["per_client_per_round"]
    return round((per_client["up_weights"] + per_client["up_prototypes"]) * len(summary["clients"]))


def official_scores(summary: dict, last: dict) -> dict[str, list[float]]:
    """The official FedProto scorer (yuetan031/FedProto lib/update.py `test_inference_new_het_lt`) applied to a run's
    final per-client counts: it tests the clients in order, first by the classifier, then by the nearest global
    prototype, and never resets its correct / total counters, so each client's figure is the pooled accuracy of
    every pass so far. Per client (%): "classifier" after its classifier pass (the code's `acc_list_l`, "w/o
    protos"), "prototype" after its prototype pass (`acc_list_g`, "with protos", the figure the paper reports).
    A client's counts are its accuracy times its test samples, TEST_SHOTS per class it holds."""
    correct = total = 0
    out = {"classifier": [], "prototype": []}
    for c in summary["clients"]:
        n, acc = TEST_SHOTS * len(c["classes"]), last["client_accuracy"][str(c["id"])]
        for rule in ("classifier", "prototype"):
            correct, total = correct + round(acc[rule] * n / 100), total + n
            out[rule].append(100 * correct / total)
    return out


def collect(runs: list[RunConfig]) -> pd.DataFrame:
    """One row per run and inference rule: final mean client accuracy, its mean and std over clients, the official
    scorer's mean and std over clients (FedProto's rules; NaN for the rest), uploads per round."""
    rows = []
    for cfg in runs:
        out = Path(cfg.out)
        s, last = read_summary(out), read_jsonl(out / "metrics.jsonl")[-1]
        config = json.loads((out / "config.json").read_text())
        official = official_scores(s, last) if "prototype" in s["final"] else None
        for rule in ("prototype", "classifier"):
            if rule in s["final"]:
                per_client = [a[rule] for a in last["client_accuracy"].values()]
                off = [np.nan] if official is None else official[rule]
                rows.append({"method": cfg.method, "rule": rule, "stdev": cfg.ways_stdev, "ways": cfg.ways,
                             "shots": cfg.ways_shots, "seed": cfg.seed, "acc": s["final"][rule],
                             "client_mean": float(np.mean(per_client)), "client_std": float(np.std(per_client)),
                             "official": float(np.mean(off)), "official_std": float(np.std(off)),
                             "params": uploaded_params(s), "preset": cfg.preset, "run": out.name,
                             "wall_time_s": s.get("wall_time_s"), "hardware": hardware(config)})
    return pd.DataFrame(rows)


def official_cells(row) -> dict:
    """The csv's official-scorer columns of a report row (None where the official scorer does not apply)."""
    if np.isnan(row["official"]):
        return {"official_mean": None, "official_std": None}
    return {"official_mean": round(float(row["official"]), 4), "official_std": round(float(row["official_std"]), 4)}


def paper_statistic(method: str, rule: str) -> str:
    """Which statistic the paper's cell of a row is: the official scorer's for FedProto's (pooled counters), a
    per-client one for the baselines, none for FedProto's classifier rows (the paper reports its prototype
    inference)."""
    if method not in FEDPROTO_METHODS:
        return "per client"
    return "official scorer" if rule == "prototype" else "–"


def headline_rule(method: str) -> str:
    """The inference rule a method's AVG is: FedProto's nearest global prototype, else the classifier's argmax."""
    return "prototype" if method in FEDPROTO_METHODS else "classifier"


def label(method: str, rule: str) -> str:
    return method if rule == "prototype" or method not in FEDPROTO_METHODS else f"{method} (classifier)"


def paper_value(method: str, rule: str, stdev: int, ways: int) -> tuple[float | None, float | None]:
    """The paper's (mean, std over clients), None for FedProto's classifier rows (the paper reports its prototypes)."""
    if rule == "classifier" and method in FEDPROTO_METHODS:
        return None, None
    return paper.FEDPROTO_TABLE[stdev][method][ways]


def seed_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The tidy frame of `collect`'s headline rows (FedProto's prototype inference, the baselines' classifier) of
    Tables 1 and 2: a cell per ("stdev 2", method, "n = 3"), each primary (the paper's cells have no domains); the
    paper's mean is one run's (its ± over clients: `paper.SEEDS`)."""
    spec = TABLES["fedproto"]
    head = df[(df.shots == SHOTS) & (df.rule == df.method.map(headline_rule))]
    return pd.DataFrame({"table": "fedproto", "dataset": [f"stdev {sd}" for sd in head.stdev], "method": head.method,
                         "domain": [f"n = {w}" for w in head.ways], "seed": head.seed, "value": head.acc,
                         "paper": [paper.FEDPROTO_TABLE[sd][m][w][0] for m, sd, w in
                                   zip(head.method, head.stdev, head.ways)],
                         "paper_runs": spec.paper_runs, "paper_seeds": spec.paper_seeds, "paper_std": np.nan,
                         "margin": spec.margin.avg,
                         "endpoint": "primary", "test_size": None, "preset": head.preset, "run": head.run,
                         "wall_time_s": head.wall_time_s, "hardware": head.hardware})


def verdicts(df: pd.DataFrame) -> TableData:
    """Each compared cell's verdict (`seed_rows`, `benchmark.verdicts.cell_frame`: the spread pooled over the methods
    at each stdev and n); each claim's (`TABLES["fedproto"].claims`), paired over the seeds whose rows ran every n."""
    seeds = seed_rows(df)
    items = []
    for claim in TABLES["fedproto"].claims:
        per_seed = []
        for m in (claim.minuend, claim.subtrahend):
            g = seeds[(seeds.method == m) & (seeds.dataset == claim.dataset)].groupby("seed").value
            per_seed.append({s: v for s, v, n in zip(g.mean().index, g.mean(), g.count()) if n == len(WAYS)})
        items.append((claim, claim.paper, *per_seed))
    return TableData("fedproto", seeds, with_runs(cell_frame(seeds), seeds) if len(seeds) else pd.DataFrame(),
                     claim_frame("fedproto", items))


def aggregate(df: pd.DataFrame) -> pd.DataFrame:
    """`collect`'s rows over seeds, a row per method, inference rule, stdev, n and k: the mean (`ours`) and std of the
    final mean client accuracy, the seeds, and the means of the per-client and official figures and the uploads."""
    return df.groupby(["method", "rule", "stdev", "ways", "shots"], sort=False).agg(
        ours=("acc", "mean"), std=("acc", "std"), seeds=("acc", "count"), client_mean=("client_mean", "mean"),
        client_std=("client_std", "mean"), official=("official", "mean"), official_std=("official_std", "mean"),
        params=("params", "mean")).reset_index()


def table_cells(agg: pd.DataFrame, every: list[RunConfig]) -> pd.DataFrame:
    """Tables 1 and 2's cells in the report's order, run or not: a row per n of each (method, stdev) the table's plan
    `every` has (FedProto's under both inference rules), with its row's `label`, `aggregate`'s numbers (NaN where no
    run of it is complete), the paper's mean and ± over clients (`paper_value`; NaN for FedProto's classifier rows),
    ours - paper (`diff`) and whether that is further than the paper's ± (`far`)."""
    planned = {(c.method, c.ways_stdev) for c in every if c.ways_shots == SHOTS}
    keys = ["method", "rule", "stdev", "ways"]
    rows = [{"label": label(m, rule), "method": m, "rule": rule, "stdev": sd, "ways": w, "paper": pv, "paper_std": ps}
            for sd in STDEVS for m in paper.FEDPROTO_TABLE[sd] if (m, sd) in planned
            for rule in (("prototype", "classifier") if m in FEDPROTO_METHODS else ("classifier",))
            for w in WAYS for pv, ps in [paper_value(m, rule, sd, w)]]
    cells = pd.DataFrame(rows).astype({"paper": float, "paper_std": float}).join(
        agg[agg.shots == SHOTS].set_index(keys), on=keys)
    return cells.assign(diff=cells.ours - cells.paper, far=lambda c: c["diff"].abs() > c.paper_std)


def far_from_paper(cells: pd.DataFrame) -> dict[str, tuple[pd.DataFrame, str]]:
    """The rows with cells further from the paper than its ± (`table_cells`' `far`), by label in the report's order:
    those cells, and what we know of why (`gap_note`, from the row's first such cell)."""
    out = {}
    for row, far in cells[cells.far].groupby("label", sort=False):
        c = far.iloc[0]
        out[row] = far, gap_note("fedproto", "mnist", c.method, "*", c["diff"], c["std"], int(c.seeds),
                                 len(TABLES["fedproto"].seeds), None)
    return out


def figure2_lines(figs: dict, drawn: bool) -> list[str]:
    """Figure 2's section of the report: its t-SNE maps of the runs `figs["tsne"]` names (`fedproto_figures`); where
    they are not drawn because complete runs lack their features (`figs["tsne_lacking"]`; a fresh clone:
    features.npz is not committed, 170 kB a run), which runs and how to make them, and the figure drawn when they were
    here, where it is (`drawn`: committed) and stays the report's; nothing without either."""
    head = ["## Figure 2: t-SNE of the test features and prototypes (n = 3, stdev of n 2)", ""]
    figure = ["![Figure 2: t-SNE of the test features](figures/tablefedproto/tsne.png)", ""]
    if figs["tsne"] is not None:
        return [*head, "Each client's own test samples through the model it ends the run with (FedProto: its own; "
                "FedAvg: the global model; FeSEM: its cluster's centre; FedPer: the global body), a seed-0 pick of "
                "them, coloured by class; FedProto's last local prototypes (circles) and its global ones (stars) "
                "embedded with them. The runs: " + ", ".join(figs["tsne"]) + ".", "", *figure]
    if not figs["tsne_lacking"]:
        return []
    return [*head, ("The figure drawn earlier from" if drawn else "Not drawn:") + " the test features its runs "
            f"({', '.join(figs['tsne_lacking'])}) save at their end (`{FEATURES_FILE}`), which git does not keep and "
            "this checkout lacks" + (" (not redrawn now)" if drawn else "") + ". Delete those runs' `summary.json` and "
            f"run the table again to {'redraw it' if drawn else 'make them'} (about 16 min a run on a 2-core CPU).", "",
            *(figure if drawn else [])]


def figure3_shots(every: list[RunConfig]) -> list[int]:
    """The values of k Figure 3's section has a row for: those of the table's plan `every` of FedProto and FedAvg at
    n = 3 (stdev 2), k = 100 (Table 1's runs) among them; none where the plan has no other k."""
    return sorted({c.ways_shots for c in every if c.method in paper.FEDPROTO_FIGURE3 and c.ways == 3
                   and c.ways_stdev == 2} if any(c.ways_shots != SHOTS for c in every) else [])


def figure3_lines(agg: pd.DataFrame, shots: list[int], drawn: bool) -> list[str]:
    """Figure 3's section of the report: per k, FedProto's and FedAvg's final mean client accuracy at n = 3 (stdev
    2; AVG: FedProto's prototype inference, FedAvg's classifier), mean ± std over seeds, and its plot."""
    lines = ["## Figure 3: FedProto and FedAvg with fewer training samples per class (n = 3, stdev of n 2)", "",
             "The paper gives this as a plot only, no numbers to compare, and its text does not give the plot's "
             f"values of k: ours are k = {', '.join(map(str, FEDPROTO_FIGURE3_SHOTS))} (each client's k drawn as "
             "randint(k - 1, k + 1), as the split draws it for stdev 2; k = 100 is Table 1's n = 3 run). Final mean "
             "client accuracy (%) (FedProto: nearest global prototype; FedAvg: the global model's argmax), mean ± std "
             "over seeds.", "", "| k | " + " | ".join(paper.FEDPROTO_FIGURE3) + " |",
             "|---|" + "---|" * len(paper.FEDPROTO_FIGURE3)]
    for k in shots:
        cells = [str(k)]
        for m in paper.FEDPROTO_FIGURE3:
            hit = agg[(agg.method == m) & (agg.rule == headline_rule(m)) & (agg.ways == 3) & (agg.stdev == 2)
                      & (agg.shots == k)]
            if hit.empty:
                cells.append("not run")
                continue
            std = hit.iloc[0]["std"]
            cells.append(f"{hit.iloc[0]['ours']:.2f}" + ("" if np.isnan(std) else f" ± {std:.2f}"))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if drawn:
        lines += ["![Figure 3: accuracy against samples per class](figures/tablefedproto/samples.png)", ""]
    return lines


def report(profile: str, runs: list[RunConfig], results_dir: Path) -> tuple[pd.DataFrame, dict]:
    """results_dir/tablefedproto.md and .csv, and the accuracy curves (figures/tablefedproto/); returns the
    report's rows and the figures (`figures.fedproto_figures`). Every row of `runs` (the table's plan) has a line;
    the cells of runs not complete say "not run" beside the paper's value."""
    every, runs = runs, [c for c in runs if run_complete(c)]
    if not runs:
        raise RunError("no complete run of table fedproto to report; run its sweep first (make table-fedproto).")
    df = collect(runs)
    agg = aggregate(df)
    cells = table_cells(agg, every)  # every row the tables plan has a line, run or not
    c0 = runs[0]
    title = f"# {TABLES['fedproto'].title}: reproduction ({profile} profile"
    title += ", SMOKE SETTINGS: not comparable to the paper)" if profile == "smoke" else ")"
    ver = verdicts(df)
    verdict_of = {k: r for k, r in ver.cells.set_index(["dataset", "method", "domain"]).iterrows()} \
        if len(ver.cells) else {}

    def units(dataset: str, method: str, domain: str) -> list[tuple[str, str]]:  # a cell's runs (AVG: every n's)
        sd, ways = int(dataset.split()[1]), None if domain == "AVG" else int(domain.split()[-1])
        return list(dict.fromkeys((c.preset, method) for c in every if c.method == method and c.ways_shots == SHOTS
                                  and c.ways_stdev == sd and ways in (None, c.ways)))
    margin = TABLES["fedproto"].margin.avg
    lines = [title, "", f"**Verdicts at ±{margin:.2f}: {summary_words(ver.counts(), margin)}.** "
             f"{verdict_rule(TABLES['fedproto'])} "
             f"Here every cell ({MARKS_LEGEND}) is primary (one stdev and n, the headline inference rule), the "
             "spread pooled over the methods at each stdev and n; the paper states no number of runs and its ± is "
             "over the clients of a run (taken as one run). A claim: its bold row, FedProto above each baseline, on "
             "the mean over n at each stdev, paired over the seeds both rows ran at every n.", "",
             f"Presets fedproto-mnist-n3|n4|n5 (stdev of n 2) and -s3 (stdev 3) (20 clients, n-way k-shot, k ≈ 100, "
             f"40 test samples per class): {c0.rounds} rounds x {c0.local_epochs} local epoch, batch {c0.batch_size}, "
             f"lr {c0.lr:g}, momentum {c0.momentum:g}, client fraction {c0.client_fraction:g}; seeds "
             f"{sorted({c.seed for c in runs})}. Accuracy (%) after the last round, the mean over clients of each "
             "client's accuracy on its own test samples with the model it ends the round with (its own; FedPer and "
             "FedRep: the global body with its head; FeSEM: its cluster's centre; FedAvg / FedProx: the global "
             "model); FedProto's rows use the nearest global prototype among the client's classes, `(classifier)` "
             "rows the argmax. Cells: ours mean ± std over seeds (paper, ours - paper); the paper's ± is over "
             "clients. `per client`: our final mean ± std over clients of each client's accuracy (fresh counters per "
             "client, as the official code's `LocalTest.get_result`; the mean over seeds when there are several). "
             "`official scorer`: FedProto's rows scored as the official code's `test_inference_new_het_lt` scores "
             "them, from our final per-client counts (its counters never reset: client i's figure pools the "
             "classifier and prototype passes of clients 0 to i; mean ± std over clients; the prototype rows are its "
             "\"with protos\" figure, the classifier rows its \"w/o protos\" one). Which statistic the paper reports: "
             "for FedProto and FedProto-mh the official scorer's (its ± of 0.2 to 0.5 is what pooled counters give: "
             "a per-client std is 1 to 2 here), for every baseline a per-client one (its ± of 2.4 to 6.9). ⚠ = further "
             "from the paper than the paper's ±. Parameters: uploaded per round by all clients, counted from the "
             "tensors that travelled (paper's column, x 10^3); the paper's rounds to converge in brackets (we run "
             f"every method for {c0.rounds}).", "",
             "| method | stdev | " + " | ".join(f"n = {w}" for w in WAYS)
             + " | per client (n = 3/4/5) | official scorer (n = 3/4/5) | the paper's statistic | params/round (paper) "
             "| verdicts | flag |", "|" + "---|" * (len(WAYS) + 8)]
    csv_rows = []
    for (row, stdev), got in cells.groupby(["label", "stdev"], sort=False):
        method, rule = got.method.iloc[0], got.rule.iloc[0]
        ways = list(got.itertuples())
        line = [row, str(stdev)]
        for c in ways:
            if np.isnan(c.ours):  # not run yet: the paper's value beside it
                line.append("not run" + ("" if np.isnan(c.paper) else f" ({c.paper:.2f})"))
                continue
            v = verdict_of.get((f"stdev {stdev}", method, f"n = {c.ways}")) if rule == headline_rule(method) else None
            line.append(f"{c.ours:.2f}" + ("" if np.isnan(c.std) else f" ± {c.std:.2f}")
                        + ("" if np.isnan(c.paper) else f" ({c.paper:.2f}, {c.diff:+.2f})")
                        + ("" if v is None else f" {cell_mark(v)}"))
            csv_rows.append({"profile": profile, "method": method, "rule": rule, "stdev": stdev, "ways": c.ways,
                             "shots": SHOTS, "ours_mean": round(float(c.ours), 4),
                             "ours_std": None if np.isnan(c.std) else round(float(c.std), 4),
                             "seeds": int(c.seeds), "client_std": round(float(c.client_std), 4),
                             **official_cells({"official": c.official, "official_std": c.official_std}),
                             "paper": None if np.isnan(c.paper) else c.paper,
                             "diff": None if np.isnan(c.paper) else round(float(c.diff), 4),
                             "params_per_round": int(c.params), **({} if v is None else cell_columns(v))})
        line.append(" / ".join("–" if np.isnan(c.ours) else f"{c.client_mean:.2f} ± {c.client_std:.2f}" for c in ways))
        line.append(" / ".join("–" if np.isnan(c.official) else f"{c.official:.2f} ± {c.official_std:.2f}"
                               for c in ways))
        line.append(paper_statistic(method, rule))
        line.append(" / ".join("–" if np.isnan(c.ours) else f"{c.params / 1e3:.1f}k" for c in ways)
                    + f" ({paper.FEDPROTO_COMM_PARAMS_K[method]}k; {paper.FEDPROTO_COMM_ROUNDS[method]} rounds)")
        line.append(mark_counts([cell_mark(v) for (sd, m, _), v in verdict_of.items()
                                 if (sd, m) == (f"stdev {stdev}", method)]) if rule == headline_rule(method) else "–")
        line.append("⚠" if got.far.any() else "")
        lines.append("| " + " | ".join(line) + " |")
    lines += [*(line for sd in STDEVS for line in claim_lines(ver.claims, f"stdev {sd}")
                + cell_verdict_lines(ver.cells, f"stdev {sd}")), ""]
    plan = plan_frame(ver, every, units, not_run=[])
    lines += plan_lines(plan, ver.cells, "tablefedproto")
    if far := far_from_paper(cells):
        lines += ["Cells further from the paper than its ±, and what we know of why:", "",
                  *(f"- {row}: " + "; ".join(f"stdev {c.stdev} n = {c.ways} {c.ours:.2f} vs {c.paper:.2f} ± "
                                            f"{c.paper_std:.2f} ({c.diff:+.2f}; our client std {c.client_std:.2f})"
                                            for c in got.itertuples()) + f". {why[0].upper()}{why[1:]}."
                    for row, (got, why) in far.items()), ""]
    figs = table_figures("fedproto", [Path(c.out) for c in runs], results_dir / "figures" / "tablefedproto",
                         f"{TABLES['fedproto'].title}, {profile} profile")
    splits = sorted({c.split for c in runs if c.ways_shots == SHOTS}, key=lambda sp: (len(sp), sp))
    lines += [f"![{sp}: accuracy over rounds](figures/tablefedproto/curves_{sp}.png)" for sp in splits] + [""]
    lines += figure2_lines(figs, (results_dir / "figures" / "tablefedproto" / "tsne.png").is_file())
    if shots := figure3_shots(every):
        lines += figure3_lines(agg, shots, figs["samples"] is not None)
        for row in agg[(agg.shots != SHOTS)].itertuples():
            csv_rows.append({"profile": profile, "method": row.method, "rule": row.rule, "stdev": row.stdev,
                             "ways": row.ways, "shots": row.shots, "ours_mean": round(float(row.ours), 4),
                             "ours_std": None if np.isnan(row.std) else round(float(row.std), 4),
                             "seeds": int(row.seeds), "client_std": round(float(row.client_std), 4),
                             **official_cells({"official": row.official, "official_std": row.official_std}),
                             "paper": None, "diff": None, "params_per_round": int(row.params)})
    lines += [runs_line(runs), ""]
    results_dir.mkdir(parents=True, exist_ok=True)
    out = pd.DataFrame(csv_rows)
    for name, frame in (("", out), ("-seeds", ver.seeds), ("-claims", ver.claims), ("-plan", plan)):
        atomic_write(results_dir / f"tablefedproto{name}.csv", frame.to_csv(index=False))
    atomic_write(results_dir / "tablefedproto.md", "\n".join(lines))  # the report once its data is written
    return out, figs
