"""What our seeds can tell of a paper's numbers: a verdict per compared cell (our seeds' mean against the paper's
value) and per claim (one row above another, or two rows comparable, paired over the seeds both rows have), and the
seeds that would decide what is left open.

A cell: d = our mean - the paper's value, its standard error with the paper's own runs in it,
se^2 = s^2 / n + s_paper^2 / m (n our seeds, m the seeds the paper's mean is over). s is our seed spread, pooled over
the cells that share it (a table's methods on one dataset and domain: sum (n_i - 1) s_i^2 / sum (n_i - 1), with
sum (n_i - 1) degrees of freedom) where Bartlett's test finds no difference between their variances at `ALPHA`, else
the cell's own (`pool`). s_paper is the paper's printed std where it is seed-to-seed spread, else our pooled s stands
for it (no paper here prints a seed-to-seed std: FPL and FedAPC print none, FedPLVM's is its GPU noise over five
runs of one seed, FedProto's is over clients). Three outcomes at margin delta (`compare`, `verdict`):

- **equivalent** within +-delta: the two one-sided tests (TOST) at `ALPHA`, i.e. the 90% interval of d inside
  (-delta, delta);
- **differs**: the 95% interval of d excludes 0 (a table's primary cells: Benjamini-Hochberg's q < `ALPHA` over them),
  **beyond +-delta** where that interval lies wholly outside the band;
- **inconclusive** otherwise.

The finest margin the paper's runs allow (`floor`): the half-width of d's 90% interval with unlimited seeds of ours,
z s_paper / sqrt(m) (t with m - 1 degrees of freedom where s_paper is the paper's own); a margin below it can never
be shown, whatever we run. An inconclusive cell's seeds needed (`seeds_needed`): the fewest with which the TOST at
+-delta reaches `POWER` if ours and the paper's agree (a design, not the observed gap), capped at `MAX_SEEDS`, or
"none would" where even unlimited seeds fall short of `POWER` (the paper's floor).

A claim: our differences seed by seed (minuend - subtrahend) over the seeds both rows have, `MIN_PAIRS` or more
(fewer: undecided, said so). Its direction by a one-sided paired t-test in the paper's direction (holds) and in the
other (reversed), each at `ALPHA`; its size: the paper's gap inside our paired 95% interval. A paired t-test, not
rliable's probability of improvement: the papers claim a gap of means (their tables are means), the pairing by seed
takes out what a seed draws for both rows (split, initialisation, data order: several points on Office-Caltech), and
with 3 to 5 seeds a probability of improvement takes a handful of values and its bootstrap interval is degenerate.
A "comparable" claim (FedPLVM's Table 4): the paired TOST at +-delta (holds), or the paired 95% interval wholly
outside the band (fails). Pairs needed: the fewest at which the test reaches `POWER` against the paper's gap (a
comparable claim: at no gap), from the paired differences' spread pooled over the claims of a table's dataset.

Every distribution is scipy's or statsmodels' (TOST p, Benjamini-Hochberg, power).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import normal_power, ttest_power
from statsmodels.stats.weightstats import ttost_paired

ALPHA = 0.05
POWER = 0.8
MAX_SEEDS = 20
MIN_PAIRS = 3
CELL_KEYS = ["table", "dataset", "method", "domain"]
MARKS = {"equivalent": "✓", "differs": "✗", "inconclusive": "?"}
MARKS_LEGEND = "✓ equivalent within ±δ, ✗ differs (✗✗ beyond ±δ), ? inconclusive"


@dataclass(frozen=True)
class Spread:
    """Our seed spread for a cell: its std and degrees of freedom, and how it was had (`pool`)."""
    std: float
    df: int
    how: str  # "pooled" over `methods` cells, "own" (their variances differ, or one cell), "none" (no df)
    methods: int = 1
    bartlett_p: float | None = None  # over the cells with 2+ seeds and some spread
    ratio: float | None = None  # their largest variance over their smallest


def pool(samples: list[np.ndarray]) -> tuple[Spread, list[Spread]]:
    """The pooled spread of `samples` (a cell's seeds each) and each one's own; the own spreads stand where Bartlett's
    test over those with 2+ seeds and some spread rejects equal variances at `ALPHA`, the pooled one otherwise."""
    own = [Spread(float(np.std(x, ddof=1)), len(x) - 1, "own") if len(x) > 1 else Spread(math.nan, 0, "none")
           for x in samples]
    df = sum(s.df for s in own)
    if not df:
        return Spread(math.nan, 0, "none", 0), own
    std = math.sqrt(sum(s.df * s.std ** 2 for s in own if s.df) / df)
    tested = [x for x, s in zip(samples, own) if s.df and s.std > 0]
    var = [s.std ** 2 for s in own if s.df and s.std > 0]
    p = float(stats.bartlett(*tested).pvalue) if len(tested) > 1 else None
    ratio = max(var) / min(var) if len(var) > 1 else None
    methods = sum(s.df > 0 for s in own)
    return Spread(std, df, "pooled" if methods > 1 else "own", methods, p, ratio), own


def use_pooled(pooled: Spread) -> bool:
    """Whether a pooled spread stands for its cells: Bartlett's test does not reject equal variances (or there is
    nothing to test: a single cell with a spread)."""
    return pooled.how == "pooled" and (pooled.bartlett_p is None or pooled.bartlett_p >= ALPHA)


def standard_error(std: float, df: float, n: int, paper_runs: int, paper_std: float | None = None
                   ) -> tuple[float, float]:
    """The standard error of our mean over `n` seeds minus the paper's over `paper_runs`, and its degrees of freedom:
    our spread `std` (`df` degrees of freedom) for the paper's runs too (df `df`), or the paper's own seed-to-seed
    `paper_std` (Welch-Satterthwaite with `paper_runs` - 1)."""
    ours = std ** 2 / n
    if paper_std is None:
        return math.sqrt(ours + std ** 2 / paper_runs), df
    theirs = paper_std ** 2 / paper_runs
    return math.sqrt(ours + theirs), (ours + theirs) ** 2 / (ours ** 2 / df + theirs ** 2 / (paper_runs - 1))


def floor(std: float, paper_runs: int, paper_std: float | None = None) -> float:
    """The finest margin the paper's runs allow: the half-width of d's 90% interval with unlimited seeds of ours."""
    if paper_std is None:
        return float(stats.norm.ppf(1 - ALPHA) * std / math.sqrt(paper_runs))
    return float(stats.t.ppf(1 - ALPHA, paper_runs - 1) * paper_std / math.sqrt(paper_runs))


@dataclass(frozen=True)
class Comparison:
    """A cell's d = ours - paper with its intervals and tests."""
    diff: float
    se: float
    df: float
    ci95: tuple[float, float]
    ci90: tuple[float, float]
    p: float  # two-sided, d = 0
    p_tost: float  # the larger of the two one-sided p-values against -delta and +delta
    floor: float
    margin: float


def compare(mean: float, n: int, paper: float, spread: Spread, paper_runs: int, margin: float,
            paper_std: float | None = None) -> Comparison | None:
    """Our mean over `n` seeds against the paper's value; None without a spread to test with."""
    if spread.df < 1 or not spread.std > 0:
        return None
    se, df = standard_error(spread.std, spread.df, n, paper_runs, paper_std)
    d = mean - paper
    t95, t90 = stats.t.ppf(1 - ALPHA / 2, df), stats.t.ppf(1 - ALPHA, df)
    p = float(2 * stats.t.sf(abs(d) / se, df))
    p_tost = float(max(stats.t.sf((d + margin) / se, df), stats.t.cdf((d - margin) / se, df)))
    ci95, ci90 = (float(d - t95 * se), float(d + t95 * se)), (float(d - t90 * se), float(d + t90 * se))
    return Comparison(d, se, df, ci95, ci90, p, p_tost, floor(spread.std, paper_runs, paper_std), margin)


def verdict(c: Comparison | None, q: float | None = None) -> tuple[str, bool]:
    """(equivalent / differs / inconclusive, beyond +-delta): a primary cell's "differs" is by its BH `q`."""
    if c is None:
        return "inconclusive", False
    if c.p_tost < ALPHA:
        return "equivalent", False
    if (c.p if q is None else q) < ALPHA:
        return "differs", c.ci95[0] > c.margin or c.ci95[1] < -c.margin
    return "inconclusive", False


def bh(p: list[float]) -> list[float]:
    """Benjamini-Hochberg's q-values of `p` (statsmodels' fdr_bh)."""
    return list(multipletests(p, alpha=ALPHA, method="fdr_bh")[1]) if len(p) else []


def tost_power(margin: float, se: float, df: float) -> float:
    """The TOST's power at +-`margin` when the true difference is 0, standard error `se`, `df` degrees of freedom
    (df inf: normal): each one-sided test's power (statsmodels), both at once at least their sum less 1."""
    one = (normal_power(margin / se, 1, ALPHA, alternative="larger") if math.isinf(df)
           else ttest_power(margin / se, 1, ALPHA, df=df, alternative="larger"))
    return max(0.0, 2 * float(one) - 1)


def seeds_needed(spread: Spread, n: int, paper_runs: int, margin: float, paper_std: float | None = None
                 ) -> tuple[int | None, str]:
    """The fewest seeds (n + 1 to `MAX_SEEDS`) at which the TOST at +-`margin` reaches `POWER` if ours and the
    paper's agree, the pooled degrees of freedom growing with the seeds added; (None, why) where none is within the
    cap or none would be at all (the paper's floor), or there is no spread to plan from."""
    if spread.df < 1 or not spread.std > 0:
        return None, "no spread to plan from: a second seed first"
    for seeds in range(n + 1, MAX_SEEDS + 1):
        if tost_power(margin, *standard_error(spread.std, spread.df + seeds - n, seeds, paper_runs, paper_std)) \
                >= POWER:
            return seeds, ""
    limit = (spread.std if paper_std is None else paper_std) / math.sqrt(paper_runs)
    if tost_power(margin, limit, math.inf if paper_std is None else paper_runs - 1) < POWER:
        return None, "none would: even unlimited seeds leave the TOST short of the power (the paper's own runs)"
    return None, f"more than {MAX_SEEDS}"


def cell_frame(seeds: pd.DataFrame) -> pd.DataFrame:
    """Every cell's verdict from the tidy frame of seed values (one row per `CELL_KEYS` and seed: `value`, the paper's
    `paper` (NaN: not compared), `paper_seeds` (the seeds its mean is over), `paper_std` (NaN unless seed-to-seed),
    `margin`, `endpoint` "primary" or "secondary"). The spread pooled over each (table, dataset, domain)'s methods;
    Benjamini-Hochberg within each table over its primary cells."""
    rows = []
    for _, group in seeds.groupby(["table", "dataset", "domain"], sort=False):
        cells = list(group.groupby("method", sort=False))
        pooled, own = pool([g.value.to_numpy(float) for _, g in cells])
        for (method, g), mine in zip(cells, own):
            first = g.iloc[0]
            spread = pooled if use_pooled(pooled) else mine
            paper_std = None if pd.isna(first.paper_std) else float(first.paper_std)
            c = None if pd.isna(first.paper) else compare(
                float(g.value.mean()), len(g), float(first.paper), spread, int(first.paper_seeds), float(first.margin),
                paper_std)
            rows.append({**{k: first[k] for k in CELL_KEYS}, "endpoint": first.endpoint, "seeds": len(g),
                         "mean": float(g.value.mean()), "std": mine.std, "paper": first.paper,
                         "paper_seeds": first.paper_seeds, "paper_std": paper_std, "margin": first.margin,
                         "spread": spread.std, "spread_df": spread.df, "spread_how": spread.how,
                         "pooled_methods": pooled.methods, "bartlett_p": pooled.bartlett_p, "var_ratio": pooled.ratio,
                         "compared": not pd.isna(first.paper), "comparison": c})
    out = pd.DataFrame(rows)
    out["q"] = np.nan
    for _, g in out.groupby("table", sort=False):
        tested = g[(g.endpoint == "primary") & g.comparison.notna()]
        out.loc[tested.index, "q"] = bh([c.p for c in tested.comparison])
    decided = [verdict(c, None if pd.isna(q) else q) if compared else (None, False)
               for c, q, compared in zip(out.comparison, out.q, out.compared)]
    out["verdict"], out["beyond"] = [v for v, _ in decided], [b for _, b in decided]
    for name, get in (("diff", lambda c: c.diff), ("se", lambda c: c.se), ("df", lambda c: c.df),
                      ("ci95_low", lambda c: c.ci95[0]), ("ci95_high", lambda c: c.ci95[1]),
                      ("ci90_low", lambda c: c.ci90[0]), ("ci90_high", lambda c: c.ci90[1]), ("p", lambda c: c.p),
                      ("p_tost", lambda c: c.p_tost), ("floor", lambda c: c.floor)):
        out[name] = [np.nan if c is None else get(c) for c in out.comparison]
    needed = [seeds_needed(Spread(s, int(df), how), n, int(m), margin, None if pd.isna(ps) else ps)
              if v == "inconclusive" else (None, "")
              for v, s, df, how, n, m, margin, ps in zip(out.verdict, out.spread, out.spread_df, out.spread_how,
                                                          out.seeds, out.paper_seeds, out.margin, out.paper_std)]
    out["seeds_needed"] = pd.array([n for n, _ in needed], dtype="Int64")
    out["needed_why"] = [why for _, why in needed]
    return out.drop(columns="comparison")


@dataclass(frozen=True)
class ClaimVerdict:
    """A claim's verdict from our paired differences: direction (holds, reversed / fails, undecided) and size."""
    kind: str  # "above" (the paper's gap's sign, or the minuend above where the paper says so in words) or "comparable"
    pairs: int
    mean: float | None = None  # the mean of the differences
    ci95: tuple[float, float] | None = None
    p: float | None = None  # above: one-sided in the paper's direction; comparable: the paired TOST's
    bound: float | None = None  # above: the one-sided 95% bound of the mean in the paper's direction (holds: past 0)
    direction: str = "undecided"
    size: str = "undecided"  # reproduced (the paper's gap inside ci95), differs, undecided, "–" (no paper gap)
    needed: int | None = None  # pairs that would decide an undecided direction
    needed_why: str = ""

    @property
    def verdict(self) -> str:
        return self.direction


def pooled_pairs(diffs: list[list[float]]) -> Spread:
    """The paired differences' spread pooled over claims (each with 2+ pairs), for planning pairs."""
    return pool([np.asarray(d, float) for d in diffs])[0]


def pairs_needed(kind: str, paper_gap: float | None, margin: float | None, spread: Spread, pairs: int
                 ) -> tuple[int | None, str]:
    """The fewest pairs (at least `MIN_PAIRS` and more than `pairs`) at which the claim's test reaches `POWER` from
    `spread`: one-sided paired t against the paper's gap, or the paired TOST at +-margin with no true gap."""
    if spread.df < 1 or not spread.std > 0:
        return None, "no spread to plan from: pairs first"
    if kind != "comparable" and not paper_gap:
        return None, "no paper gap to plan from"

    def power(n: int) -> float:
        if kind == "comparable":
            return tost_power(margin, spread.std / math.sqrt(n), n - 1)
        return float(ttest_power(abs(paper_gap) / spread.std, n, ALPHA, alternative="larger"))

    n = next((n for n in range(max(MIN_PAIRS, pairs + 1), MAX_SEEDS + 1) if power(n) >= POWER), None)
    return n, "" if n else f"more than {MAX_SEEDS}"


def claim_verdict(diffs: list[float], paper_gap: float | None, kind: str = "above", margin: float | None = None,
                  spread: Spread | None = None) -> ClaimVerdict:
    """Our differences seed by seed against the paper's claim; `spread` (pooled) plans the pairs an undecided one
    needs (default: these differences' own)."""
    n = len(diffs)
    spread = spread or pool([np.asarray(diffs, float)])[0]
    if n < MIN_PAIRS:
        mean = float(np.mean(diffs)) if n else None
        return ClaimVerdict(kind, n, mean, None, None, None, "undecided",
                            "undecided" if paper_gap is not None else "–", *pairs_needed(kind, paper_gap, margin,
                                                                                          spread, n))
    d = np.asarray(diffs, float)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    half = stats.t.ppf(1 - ALPHA / 2, n - 1) * sd / math.sqrt(n)
    ci = (float(mean - half), float(mean + half))
    size = "–" if paper_gap is None else "reproduced" if ci[0] <= paper_gap <= ci[1] else "differs"
    bound = None
    if kind == "comparable":
        p = float(ttost_paired(d, np.zeros(n), -margin, margin)[0]) if sd > 0 else float(abs(mean) >= margin)
        direction = "holds" if p < ALPHA else "fails" if ci[0] > margin or ci[1] < -margin else "undecided"
    else:
        sign = 1.0 if paper_gap is None else float(np.sign(paper_gap))
        if sd > 0:
            p, p_other = (float(stats.ttest_1samp(sign * d, 0.0, alternative=a).pvalue) for a in ("greater", "less"))
        else:
            p, p_other = float(sign * mean <= 0), float(sign * mean >= 0)
        direction = "holds" if p < ALPHA else "reversed" if p_other < ALPHA else "undecided"
        bound = float(mean - sign * stats.t.ppf(1 - ALPHA, n - 1) * sd / math.sqrt(n))
    needed = pairs_needed(kind, paper_gap, margin, spread, n) if direction == "undecided" else (None, "")
    return ClaimVerdict(kind, n, mean, ci, p, bound, direction, size, *needed)


def paired_claim(minuend: dict[int, float], subtrahend: dict[int, float], paper_gap: float | None,
                 kind: str = "above", margin: float | None = None, spread: Spread | None = None) -> ClaimVerdict:
    """`claim_verdict` of two rows given seed -> value, paired over the seeds both have."""
    return claim_verdict([minuend[s] - subtrahend[s] for s in sorted(set(minuend) & set(subtrahend))], paper_gap,
                         kind, margin, spread)
