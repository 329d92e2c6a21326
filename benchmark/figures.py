"""Figures from run folders: accuracy over rounds, per-domain bars beside the paper, accuracy against a
hyperparameter's value (a grid), t-SNE feature maps.

Every plotting function reads run folders (config.json, metrics.jsonl, summary.json,
model.pt), writes PNG (and SVG) files and returns the numbers it plotted, so they
can be checked against the runs. Drawing uses matplotlib's object API on the Agg
canvas: headless, no pyplot state, safe from the sweep's threads. The command line
(`make figures`, t-SNE of runs) and a table's report figures are `ray_jobs.figures`.
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from benchmark import paper
from benchmark.data import DATASETS, domain_test_set, load_domain, resolve_data_root
from benchmark.fewshot import SHOTS
from benchmark.protocols import DATASET_SPECS
from benchmark.results import FEATURES_FILE, LATER_HPARAMS, MODEL_FILE, atomic_write, in_memory, read_jsonl

FORMATS = ("png", "svg")
# byte-stable files: an SVG carries no date and hashes its ids with a fixed salt (matplotlib's default salt is
# random), so drawing a report's figures again changes a file only when what it shows changed
SAVE_METADATA = {"svg": {"Date": None}}
SVG_SALT = "fedproto-bench"
DEMO_RUNS = ("demo-fedavg-office_caltech", "demo-fpl-office_caltech")
MARKERS = "osD^vP*X"
PROTOTYPE_MARKERS = {"local prototype": ("o", 45), "global prototype": ("*", 260)}  # t-SNE: marker, size


class FigureError(RuntimeError):
    """A figure cannot be drawn from the given run folders; the message says why."""


def _config(run_dir: Path) -> dict:
    try:
        return json.loads((Path(run_dir) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise FigureError(f"{run_dir} is not a run folder (no readable config.json: {e}).") from None


def _save(fig: Figure, stem: Path, formats=FORMATS) -> list[Path]:
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    paths = []
    for fmt in formats:
        path = stem.with_name(f"{stem.name}.{fmt}")
        with matplotlib.rc_context({"svg.hashsalt": SVG_SALT}):
            atomic_write(path, in_memory(lambda f: fig.savefig(f, format=fmt, dpi=100, bbox_inches="tight",
                                                               metadata=SAVE_METADATA.get(fmt))))
        paths.append(path)
    return paths


def _summary(run_dir: Path) -> dict:
    try:
        return json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        raise FigureError(f"{run_dir} has no summary.json: the run is not complete; finish it first.") from None


def _colors(methods: list[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(methods) <= 10 else "tab20"]
    return {m: cmap(i) for i, m in enumerate(methods)}


def _panel_domains(domains) -> list[str]:
    """AVG first, then the domains in the order the runs report them."""
    domains = list(dict.fromkeys(domains))
    return ["AVG", *[d for d in domains if d != "AVG"]]


# --------------------------------------------------------------------------- accuracy over rounds

def load_rounds(run_dirs) -> pd.DataFrame:
    """One row per (run, round, domain): method, dataset, seed, round (1-based), accuracy (%)."""
    rows = []
    for run_dir in run_dirs:
        cfg = _config(run_dir)
        for rec in read_jsonl(Path(run_dir) / "metrics.jsonl"):
            for dom, acc in rec.get("accuracy", {}).items():  # the evaluated rounds
                rows.append({"run": cfg["run_name"], "method": cfg["method"], "dataset": cfg["dataset"],
                             "seed": cfg["seed"], "round": rec["round"] + 1, "domain": dom, "accuracy": acc})
    if not rows:
        raise FigureError(f"no round recorded in {', '.join(str(d) for d in run_dirs)}.")
    return pd.DataFrame(rows)


def curve_data(run_dirs) -> pd.DataFrame:
    """Per dataset, method, domain and round: mean and std (over seeds) of the accuracy, and the seed count."""
    g = load_rounds(run_dirs).groupby(["dataset", "method", "domain", "round"], sort=False)["accuracy"]
    return g.agg(mean="mean", std="std", seeds="count").reset_index()


def plot_curves(run_dirs, stem: Path, title: str = "", formats=FORMATS) -> pd.DataFrame:
    """Accuracy over rounds: a row of panels per dataset (AVG, then each domain), a line per method
    (mean over seeds) with a band of ± one std where there are several seeds. Returns `curve_data`."""
    data = curve_data(run_dirs)
    datasets = list(dict.fromkeys(data.dataset))
    colors = _colors(list(dict.fromkeys(data.method)))
    ncols = max(len(_panel_domains(data[data.dataset == ds].domain)) for ds in datasets)
    fig = Figure(figsize=(3.2 * ncols, 2.8 * len(datasets) + 0.6), layout="constrained")
    axes = fig.subplots(len(datasets), ncols, squeeze=False)
    for i, ds in enumerate(datasets):
        sub = data[data.dataset == ds]
        doms = _panel_domains(sub.domain)
        for j, ax in enumerate(axes[i]):
            if j >= len(doms):
                ax.set_axis_off()
                continue
            for m, c in colors.items():
                line = sub[(sub.method == m) & (sub.domain == doms[j])]
                if line.empty:
                    continue
                ax.plot(line["round"], line["mean"], color=c, marker="." if len(line) < 30 else None, label=m)
                if (line.seeds > 1).any():
                    ax.fill_between(line["round"], line["mean"] - line["std"], line["mean"] + line["std"],
                                    color=c, alpha=0.2)
            ax.set_title(f"{ds}: {doms[j]}", fontsize=10)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("round")
            ax.set_ylabel("accuracy (%)")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 8), fontsize=9)
    fig.suptitle(title or "accuracy of the global model over rounds (mean over seeds, band: ± std)", fontsize=11)
    _save(fig, stem, formats)
    return data


# --------------------------------------------------------------------------- local prototypes per class

def local_prototype_data(run_dirs) -> pd.DataFrame:
    """Per dataset, domain and round (1-based): the mean over the domain's clients and the runs' seeds of the
    prototypes a client uploads per class it holds (metrics.jsonl's `local_prototypes_per_class`)."""
    rows = []
    for run_dir in run_dirs:
        cfg = _config(run_dir)
        domain = {str(c["id"]): c["domain"]
                  for c in json.loads((Path(run_dir) / "summary.json").read_text())["clients"]}
        for rec in read_jsonl(Path(run_dir) / "metrics.jsonl"):
            for cid, n in rec.get("local_prototypes_per_class", {}).items():
                rows.append({"dataset": cfg["dataset"], "domain": domain[cid], "seed": cfg["seed"],
                             "round": rec["round"] + 1, "count": n})
    if not rows:
        raise FigureError(f"no local prototype count recorded in {', '.join(str(d) for d in run_dirs)} (runs made "
                          "before 2026-11-24 do not record it: run them again).")
    return pd.DataFrame(rows).groupby(["dataset", "domain", "round"], sort=False)["count"].mean().reset_index()


def plot_local_prototypes(run_dirs, stem: Path, title: str = "", formats=FORMATS) -> pd.DataFrame:
    """FedPLVM's Figure 9: the mean number of local clustered prototypes per class over rounds, a line per domain,
    a panel per dataset. Returns `local_prototype_data`."""
    data = local_prototype_data(run_dirs)
    datasets = list(dict.fromkeys(data.dataset))
    fig = Figure(figsize=(4.2 * len(datasets), 3.2), layout="constrained")
    for ax, ds in zip(fig.subplots(1, len(datasets), squeeze=False)[0], datasets):
        sub = data[data.dataset == ds]
        for marker, dom in zip(MARKERS, dict.fromkeys(sub.domain)):
            line = sub[sub.domain == dom]
            ax.plot(line["round"], line["count"], marker=marker, markevery=max(1, len(line) // 10), label=dom)
        ax.set_title(ds, fontsize=10)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel("local prototypes per class")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or "local clustered prototypes per class (mean over the domain's clients and seeds)",
                 fontsize=11)
    _save(fig, stem, formats)
    return data


# --------------------------------------------------------------------------- per-domain bars

def bar_data(run_dirs, reference: dict | None, metric: str = "last5") -> pd.DataFrame:
    """Per dataset, method and domain: our accuracy by `metric` (last5 or final; mean, std over seeds, seed
    count) from the runs' summary.json and the paper's value from `reference` (a table of benchmark.paper;
    NaN where none)."""
    rows = []
    for run_dir in run_dirs:
        s = _summary(run_dir)
        for dom, acc in s[metric].items():
            rows.append({"dataset": s["dataset"], "method": s["method"], "domain": dom, "seed": s["seed"], "acc": acc,
                         "domains": tuple(s["domains"])})
    df = pd.DataFrame(rows)
    out = df.groupby(["dataset", "method", "domain"], sort=False).agg(
        ours=("acc", "mean"), std=("acc", "std"), seeds=("acc", "count"), domains=("domains", "first")).reset_index()
    refs = [paper.reference(reference or {}, r.method, r.dataset, list(r.domains), list(DATASETS[r.dataset]))
            for r in out.itertuples()]  # a paper table with AVG only (FedPLVM's 4, 5): no per-domain value
    out["paper"] = [np.nan if ref is None else ref.get(r.domain, np.nan) for ref, r in zip(refs, out.itertuples())]
    return out.drop(columns="domains")


def plot_bars(run_dirs, reference: dict | None, stem: Path, title: str = "", formats=FORMATS,
              metric: str = "last5") -> pd.DataFrame:
    """Per-domain bars: a panel per dataset and domain (AVG first), per method our accuracy by `metric`
    (error bar: std over seeds) beside the paper's (hatched). Returns `bar_data`."""
    data = bar_data(run_dirs, reference, metric)
    datasets = list(dict.fromkeys(data.dataset))
    methods = list(dict.fromkeys(data.method))
    colors = _colors(methods)
    ncols = max(len(_panel_domains(data[data.dataset == ds].domain)) for ds in datasets)
    fig = Figure(figsize=(max(3.2, 0.45 * len(methods) + 1) * ncols, 3.2 * len(datasets) + 0.6), layout="constrained")
    axes = fig.subplots(len(datasets), ncols, squeeze=False)
    for i, ds in enumerate(datasets):
        sub = data[data.dataset == ds].set_index(["method", "domain"])
        doms = _panel_domains(data[data.dataset == ds].domain)
        ms = [m for m in methods if (m, "AVG") in sub.index]
        x = np.arange(len(ms))
        for j, ax in enumerate(axes[i]):
            if j >= len(doms):
                ax.set_axis_off()
                continue
            cells = sub.loc[[(m, doms[j]) for m in ms]]
            ax.bar(x - 0.2, cells["ours"], 0.4, yerr=cells["std"].fillna(0), color=[colors[m] for m in ms],
                   capsize=2, label="ours")
            ax.bar(x + 0.2, cells["paper"].fillna(0), 0.4, color=[colors[m] for m in ms], alpha=0.35, hatch="//",
                   edgecolor="grey", label="paper")
            ax.set_xticks(x, ms, rotation=45, ha="right", fontsize=8)
            ax.set_title(f"{ds}: {doms[j]}", fontsize=10)
            ax.set_ylabel("accuracy (%)")
            ax.set_ylim(0, 100)
            ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="upper left")
    fig.suptitle(title or "last-5-round accuracy: ours (solid, ± std over seeds) beside the paper (hatched)",
                 fontsize=11)
    _save(fig, stem, formats)
    return data


# --------------------------------------------------------------------------- accuracy against a hyperparameter

def grid_data(run_dirs, hparam: str, metric: str = "final", value_of=None, domains=None) -> pd.DataFrame:
    """Per dataset, method, value of `hparam` (the run's recorded hparams; a run recorded before the hyperparameter
    existed: its LATER_HPARAMS value; or `value_of(summary)`, a value the run's protocol fixes) and domain (those of
    `domains`, or every one): our accuracy by `metric` from summary.json, the mean, std over seeds and the seed count;
    in the order of the value."""
    rows = []
    for run_dir in run_dirs:
        s = _summary(run_dir)
        value = value_of(s) if value_of else s["hparams"].get(hparam, LATER_HPARAMS.get(hparam))
        if value is None:
            raise FigureError(f"{run_dir}: {s['method']} has no hyperparameter {hparam!r}.")
        for dom, acc in s[metric].items():
            if domains is None or dom in domains:
                rows.append({"dataset": s["dataset"], "method": s["method"], "value": value, "domain": dom,
                             "seed": s["seed"], "acc": acc})
    if not rows:
        raise FigureError("no run to draw.")
    df = pd.DataFrame(rows)
    return df.groupby(["dataset", "method", "value", "domain"], sort=False).agg(
        mean=("acc", "mean"), std=("acc", "std"), seeds=("acc", "count")).reset_index().sort_values(
        "value", kind="stable", ignore_index=True)  # each line's points in the order of the value


def plot_grid(run_dirs, hparam: str, stem: Path, title: str = "", formats=FORMATS, metric: str = "final",
              defaults: dict | None = None, value_of=None, domains=None) -> pd.DataFrame:
    """Accuracy against a hyperparameter's value (FedPLVM's Figures 4 and 5; FedProto's Figure 3 against a protocol's
    value, `value_of`, `hparam` naming the axis): a panel per dataset, a line per method (line style) and domain
    (colour; AVG black and thick; `domains`: only those), the mean over seeds with ± std error bars; `defaults`
    (method -> its default value) dotted vertical lines, named; the x axis logarithmic when the values span two
    decades or more. Returns `grid_data`."""
    from matplotlib import colormaps

    data = grid_data(run_dirs, hparam, metric, value_of, domains)
    datasets, methods = list(dict.fromkeys(data.dataset)), list(dict.fromkeys(data.method))
    values = sorted(set(data.value))
    log_x = min(values) > 0 and max(values) / min(values) >= 100
    styles = dict(zip(methods, ["-", "--", ":", "-."]))
    fig = Figure(figsize=(5.2 * len(datasets), 4.0), layout="constrained")
    for ax, ds in zip(fig.subplots(1, len(datasets), squeeze=False)[0], datasets):
        sub = data[data.dataset == ds]
        doms = [d for d in dict.fromkeys(sub.domain) if d != "AVG"]
        colors = {"AVG": "black", **{d: colormaps["tab10"](i) for i, d in enumerate(doms)}}
        for m in methods:
            for k, dom in enumerate(["AVG", *doms]):
                line = sub[(sub.method == m) & (sub.domain == dom)]
                if line.empty:
                    continue
                ax.errorbar(line["value"], line["mean"], yerr=line["std"].fillna(0), color=colors[dom],
                            ls=styles[m], marker=MARKERS[k % len(MARKERS)], lw=2.2 if dom == "AVG" else 1.1,
                            ms=5, capsize=2, label=f"{m}: {dom}" if len(methods) > 1 else dom)
        for m, v in (defaults or {}).items():
            if m in methods:
                ax.axvline(v, color="grey", ls=":", lw=1)
                ax.text(v, 0.99, f" {m}'s default", transform=ax.get_xaxis_transform(), fontsize=7, color="grey",
                        va="top", rotation=90)
        if log_x:
            ax.set_xscale("log")
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.minorticks_off()
        ax.set_title(ds, fontsize=10)
        ax.set_xlabel(hparam)
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncols=len(methods), loc="upper center",
                  bbox_to_anchor=(0.5, -0.2))  # below the axis label
    fig.suptitle(title or f"accuracy against {hparam} (mean over seeds, error bars: ± std)", fontsize=11)
    _save(fig, stem, formats)
    return data


# --------------------------------------------------------------------------- t-SNE feature maps

def load_model(run_dir: Path):
    """The run's final global model (model.pt, float16) as a float32 model of its dataset's protocol, in eval mode."""
    import torch

    from benchmark.models import build_model

    path = Path(run_dir) / MODEL_FILE
    if not path.is_file():
        raise FigureError(f"{run_dir} has no {MODEL_FILE}: only a run that finished (with this version) saves its "
                          "final model; finish it (its command with --resume) to draw its feature map.")
    cfg = _config(run_dir)
    spec = DATASET_SPECS[cfg["dataset"]]
    model = build_model(spec.model, spec.num_classes, **cfg.get("model_options", {}))  # (GroupNorm under DP-SGD)
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return model.eval()


def saved_features(run_dir: Path, per_domain: int) -> pd.DataFrame:
    """A run's FEATURES_FILE (per-client test samples, FedProto's protocol): at most `per_domain` of its clients'
    test samples (a seed-0 pick) and every local and global prototype; columns kind ("sample", "local prototype",
    "global prototype"), domain, label, client (-1: global), f0..f49."""
    cfg = _config(run_dir)
    with np.load(Path(run_dir) / FEATURES_FILE) as f:
        arrays = {k: f[k] for k in f.files}
    keep = np.sort(np.random.default_rng(0).permutation(len(arrays["y"]))[:per_domain])
    parts = [("sample", arrays["z"][keep], arrays["y"][keep], arrays["client"][keep])]
    if "local_z" in arrays:
        parts.append(("local prototype", arrays["local_z"], arrays["local_y"], arrays["local_client"]))
    if "global_z" in arrays:
        parts.append(("global prototype", arrays["global_z"], arrays["global_y"], np.full(len(arrays["global_y"]), -1)))
    frames = []
    for kind, z, y, client in parts:
        part = pd.DataFrame(z.astype(np.float32), columns=[f"f{i}" for i in range(z.shape[1])])
        part.insert(0, "client", client)
        part.insert(0, "label", y)
        part.insert(0, "domain", cfg["domains"][0])
        part.insert(0, "kind", kind)
        frames.append(part)
    return pd.concat(frames, ignore_index=True)


def test_features(run_dir: Path, per_domain: int, data_root: str | None = None) -> pd.DataFrame:
    """Features of the run's final models on its test sets: its FEATURES_FILE when it has one (`saved_features`:
    each client's own test samples with the model it ended with, and the prototypes), else the final global model's
    (model.pt) on the domains' test sets (the same subset the run evaluated, at most `per_domain` images per domain,
    a fixed seed-0 pick): columns kind, domain, label, f0..f511."""
    import torch

    if (Path(run_dir) / FEATURES_FILE).is_file():
        return saved_features(run_dir, per_domain)
    cfg, model = _config(run_dir), load_model(run_dir)
    spec = DATASET_SPECS[cfg["dataset"]]
    root = resolve_data_root(data_root or cfg.get("data_root"))
    parts = []
    for dom in cfg["domains"]:
        # under a label skew the run's config.json holds each domain's test class counts (its clients')
        drawn = next((c["test_class_counts"] for c in cfg.get("clients", []) if c["domain"] == dom
                      and "test_class_counts" in c), None)
        per_class = spec.per_class if drawn is None else (np.zeros(len(drawn), np.int64), np.asarray(drawn))
        d = load_domain(root, cfg["dataset"], dom, need_train=False, per_class=per_class)
        x, y = domain_test_set(d, spec, cfg.get("eval_max"), per_domain)
        with torch.no_grad():
            z = torch.cat([model.features(spec.transform.eval(x[i : i + 500])) for i in range(0, len(x), 500)]).numpy()
        part = pd.DataFrame(z, columns=[f"f{i}" for i in range(z.shape[1])])
        part.insert(0, "label", y.numpy())
        part.insert(0, "domain", dom)
        part.insert(0, "kind", "sample")
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def plot_tsne(run_dirs, stem: Path, per_domain: int = 300, data_root: str | None = None,
              formats=FORMATS, title: str | None = None) -> dict[str, pd.DataFrame]:
    """t-SNE (scikit-learn, seed 0) of each run's test features (`test_features`), a panel per run side by side,
    coloured by class and marked by domain; a run's local prototypes (circles) and global ones (large stars), when it
    saved them, are embedded with its samples (FedProto's Figure 2). Returns {run name: DataFrame(kind, domain,
    label, x, y)}."""
    from matplotlib import colormaps
    from matplotlib.lines import Line2D
    from sklearn.manifold import TSNE

    maps = {}
    for run_dir in run_dirs:
        feats = test_features(run_dir, per_domain, data_root)
        z = feats.filter(regex=r"^f\d+$").to_numpy()
        xy = TSNE(2, perplexity=min(30.0, (len(z) - 1) / 3), init="pca", random_state=0).fit_transform(z)
        maps[_config(run_dir)["run_name"]] = feats[["kind", "domain", "label"]].assign(x=xy[:, 0], y=xy[:, 1])
    fig = Figure(figsize=(5 * len(maps) + 1.5, 5), layout="constrained")
    axes = fig.subplots(1, len(maps), squeeze=False)[0]
    cmap = colormaps["tab10"]
    domains = list(dict.fromkeys(d for m in maps.values() for d in m.domain))
    for ax, (name, m) in zip(axes, maps.items()):
        for k, dom in enumerate(domains):
            pts = m[(m.domain == dom) & (m.kind == "sample")]
            ax.scatter(pts.x, pts.y, c=[cmap(int(c) % 10) for c in pts.label], marker=MARKERS[k % len(MARKERS)],
                       s=10, alpha=0.7, linewidths=0)
        for kind, (marker, size) in PROTOTYPE_MARKERS.items():
            pts = m[m.kind == kind]
            ax.scatter(pts.x, pts.y, c=[cmap(int(c) % 10) for c in pts.label], marker=marker, s=size,
                       edgecolors="black", linewidths=0.8)
        ax.set_title(name, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    handles = [Line2D([], [], ls="", marker="o", color=cmap(c), label=f"class {c}") for c in range(10)]
    handles += [Line2D([], [], ls="", marker=MARKERS[k % len(MARKERS)], color="k", label=d)
                for k, d in enumerate(domains)]
    kinds = {k for m in maps.values() for k in m.kind}
    handles += [Line2D([], [], ls="", marker=marker, color="w", markeredgecolor="k", markersize=size ** 0.5, label=kind)
                for kind, (marker, size) in PROTOTYPE_MARKERS.items() if kind in kinds]
    fig.legend(handles=handles, loc="outside right center", fontsize=8)
    fig.suptitle(title or "t-SNE of the final models' test features (colour: class, marker: domain)", fontsize=11)
    _save(fig, stem, formats)
    return maps


# --------------------------------------------------------------------------- a table's and the demo's figures

FIGURE2_SAMPLES = 800  # FedProto's Figure 2: test samples per run (of its 20 clients' about 2,400), seed-0 pick


def fedproto_figures(run_dirs, out_dir: Path, title: str = "") -> dict:
    """FedProto Tables 1 and 2's and Figures 2 and 3's figures in out_dir: per split of the tables (n and its stdev,
    k = 100) the mean client accuracy over rounds (AVG, classifier, prototype panels), curves_<split>.{png,svg}; when
    there are runs with other k, Figure 3: the final mean client accuracy (AVG) of FedProto and FedAvg at n = 3
    (stdev 2) against the training samples per class k, samples.{png,svg}; when Figure 2's runs (n = 3) saved their
    features (FEATURES_FILE), Figure 2: their t-SNE maps side by side with FedProto's local and global prototypes,
    tsne.{png,svg}. Returns {"curves": the curve data of every split, its split in the `dataset` column, "samples":
    Figure 3's `grid_data`, "tsne": Figure 2's `plot_tsne` maps (each None without it), "tsne_lacking": the names of
    Figure 2's runs that lack their features (not drawn), "files": [paths]}."""
    ways = DATASET_SPECS["mnist"].ways
    configs = {Path(d): _config(d) for d in run_dirs}
    splits = {d: c["split"] for d, c in configs.items() if ways[c["split"]][2] == SHOTS}
    curves, files = [], []
    for split in sorted(set(splits.values())):
        stem = Path(out_dir) / f"curves_{split}"
        data = plot_curves([d for d, s in splits.items() if s == split], stem,
                           f"{title}, {split}: mean client accuracy over rounds (mean over seeds, band: ± std)")
        curves.append(data.assign(dataset=split))
        files += [stem.with_name(f"{stem.name}.{f}") for f in FORMATS]
    figure3 = [d for d, c in configs.items()
               if c["method"] in paper.FEDPROTO_FIGURE3 and ways[c["split"]][:2] == (3, 2)]
    samples = None
    if any(ways[configs[d]["split"]][2] != SHOTS for d in figure3):
        stem = Path(out_dir) / "samples"
        samples = plot_grid(figure3, "training samples per class (k)", stem,
                            f"{title}:\nFigure 3, n = 3: final mean client accuracy against k (mean over seeds, "
                            "error bars: ± std)", value_of=lambda s: ways[s["split"]][2], domains=("AVG",))
        files += [stem.with_name(f"{stem.name}.{f}") for f in FORMATS]
    # Figure 2: the runs of its methods at n = 3 (stdev 2, k = 100) that saved their features, in its panel order
    figure2_runs = [d for d, c in configs.items() if c["split"] == "3way" and c["method"] in paper.FEDPROTO_FIGURE2]
    saved = {d: (d / FEATURES_FILE).is_file() for d in figure2_runs}
    figure2 = {configs[d]["method"]: d for d in figure2_runs if saved[d]}
    tsne = None
    if figure2:
        stem = Path(out_dir) / "tsne"
        tsne = plot_tsne([figure2[m] for m in paper.FEDPROTO_FIGURE2 if m in figure2], stem, FIGURE2_SAMPLES,
                         title=f"{title}:\nFigure 2, n = 3: t-SNE of {FIGURE2_SAMPLES} test samples' features, each "
                         "through its client's final model (colour: class), and the local and global prototypes")
        files += [stem.with_name(f"{stem.name}.{f}") for f in FORMATS]
    return {"curves": pd.concat(curves, ignore_index=True) if curves else None, "samples": samples, "tsne": tsne,
            "tsne_lacking": [d.name for d in figure2_runs if not saved[d]],
            "files": files}


def demo_figures(run_dirs, out_dir: Path) -> list[Path]:
    """The demo's accuracy curves and FedAvg-vs-FPL feature map, PNG only (shown in the README)."""
    out_dir = Path(out_dir)
    plot_curves(run_dirs, out_dir / "curves", "make demo: FedAvg vs FPL on Office-Caltech-10", formats=("png",))
    plot_tsne(run_dirs, out_dir / "tsne", per_domain=150, formats=("png",))
    return [out_dir / "curves.png", out_dir / "tsne.png"]
