"""tools/screen_rounds.py: a shorter run's metric and order beside the full protocol's, by hand on written runs."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import screen_rounds  # noqa: E402


def write_run(root: Path, name: str, seed: int, avg: dict[int, float], rounds: int = 10) -> Path:
    d = root / f"{name}-office_caltech-fedapc-seed{seed}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"method": name, "seed": seed, "rounds": rounds}))
    rows = [{"round": r, "evaluated": r in avg, **({"accuracy": {"AVG": avg[r]}} if r in avg else {})}
            for r in range(rounds)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_full_and_screen_metrics_orders_and_paired_gaps_by_hand(tmp_path):
    # seed 0: fedapc leads at the end (full: rounds 5-9), fedavg in the screen R = 6 (rounds 3-5, window 3)
    runs = [write_run(tmp_path, "fedapc", 0, {r: 50.0 + 2 * r for r in range(10)}),  # full 64, R=6 58
            write_run(tmp_path, "fedavg", 0, {r: 60.0 for r in range(10)}),  # full 60, R=6 60
            # seed 1 evaluates every other round only: its screen reads rounds 3 and 5 of 3-5
            write_run(tmp_path, "fedapc", 1, {1: 10.0, 3: 20.0, 5: 30.0, 6: 40.0, 7: 50.0, 8: 60.0, 9: 70.0}),
            write_run(tmp_path, "fedavg", 1, {3: 1.0, 5: 2.0, **{r: 3.0 for r in range(6, 10)}})]
    lines = screen_rounds.table(runs, [6], 3, "fedavg")
    assert lines[0] == "runs *-office_caltech-fedapc"
    rows = {tuple(ln.split()[:2]): [float(x) for x in ln.split()[2:]] for ln in lines[2:6]}
    # seed 1: fedapc's full (30 + 40 + 50 + 60 + 70) / 5 = 50, screen (20 + 30) / 2 = 25; fedavg's (2 + 4 x 3) / 5
    # = 2.8 and (1 + 2) / 2
    assert rows == {("fedapc", "0"): [64.0, 58.0], ("fedavg", "0"): [60.0, 60.0],
                    ("fedapc", "1"): [50.0, 25.0], ("fedavg", "1"): [2.8, 1.5]}
    text = "\n".join(lines)
    assert "seed 0: full order fedapc > fedavg\n  R=6: tau -1.00, order fedavg > fedapc" in text
    assert "seed 1: full order fedapc > fedavg\n  R=6: tau +1.00, the same order" in text
    assert "  fedapc - fedavg: full +4.00, R=6 -2.00" in text and "  fedapc - fedavg: full +47.20, R=6 +23.50" in text
    assert lines[-1] == "the full order on every seed: no screen"
    assert screen_rounds.table(runs, [10], 5, None)[-1] == "the full order on every seed: R=10"


def test_a_run_without_its_last_rounds_or_a_window_without_evaluations_is_refused(tmp_path):
    short = [write_run(tmp_path, "fedavg", 0, {r: 1.0 for r in range(8)})]  # rounds 8 and 9 never evaluated
    with pytest.raises(SystemExit, match=r"lacks the evaluations of rounds \[8, 9\]"):
        screen_rounds.table(short, [6], 3, None)
    sparse = [write_run(tmp_path, "fedprox", 0, {0: 1.0, **{r: 2.0 for r in range(5, 10)}})]
    with pytest.raises(SystemExit, match="no round evaluated by every run of a seed among rounds 2 to 4: widen"):
        screen_rounds.table(sparse, [5], 3, None)


def test_runs_of_a_seed_tested_on_different_rounds_are_screened_on_the_rounds_both_have(tmp_path):
    """A run tested every round beside one tested every other round (a queued run beside a sweep's): both screens
    average the rounds both evaluated, 3 and 5 of the window 3-5, not the first run's 3, 4 and 5."""
    every = write_run(tmp_path, "fedapc", 0, {r: float(r * r) for r in range(10)})  # 9, 16, 25 in the window
    other = write_run(tmp_path, "fedavg", 0, {1: 1.0, 3: 10.0, 5: 20.0, **{r: 30.0 for r in range(6, 10)}})
    rows = {tuple(ln.split()[:2]): [float(x) for x in ln.split()[2:]]
            for ln in screen_rounds.table([every, other], [6], 3, "fedavg")[2:4]}
    # fedapc: full (25 + 36 + 49 + 64 + 81) / 5 = 51, screen (9 + 25) / 2 = 17 (its own three rounds: 16.67);
    # fedavg: full (20 + 4 x 30) / 5 = 28, screen (10 + 20) / 2 = 15
    assert rows == {("fedapc", "0"): [51.0, 17.0], ("fedavg", "0"): [28.0, 15.0]}
    alone = screen_rounds.table([every], [6], 3, None)[2].split()
    assert float(alone[3]) == pytest.approx((9 + 16 + 25) / 3, abs=0.005)  # alone, it reads every round it has
