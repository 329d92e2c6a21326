"""Every figure of a table's report, and `make figures`: all of them again from the run folders, no training.

    python -m ray_jobs.figures all [RESULTS_DIR ...]    # every table report's figures, and the demo's
    python -m ray_jobs.figures tsne RUN_DIR [RUN_DIR]   # t-SNE of finished runs' test features, side by side

The plots themselves are `benchmark.figures`'; this module knows the tables (their metric and the paper's numbers).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmark.data import DataError
from benchmark.figures import (DEMO_RUNS, FORMATS, FigureError, demo_figures, fedproto_figures, plot_bars, plot_curves,
                               plot_grid, plot_local_prototypes, plot_tsne)
from benchmark.results import MODEL_FILE, read_jsonl
from lightning_modules.registry import METHODS
from ray_jobs.cli import OneLineParser
from ray_jobs.tables import METRICS, TABLES, make_target

RUNS_LINE = "Runs: "  # the last line of a table report (ray_jobs.report) lists its runs


def runs_line(runs) -> str:
    """A report's line of its runs (RunConfigs), in the table's order (its rows, then their seeds): the order its
    figures draw the methods and datasets in, which `regenerate` reads back."""
    return RUNS_LINE + ", ".join(dict.fromkeys(c.run_name for c in runs))


def listed_runs(md: Path) -> list[str]:
    """The run names of a table report's (last) runs line, [] without one."""
    names = [ln[len(RUNS_LINE):].split(", ") for ln in Path(md).read_text().splitlines() if ln.startswith(RUNS_LINE)]
    return names[-1] if names else []


def table_figures(table: str, run_dirs, out_dir: Path, title: str = "") -> dict:
    """A table report's figures in out_dir: curves.{png,svg} and bars.{png,svg} beside the paper's table; a grid
    table's (FedPLVM's Figures 4 and 5) grid.{png,svg}, accuracy against the hyperparameter's value. Returns
    {"curves": curve data, "bars": bar data, "files": [paths]} ({"grid": grid data, "files": [paths]})."""
    out_dir = Path(out_dir)
    if table == "fedproto":  # FedProto's Tables 1 and 2: no domains, one split per n and stdev
        return fedproto_figures(run_dirs, out_dir, title)
    spec = TABLES[table]
    if spec.grid is not None:
        name = spec.grid[0]
        methods = dict.fromkeys(m for m, _ in spec.row_list())
        grid = plot_grid(run_dirs, name, out_dir / "grid", f"{title}:\n{METRICS[spec.metric]} against {name} (mean "
                         "over seeds, error bars: ± std)", metric=spec.metric,
                         defaults={m: METHODS[m].defaults[name] for m in methods})
        return {"grid": grid, "files": [out_dir / f"grid.{f}" for f in FORMATS]}
    curves = plot_curves(run_dirs, out_dir / "curves", f"{title}: accuracy over rounds (mean over seeds, band: ± std)")
    bars = plot_bars(run_dirs, spec.paper, out_dir / "bars",
                     f"{title}: {METRICS[spec.metric]}, ours (solid, ± std) beside the paper (hatched)",
                     metric=spec.metric)
    files = [out_dir / f"{n}.{f}" for n in ("curves", "bars") for f in FORMATS]
    out = {"curves": curves, "bars": bars}
    counted = [d for d in run_dirs if spec.prototype_count_figure
               and json.loads((Path(d) / "config.json").read_text())["method"] == spec.prototype_count_figure
               and "local_prototypes_per_class" in read_jsonl(Path(d) / "metrics.jsonl")[-1]]
    if counted:  # FedPLVM's Figure 9 (runs made before 2026-11-24 do not record the counts)
        out["local_prototypes"] = plot_local_prototypes(
            counted, out_dir / "local_prototypes", f"{title}: {spec.prototype_count_figure}'s local clustered "
            "prototypes per class over rounds (mean over the domain's clients and seeds)")
        files += [out_dir / f"local_prototypes.{f}" for f in FORMATS]
    return {**out, "files": files}


def regenerate(results_dirs) -> list[Path]:
    """Redraw every table report's figures (results_dir/table<N>.md -> results_dir/figures/table<N>/) from
    the run folders it lists, and the demo's when its run folders exist. Nothing is trained."""
    written = []
    for results_dir in map(Path, results_dirs):
        for md in sorted(results_dir.glob("table*.md")):
            table = md.stem.removeprefix("table").removeprefix("-")  # table2 -> 2, table-fedapc -> fedapc
            run_dirs = [results_dir / "runs" / n for n in listed_runs(md)]
            missing = [d.name for d in run_dirs if not (d / "summary.json").is_file()]
            head = md.read_text().splitlines()[0].lstrip("# ")
            smoke = "smoke profile" in head
            if not run_dirs or missing:
                print(f"skipped {md}: {len(missing)} of {len(run_dirs)} run folders missing or incomplete under "
                      f"{results_dir / 'runs'} (run `make {make_target(table)}{' PROFILE=smoke' if smoke else ''}` to "
                      "make them)")
                continue
            title = f"{TABLES[table].title}, {'smoke' if smoke else 'full'} profile"  # as the report titles them
            written += table_figures(table, run_dirs, results_dir / "figures" / md.stem, title)["files"]
    demo = [Path("results/runs") / n for n in DEMO_RUNS]
    if all((d / MODEL_FILE).is_file() for d in demo):
        written += demo_figures(demo, Path("results/figures/demo"))
    return written


def build_parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m ray_jobs.figures", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{tsne,all}",
                            help="tsne: t-SNE maps of finished runs; all: every figure again from run folders")
    t = sub.add_parser("tsne", help="t-SNE of finished runs' test features, side by side")
    t.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    t.add_argument("--out", type=Path, default=None,
                   help="PNG path (an SVG is written beside it); default RUN_DIR/tsne.png, or tsne-A-vs-B.png beside "
                        "the runs")
    t.add_argument("--per-domain", type=int, default=300, help="test images per domain (of those the run evaluated)")
    t.add_argument("--data-root", default=None, help="default: the run's data root, else the usual lookup")
    a = sub.add_parser("all", help="redraw every figure from existing run folders (make figures)")
    a.add_argument("results_dirs", nargs="*", type=Path,
                   help="default: results and results/smoke, those of them that exist")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "tsne":
            if args.per_domain < 2:
                raise FigureError(f"--per-domain must be at least 2 (got {args.per_domain}).")
            names = [d.name for d in args.run_dirs]
            out = args.out or (args.run_dirs[0] / "tsne.png" if len(names) == 1
                               else args.run_dirs[0].parent / f"tsne-{'-vs-'.join(names)}.png")
            plot_tsne(args.run_dirs, out.with_suffix(""), args.per_domain, args.data_root)
            print(f"written: {out}, {out.with_suffix('.svg')}")
        else:
            dirs = args.results_dirs or [d for d in (Path("results"), Path("results/smoke")) if d.is_dir()]
            absent = [str(d) for d in dirs if not d.is_dir()]
            if absent:
                raise FigureError(f"{', '.join(absent)}: no such folder; name results folders that hold table "
                                  "reports (table*.md and runs/), e.g. results.")
            files = regenerate(dirs)
            print(f"written {len(files)} figure files" + "".join(f"\n  {f}" for f in files) + (
                "" if files else f" ({', '.join(map(str, dirs))}: no table report (table*.md) with its runs, and no "
                                 "demo run folders; `figures tsne RUN_DIR` draws a run's own map)"))
    except (FigureError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
