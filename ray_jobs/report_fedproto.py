"""`make table-fedproto`: the report of FedProto's Table 1 (AAAI 2022; MNIST, n-way k-shot, stdev 2).

    python -m ray_jobs.sweep --table fedproto [--profile full|smoke]

The runs (table "fedproto" of `ray_jobs.tables`, planned and run as every sweep's, resumable):
FedProto, FedProto-mh, FedAvg, FedProx and Local on the presets `fedproto-mnist-n3|n4|n5` (the same
split and model for all). The report: per method and n, mean ± std over seeds of the final round's
mean client accuracy, beside the paper's value (whose ± is the std over clients; ours over clients is in its
own column). FedProto's headline is its prototype inference; its classifier's argmax has a row of
its own. Parameters communicated per round are the clients' uploads, as the paper counts them: a
model per client for FedAvg / FedProx, a 50-d prototype per class held for FedProto, 0 for Local.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from benchmark import paper
from benchmark.models import build_model
from benchmark.results import atomic_write, read_jsonl, read_summary, run_complete
from lightning_modules.local import LocalServer
from lightning_modules.registry import METHODS
from ray_jobs.config import RunConfig
from ray_jobs.figures import RUNS_LINE, table_figures
from ray_jobs.tables import TABLES

WAYS = [3, 4, 5]
FEDPROTO_METHODS = ("fedproto_orig", "fedproto_mh")  # rows of both inference rules


def uploaded_params(cfg: RunConfig, clients: list[dict]) -> int:
    """Parameters the clients send per round: every client's model under weight averaging, one feature-sized
    prototype per class it holds under a prototype rule, nothing for Local."""
    method, spec = METHODS[cfg.method], cfg.dataset_spec
    net = build_model(spec.model, spec.num_classes)
    if method.server.averages_weights:
        return len(clients) * sum(p.numel() for p in net.parameters())
    if issubclass(method.server, LocalServer):
        return 0
    return sum(len(c["classes"]) for c in clients) * net.feature_dim


def collect(runs: list[RunConfig]) -> pd.DataFrame:
    """One row per run and inference rule: final mean client accuracy, std over clients, uploads per round."""
    rows = []
    for cfg in runs:
        out = Path(cfg.out)
        s, last = read_summary(out), read_jsonl(out / "metrics.jsonl")[-1]
        comm = uploaded_params(cfg, s["clients"])
        for rule in ("prototype", "classifier"):
            if rule in s["final"]:
                per_client = [a[rule] for a in last["client_accuracy"].values()]
                rows.append({"method": cfg.method, "rule": rule, "ways": int(cfg.split.removesuffix("way")),
                             "seed": cfg.seed, "acc": s["final"][rule], "client_std": float(np.std(per_client)),
                             "params": comm})
    return pd.DataFrame(rows)


def label(method: str, rule: str) -> str:
    return method if rule == "prototype" or method not in FEDPROTO_METHODS else f"{method} (classifier)"


def report(profile: str, runs: list[RunConfig], results_dir: Path) -> tuple[pd.DataFrame, dict]:
    """results_dir/tablefedproto.md and .csv, and the accuracy curves (figures/tablefedproto/); returns the
    report's rows and the figures (`figures.fedproto_figures`). Of `runs`, those complete (a partial sweep)."""
    runs = [c for c in runs if run_complete(c)]
    df = collect(runs)
    agg = df.groupby(["method", "rule", "ways"], sort=False).agg(
        ours=("acc", "mean"), std=("acc", "std"), seeds=("acc", "count"), client_std=("client_std", "mean"),
        params=("params", "mean")).reset_index()
    c0 = runs[0]
    title = f"# {TABLES['fedproto'].title}: reproduction ({profile} profile"
    title += ", SMOKE SETTINGS: not comparable to the paper)" if profile == "smoke" else ")"
    lines = [title, "",
             f"Presets fedproto-mnist-n3|n4|n5 (20 clients, n-way k-shot, k ≈ 100, 40 test samples per class): "
             f"{c0.rounds} rounds x {c0.local_epochs} local epoch, batch {c0.batch_size}, lr {c0.lr:g}, momentum "
             f"{c0.momentum:g}, client fraction {c0.client_fraction:g}; seeds {sorted({c.seed for c in runs})}. Accuracy (%) after the last round, the mean over clients of each client's "
             "accuracy on its own test samples with its own model (FedAvg / FedProx: the global model); FedProto's "
             "rows use the nearest global prototype among the client's classes, `(classifier)` rows the argmax. "
             "Cells: ours mean ± std over seeds (paper, ours - paper); the paper's ± is over clients, ours over "
             "clients is the column `client std`. ⚠ = further from the paper than the paper's ± (its std over "
             "clients). Parameters: "
             "uploaded per round by all clients (paper's column, x 10^3).", "",
             "| method | " + " | ".join(f"n = {w}" for w in WAYS) + " | client std (n = 3/4/5) | params/round (paper) "
             "| flag |", "|" + "---|" * (len(WAYS) + 4)]
    csv_rows = []
    for (method, rule), sub in agg.groupby(["method", "rule"], sort=False):
        sub = sub.set_index("ways")
        cells, flag = [label(method, rule)], False
        for w in WAYS:
            if w not in sub.index:  # a partial sweep
                cells.append("not run")
                continue
            ours, std = sub.loc[w, "ours"], sub.loc[w, "std"]
            pv, pstd = (paper.FEDPROTO_TABLE1[method][w] if rule == "prototype" or method not in FEDPROTO_METHODS
                        else (None, None))
            diff = None if pv is None else ours - pv
            flag |= diff is not None and abs(diff) > pstd
            std_s = "" if np.isnan(std) else f" ± {std:.2f}"
            cells.append(f"{ours:.2f}{std_s}" + ("" if pv is None else f" ({pv:.2f}, {diff:+.2f})"))
            csv_rows.append({"profile": profile, "method": method, "rule": rule, "ways": w,
                             "ours_mean": round(float(ours), 4), "ours_std": None if np.isnan(std) else round(float(std), 4),
                             "seeds": int(sub.loc[w, "seeds"]), "client_std": round(float(sub.loc[w, "client_std"]), 4),
                             "paper": pv, "diff": None if diff is None else round(float(diff), 4),
                             "params_per_round": int(sub.loc[w, "params"])})
        cells.append(" / ".join(f"{sub.loc[w, 'client_std']:.2f}" if w in sub.index else "–" for w in WAYS))
        cells.append(" / ".join(f"{sub.loc[w, 'params'] / 1e3:.1f}k" if w in sub.index else "–" for w in WAYS)
                     + f" ({paper.FEDPROTO_COMM_PARAMS_K[method]}k)")
        cells.append("⚠" if flag else "")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    figs = table_figures("fedproto", [Path(c.out) for c in runs], results_dir / "figures" / "tablefedproto",
                         f"{TABLES['fedproto'].title}, {profile} profile")
    lines += [f"![n = {w}: accuracy over rounds](figures/tablefedproto/curves_{w}way.png)" for w in WAYS] + [""]
    lines += [RUNS_LINE + ", ".join(sorted({c.run_name for c in runs})), ""]
    results_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(results_dir / "tablefedproto.md", "\n".join(lines))
    out = pd.DataFrame(csv_rows)
    atomic_write(results_dir / "tablefedproto.csv", out.to_csv(index=False))
    return out, figs
