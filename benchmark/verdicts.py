"""Reproduced or not, said by a test: a verdict for a compared cell (our seeds against the paper's value) and for a
claim (one row above another, paired over the seeds both rows have), and the seeds an undecided one needs.

A cell with one seed is undecided. With two or more: where the paper gives mean ± std over a stated number of runs,
Welch's t-test of the two samples' summaries; where it gives a mean alone, a one-sample t-test of our seeds against
it. "consistent" or "differs" at `ALPHA`; a consistent cell also says the smallest difference our seeds could have
detected at `POWER` (a consistent cell that could not have seen 9 points says little).

A claim: the paper's gap between two rows (its sign is the claim). Ours: the differences seed by seed; a paired
t-test with three pairs or more, a sign test with fewer (which cannot reach 5% below six pairs). "holds" when ours
differs from 0 at `ALPHA` in the paper's direction, "reversed" in the other, else "undecided".

Seeds needed: the smallest number of seeds at which the test would reach `POWER` against the difference seen, from
our spread (a cell with one seed: from the paper's std, where it gives one), capped at `MAX_SEEDS`. Every
distribution is scipy.stats'.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

ALPHA = 0.05
POWER = 0.8
MAX_SEEDS = 20
PAPER_SPREAD = "from the paper's std"  # a one-seed cell plans from it
MARKS_LEGEND = "✓ consistent, ✗ differs, ? undecided (one seed; ?→n: n seeds would decide it)"
VERDICT_MARKS = {"consistent": "✓", "differs": "✗", "undecided": "?", "holds": "✓", "reversed": "✗"}


def power(delta: float, se: float, df: float) -> float:
    """The power of a two-sided t-test at `ALPHA` against a true difference `delta`, standard error `se`, `df` degrees
    of freedom (the noncentral t)."""
    crit = stats.t.ppf(1 - ALPHA / 2, df)
    nc = abs(delta) / se
    # the far tail (rejecting on the wrong side) is below 1e-8 where scipy's nct returns nan for it (df 1, nc 8)
    return float(stats.nct.sf(crit, df, nc) + np.nan_to_num(stats.nct.cdf(-crit, df, nc)))


def welch_se_df(std: float, n: int, paper_std: float | None, paper_runs: int | None) -> tuple[float, float]:
    """The standard error and degrees of freedom of our mean against the paper's: Welch-Satterthwaite where the paper
    gives a std over `paper_runs` runs, else our mean's alone (the paper's a fixed value)."""
    ours = std ** 2 / n
    if paper_std is None:
        return float(np.sqrt(ours)), n - 1
    theirs = paper_std ** 2 / paper_runs
    df = (ours + theirs) ** 2 / (ours ** 2 / (n - 1) + theirs ** 2 / (paper_runs - 1))
    return float(np.sqrt(ours + theirs)), float(df)


def detectable(se: float, df: float) -> float:
    """The smallest difference a two-sided t-test with standard error `se` and `df` degrees of freedom detects with
    probability `POWER`."""
    if se == 0:
        return 0.0
    high = se
    while power(high, se, df) < POWER:
        high *= 2
    return float(optimize.brentq(lambda d: power(d, se, df) - POWER, 0.0, high))


def seeds_needed(delta: float, std: float, start: int, paper_std: float | None = None,
                 paper_runs: int | None = None) -> int | None:
    """The fewest seeds (`start` to `MAX_SEEDS`) at which the test reaches `POWER` against `delta` with our spread
    `std`; None beyond the cap (or without a difference). Without a spread on either side (seeds that agree to the
    bit, no paper std) any difference is certain: `start`."""
    if delta == 0:
        return None
    if welch_se_df(std, start, paper_std, paper_runs)[0] == 0:
        return start
    return next((n for n in range(start, MAX_SEEDS + 1) if power(delta, *welch_se_df(std, n, paper_std, paper_runs))
                 >= POWER), None)


@dataclass(frozen=True)
class CellVerdict:
    verdict: str  # consistent, differs, undecided
    test: str  # "Welch", "one-sample t", or "" (one seed)
    seeds: int
    p: float | None = None
    ci: tuple[float, float] | None = None  # our mean's 95% interval
    detectable: float | None = None  # a consistent cell: the smallest difference it could have detected
    needed: int | None = None  # an undecided cell: the seeds that would decide it (None: beyond the cap, or unknown)
    spread: bool = True  # an undecided cell: whether there was a spread to plan from

    def mark(self) -> str:
        """The short form a table cell carries: ✓ consistent, ✗ differs, ? undecided."""
        return VERDICT_MARKS[self.verdict]

    def short(self) -> str:
        """The mark, an undecided cell's with the seeds that would decide it (?→5) where known."""
        return self.mark() + (f"→{self.needed}" if self.needed else "")

    def words(self) -> str:
        if self.verdict == "undecided":
            return f"undecided (1 seed; {needed_words(self.needed, self.spread, PAPER_SPREAD)})"
        text = f"{self.verdict} ({self.test}, p {p_words(self.p)}; 95% CI {self.ci[0]:.2f} to {self.ci[1]:.2f}"
        return text + (f"; detects ±{self.detectable:.2f}" if self.verdict == "consistent" else "") + ")"


def mark_counts(verdicts: list[CellVerdict]) -> str:
    """How many of `verdicts` are consistent, differ, undecided: "4 ✓ 1 ✗" ("–" for none)."""
    marks = Counter(v.mark() for v in verdicts)
    return " ".join(f"{marks[k]} {k}" for k in ("✓", "✗", "?") if marks[k]) or "–"


def p_words(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def needed_words(needed: int | None, spread: bool, source: str = "from our spread") -> str:
    """The seeds an undecided verdict needs, in words (planned from `source`)."""
    if not spread:
        return "no spread to plan from: a second seed first"
    return (f"{needed} seeds would decide it" if needed else f"more than {MAX_SEEDS} seeds needed") + f" ({source})"


def cell_verdict(ours: list[float], paper: float, paper_std: float | None = None,
                 paper_runs: int | None = None) -> CellVerdict:
    """Our seeds' values of a cell against the paper's `paper` (± `paper_std` over `paper_runs` runs, where given)."""
    n = len(ours)
    welch = paper_std is not None and paper_runs is not None and paper_runs > 1
    if not welch:
        paper_std = None
    if n < 2:
        needed = seeds_needed(ours[0] - paper, paper_std, 2, paper_std, paper_runs) if welch else None
        return CellVerdict("undecided", "", n, needed=needed, spread=welch)
    mean, std = float(np.mean(ours)), float(np.std(ours, ddof=1))
    if welch:
        p = stats.ttest_ind_from_stats(mean, std, n, paper, paper_std, paper_runs, equal_var=False).pvalue
    else:
        p = stats.ttest_1samp(ours, paper).pvalue
    p = 0.0 if np.isnan(p) and mean != paper else 1.0 if np.isnan(p) else float(p)  # no spread at all
    ci = stats.t.interval(0.95, n - 1, loc=mean, scale=std / np.sqrt(n)) if std > 0 else (mean, mean)
    se, df = welch_se_df(std, n, paper_std, paper_runs)
    consistent = p >= ALPHA
    return CellVerdict("consistent" if consistent else "differs", "Welch" if welch else "one-sample t", n, p,
                       (float(ci[0]), float(ci[1])), detectable(se, df) if consistent else None)


@dataclass(frozen=True)
class ClaimVerdict:
    verdict: str  # holds, reversed, undecided
    test: str  # "paired t", "sign test", or "" (no pair)
    pairs: int
    mean: float | None = None  # ours: the mean of the differences
    p: float | None = None
    needed: int | None = None
    spread: bool = True

    def words(self) -> str:
        if not self.pairs:
            return "undecided (no seed both rows have)"
        text = f"{self.verdict} ({self.test}, {self.pairs} pair{'s' * (self.pairs > 1)}, p {p_words(self.p)})"
        return text if self.verdict != "undecided" else text[:-1] + f"; {needed_words(self.needed, self.spread)})"


def paired_claim(minuend: dict[int, float], subtrahend: dict[int, float], paper_gap: float) -> ClaimVerdict:
    """`claim_verdict` of two rows given seed -> value, paired over the seeds both have."""
    return claim_verdict([minuend[s] - subtrahend[s] for s in sorted(set(minuend) & set(subtrahend))], paper_gap)


def claim_verdict(diffs: list[float], paper_gap: float) -> ClaimVerdict:
    """Our differences seed by seed (minuend minus subtrahend) against the paper's claim that the gap is `paper_gap`
    (its sign): a paired t-test of the differences with three or more, a two-sided sign test with fewer."""
    n = len(diffs)
    if not n:
        return ClaimVerdict("undecided", "", 0, spread=False)
    mean = float(np.mean(diffs))
    if n >= 3:
        test, p = "paired t", stats.ttest_1samp(diffs, 0.0).pvalue
        p = 0.0 if np.isnan(p) and mean != 0 else 1.0 if np.isnan(p) else float(p)
    else:
        nonzero = [d for d in diffs if d != 0]
        test = "sign test"
        p = stats.binomtest(sum(d > 0 for d in nonzero), len(nonzero)).pvalue if nonzero else 1.0
    if p < ALPHA:
        verdict = "holds" if np.sign(mean) == np.sign(paper_gap) else "reversed"
        return ClaimVerdict(verdict, test, n, mean, p)
    std = float(np.std(diffs, ddof=1)) if n > 1 else float("nan")
    return ClaimVerdict("undecided", test, n, mean, p, seeds_needed(mean, std, max(3, n + 1)) if n > 1 else None,
                        spread=n > 1)
