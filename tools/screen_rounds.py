"""Would a shorter run rank the methods as the full protocol does? Read from finished runs' per-round accuracies
(metrics.jsonl, or the committed metrics.jsonl.gz), nothing run: per run, the full protocol's metric (the mean AVG
of its last 5 rounds) and, for a screen of R rounds, the mean AVG of the rounds among rounds R - window + 1 to R
that every run of its seed evaluated (with --eval-every 5, the window's every 5th round: what a run of R rounds
records there too; a run tested every round is read on the others' rounds, so the runs it is ranked among are
averaged over the same rounds);
per seed, each screen's order of the runs against the full one's (Kendall's tau, and whether it is the same order),
and each run's gap to the run of `--against` of its seed (a paired gap).

    python tools/screen_rounds.py results/runs/*-office_caltech-fedapc-seed* --rounds 30,40,50,60 --against fedavg

A run's label is its folder's name without `-seedN` (the method, preset and any hyperparameters the run name
carries), its seed is its config's. docs/fedapc.md uses it to choose FedAPC's screening protocol.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from scipy.stats import kendalltau

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmark.results import LAST_K, read_jsonl  # noqa: E402


def accuracies(run_dir: Path) -> dict[int, float]:
    """{round: AVG} of the rounds the run evaluated."""
    return {r["round"]: r["accuracy"]["AVG"] for r in read_jsonl(run_dir / "metrics.jsonl") if "accuracy" in r}


def full_metric(acc: dict[int, float], rounds: int) -> float:
    missing = [r for r in range(rounds - LAST_K, rounds) if r not in acc]
    if missing:
        raise SystemExit(f"error: the run lacks the evaluations of rounds {missing} (its last {LAST_K}): "
                         "is it complete?")
    return sum(acc[r] for r in range(rounds - LAST_K, rounds)) / LAST_K


def screen_metric(acc: dict[int, float], rounds: int, window: int, common: set[int]) -> float:
    """Mean AVG of the rounds in `common` (the rounds every run compared with this one evaluated) among the screen's
    last `window` rounds (0-based rounds R - window to R - 1)."""
    got = [a for r, a in acc.items() if rounds - window <= r < rounds and r in common]
    if not got:
        raise SystemExit(f"error: no round evaluated by every run of a seed among rounds {rounds - window} to "
                         f"{rounds - 1}: widen --window")
    return sum(got) / len(got)


def common_tail(labels: list[str]) -> str:
    """The `-`-separated end all labels share (their dataset and split), when each keeps a name before it."""
    parts = [lb.split("-") for lb in labels]
    k = 0
    while all(len(p) > k + 1 for p in parts) and len({tuple(p[len(p) - k - 1:]) for p in parts}) == 1:
        k += 1
    return "-" + "-".join(parts[0][len(parts[0]) - k:]) if k else ""


def table(runs: list[Path], screens: list[int], window: int, against: str | None) -> list[str]:
    read = {}  # (label, seed) -> (rounds, {round: AVG})
    for d in runs:
        cfg = json.loads((d / "config.json").read_text())
        read[(re.sub(r"-seed\d+$", "", d.name), cfg["seed"])] = (cfg["rounds"], accuracies(d))
    common = {}  # seed -> the rounds every run of that seed evaluated: a screen compares them on the same rounds
    for (_, seed), (_, acc) in read.items():
        common[seed] = common[seed] & set(acc) if seed in common else set(acc)
    rows = {key: (full_metric(acc, n), {R: screen_metric(acc, R, window, common[key[1]]) for R in screens})
            for key, (n, acc) in read.items()}  # (label, seed) -> (full, {R: screen})
    tail = common_tail([label for label, _ in rows])
    rows = {(label[:len(label) - len(tail)], seed): v for (label, seed), v in rows.items()}
    width = max(len(label) for label, _ in rows) + 2
    out = ([f"runs *{tail}" if tail else "runs"]
           + [f"{'run':{width}s}seed  full (last {LAST_K})" + "".join(f"  R={R:<4d}" for R in screens)])
    for (label, seed), (full, at) in sorted(rows.items(), key=lambda kv: (kv[0][1], -kv[1][0])):
        out.append(f"{label:{width}s}{seed:4d}  {full:13.2f}" + "".join(f"  {at[R]:6.2f}" for R in screens))
    out.append("")
    agree = {R: [] for R in screens}
    for seed in sorted({s for _, s in rows}):
        mine = {label: v for (label, s), v in rows.items() if s == seed}
        if len(mine) < 2:
            continue
        labels = sorted(mine, key=lambda lb: -mine[lb][0])
        out.append(f"seed {seed}: full order " + " > ".join(labels))
        for R in screens:
            order = sorted(mine, key=lambda lb: -mine[lb][1][R])
            tau = kendalltau([mine[lb][0] for lb in labels], [mine[lb][1][R] for lb in labels]).statistic
            agree[R].append(order == labels)
            out.append(f"  R={R}: tau {tau:+.2f}, " + ("the same order" if order == labels else
                                                      "order " + " > ".join(order)))
        if against is not None:
            ref = next((lb for lb in mine if lb.split("-")[0] == against), None)
            if ref is None:
                raise SystemExit(f"error: seed {seed} has no run of {against} to pair with (--against)")
            for lb in labels:
                if lb != ref:
                    gaps = [mine[lb][0] - mine[ref][0], *(mine[lb][1][R] - mine[ref][1][R] for R in screens)]
                    out.append(f"  {lb} - {ref}: full {gaps[0]:+.2f}"
                               + "".join(f", R={R} {g:+.2f}" for R, g in zip(screens, gaps[1:])))
    out.append("")
    out.append("the full order on every seed: " + (", ".join(f"R={R}" for R in screens if agree[R] and all(agree[R]))
                                                   or "no screen"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/screen_rounds.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="finished run folders (with config.json and metrics)")
    ap.add_argument("--rounds", required=True, help="comma-separated screen lengths R, e.g. 30,40,50,60")
    ap.add_argument("--window", type=int, default=15, help="the screen's metric: the evaluated rounds among its last "
                                                           "WINDOW (default 15: 3 rounds at --eval-every 5)")
    ap.add_argument("--against", default=None, help="a method: each run's gap to that method's run of its seed")
    args = ap.parse_args(argv)
    screens = [int(r) for r in args.rounds.split(",")]
    print("\n".join(table(args.runs, screens, args.window, args.against)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
