"""The verdicts' statistics (`benchmark.verdicts`), each kind checked against numbers worked here by hand (numpy, the
t distribution's quantiles from scipy) and against the libraries called another way (statsmodels' TOST of two
samples, scipy's one-sided t-tests, a simulation of the TOST's power)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.weightstats import ttost_ind

from benchmark import verdicts as v

T95_10, T90_10 = stats.t.ppf(0.975, 10), stats.t.ppf(0.95, 10)


def spread(std: float, df: int) -> v.Spread:
    return v.Spread(std, df, "pooled")


def test_the_pooled_spread_and_bartletts_check_by_hand():
    """Three cells of 3, 2 and 1 seeds: pooled variance (2 x 4 + 1 x 0.5) / 3 on 3 degrees of freedom; Bartlett's
    statistic from its formula; the one-seed cell adds nothing."""
    a, b, c = np.array([50.0, 52, 54]), np.array([60.0, 61]), np.array([70.0])
    pooled, own = v.pool([a, b, c])
    assert (pooled.std, pooled.df, pooled.methods) == (pytest.approx(math.sqrt(8.5 / 3)), 3, 2)
    assert [s.how for s in own] == ["own", "own", "none"] and own[0].std == pytest.approx(2.0)
    k, n, s2 = 2, np.array([3, 2]), np.array([4.0, 0.5])
    sp2 = ((n - 1) * s2).sum() / (n - 1).sum()
    chi2 = ((n - 1).sum() * np.log(sp2) - ((n - 1) * np.log(s2)).sum()) / (
        1 + ((1 / (n - 1)).sum() - 1 / (n - 1).sum()) / (3 * (k - 1)))
    assert pooled.bartlett_p == pytest.approx(stats.chi2.sf(chi2, k - 1)) and pooled.ratio == pytest.approx(8.0)
    assert v.use_pooled(pooled)  # p 0.39: not shown unequal
    wide = v.pool([np.array([50.0, 50.1, 49.9]), np.array([40.0, 60.0, 50.0])])[0]
    assert wide.bartlett_p < 0.05 and not v.use_pooled(wide)  # variances 0.01 and 100: each cell its own
    assert v.pool([c, c])[0].how == "none"


def test_equivalent_within_the_margin_by_hand_and_as_statsmodels_ttost_of_two_samples():
    """s 1 on 10 degrees of freedom, 3 seeds against a mean of 3 runs: se = sqrt(1/3 + 1/3); d = 0.2, margin 2: the 90%
    interval 0.2 +- 1.8125 se inside +-2."""
    got = v.compare(50.2, 3, 50.0, spread(1.0, 10), 3, 2.0)
    se = math.sqrt(2 / 3)
    assert (got.diff, got.se, got.df) == (pytest.approx(0.2), pytest.approx(se), 10)
    assert got.ci90 == pytest.approx((0.2 - T90_10 * se, 0.2 + T90_10 * se))
    assert got.p_tost == pytest.approx(stats.t.cdf((0.2 - 2) / se, 10))
    assert v.verdict(got) == ("equivalent", False)
    # the same with the spread pooled over ours and the paper's runs given as samples: statsmodels' pooled TOST and
    # two one-sided scipy t-tests
    x, y = np.array([60.0, 61.5, 62.1]), np.array([60.2, 59.1, 61.0])
    mine = v.compare(x.mean(), 3, y.mean(), v.pool([x, y])[0], 3, 2.0)
    assert mine.p_tost == pytest.approx(ttost_ind(x, y, -2.0, 2.0, usevar="pooled")[0])
    assert mine.p_tost == pytest.approx(max(stats.ttest_ind(x + 2, y, alternative="greater").pvalue,
                                            stats.ttest_ind(x - 2, y, alternative="less").pvalue))
    assert mine.p == pytest.approx(stats.ttest_ind(x, y).pvalue)


def test_a_papers_own_seed_spread_is_welchs_and_statsmodels_agrees():
    x, y = np.array([60.0, 63.5, 62.1]), np.array([60.2, 59.1, 61.0, 60.4, 60.8])
    got = v.compare(x.mean(), 3, y.mean(), v.pool([x])[0], 5, 2.0, paper_std=float(np.std(y, ddof=1)))
    assert got.p_tost == pytest.approx(ttost_ind(x, y, -2.0, 2.0, usevar="unequal")[0])
    assert got.p == pytest.approx(stats.ttest_ind(x, y, equal_var=False).pvalue)
    assert got.floor == pytest.approx(stats.t.ppf(0.95, 4) * np.std(y, ddof=1) / math.sqrt(5))


def test_differs_and_differs_beyond_the_margin_by_hand():
    se = math.sqrt(2 / 3)
    near = v.compare(52.5, 3, 50.0, spread(1.0, 10), 3, 2.0)  # 95%: 2.5 +- 1.82, excludes 0, not the band
    assert near.ci95 == pytest.approx((2.5 - T95_10 * se, 2.5 + T95_10 * se)) and 0 < near.ci95[0] < 2
    assert near.p == pytest.approx(2 * stats.t.sf(2.5 / se, 10))
    assert v.verdict(near) == ("differs", False)
    far = v.compare(45.0, 3, 50.0, spread(1.0, 10), 3, 2.0)  # -5 +- 1.82: wholly below -2
    assert v.verdict(far) == ("differs", True)
    # a primary cell's differs is by its BH q: p 0.012 with q 0.06 is not
    assert v.verdict(near, q=0.06) == ("inconclusive", False)


def test_inconclusive_and_no_spread():
    wide = v.compare(51.0, 3, 50.0, spread(3.0, 10), 3, 2.0)  # se 2.45: 95% 1 +- 5.46, 90% 1 +- 4.44
    assert wide.ci95[0] < 0 < wide.ci95[1] and wide.ci90[1] > 2
    assert v.verdict(wide) == ("inconclusive", False)
    assert v.compare(51.0, 1, 50.0, v.Spread(math.nan, 0, "none"), 3, 2.0) is None
    assert v.verdict(None) == ("inconclusive", False)
    assert v.seeds_needed(v.Spread(math.nan, 0, "none"), 1, 3, 2.0)[0] is None


def test_the_papers_floor_and_the_seeds_that_would_decide():
    """Against a mean of 3 runs with s 2.5 the floor is 1.645 x 2.5 / sqrt(3) = 2.37: no number of seeds shows
    equivalence at +-2. With s 1 it is 0.95, and the TOST's power at +-2 is checked against a simulation."""
    assert v.floor(2.5, 3) == pytest.approx(stats.norm.ppf(0.95) * 2.5 / math.sqrt(3)) == pytest.approx(2.374, abs=1e-3)
    assert v.seeds_needed(spread(2.5, 20), 3, 3, 2.0)[1].startswith("none would")
    n, why = v.seeds_needed(spread(1.0, 10), 3, 3, 2.0)
    assert why == "" and 3 < n <= v.MAX_SEEDS

    def simulated(seeds: int, draws: int = 100_000) -> float:  # the TOST at +-2 run on made-up data, true gap 0
        rng = np.random.default_rng(0)
        df = 10 + seeds - 3
        se = math.sqrt(1 / seeds + 1 / 3)
        d = rng.normal(0, se, draws)
        se_hat = se * np.sqrt(rng.chisquare(df, draws) / df)
        t = stats.t.ppf(0.95, df)
        return float(np.mean((d - t * se_hat > -2) & (d + t * se_hat < 2)))

    assert simulated(n) >= v.POWER - 0.005 and simulated(n - 1) < v.POWER + 0.005
    assert v.tost_power(2.0, math.sqrt(1 / n + 1 / 3), 10 + n - 3) == pytest.approx(simulated(n), abs=0.01)
    # s 1.72 against 3 runs at +-3: unlimited seeds would reach 2 Phi(3 / 0.993 - 1.645) - 1 = 0.83, 20 do not
    assert v.seeds_needed(spread(1.72, 2), 3, 3, 3.0) == (None, f"more than {v.MAX_SEEDS}")


def test_benjamini_hochberg_on_a_hand_list():
    # sorted 0.01, 0.03, 0.04, 0.2: 0.04, 0.06, 0.0533, 0.2 by rank, then the running minimum from the top
    assert v.bh([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.2])


def test_a_cell_frame_pools_by_dataset_and_domain_and_controls_false_discoveries_over_primary_cells():
    """Two methods on one domain and the AVG. a's AVG: d = 3 on the spread pooled with b's (p 0.0097), BH over the
    two primary cells doubles it (b's p is 1): q 0.019, differs."""
    rows = []
    values = {("a", "AVG"): [52.0, 53.0, 54.0], ("b", "AVG"): [50.5, 49.5, 50.0], ("a", "x"): [40.0, 41.0, 42.0],
              ("b", "x"): [45.0]}
    for (m, d), vals in values.items():
        for seed, val in enumerate(vals):
            rows.append({"table": "t", "dataset": "ds", "method": m, "domain": d, "seed": seed, "value": val,
                         "paper": 50.0 if d == "AVG" else (40.0 if m == "a" else math.nan), "paper_seeds": 3,
                         "paper_std": math.nan, "margin": 2.0, "endpoint": "primary" if d == "AVG" else "secondary"})
    cells = v.cell_frame(pd.DataFrame(rows)).set_index(["method", "domain"])
    sp = math.sqrt((2 * 1.0 + 2 * 0.25) / 4)  # pooled over a (var 1) and b (var 0.25): df 4
    a = cells.loc[("a", "AVG")]
    assert (a.spread, a.spread_df, a.spread_how) == (pytest.approx(sp), 4, "pooled")
    se = sp * math.sqrt(2 / 3)
    p_a = 2 * stats.t.sf(3.0 / se, 4)
    p_b = 2 * stats.t.sf(0.0, 4)
    assert a.p == pytest.approx(p_a) and a.q == pytest.approx(2 * p_a) and (p_b, a.verdict) == (1.0, "differs")
    assert cells.loc[("b", "AVG")].q == pytest.approx(p_b)
    # the domain: a alone has a spread (b one seed): its own; secondary, no BH; b not compared (no paper value)
    x = cells.loc[("a", "x")]
    assert (x.spread_df, x.spread_how, math.isnan(x.q), x["diff"]) == (2, "own", True, pytest.approx(1.0))
    assert pd.isna(cells.loc[("b", "x")].verdict) and not cells.loc[("b", "x")].compared


def test_claims_direction_and_size_by_hand():
    d = np.array([5.0, 5.5, 3.75])  # mean 4.75
    se = d.std(ddof=1) / math.sqrt(3)
    got = v.claim_verdict(list(d), paper_gap=6.5)
    assert (got.direction, got.pairs, got.mean) == ("holds", 3, pytest.approx(4.75))
    assert got.bound == pytest.approx(4.75 - stats.t.ppf(0.95, 2) * se) and got.bound > 0  # the one-sided 95% bound
    assert got.p == pytest.approx(stats.t.sf(4.75 / se, 2))  # one-sided, the paper's direction
    half = stats.t.ppf(0.975, 2) * se
    assert got.ci95 == pytest.approx((4.75 - half, 4.75 + half)) and got.size == "reproduced"  # 6.5 in 2.51 to 6.99
    assert v.claim_verdict(list(d), paper_gap=2.0).size == "differs"  # direction holds, size not
    assert v.claim_verdict(list(d), paper_gap=-1.0).direction == "reversed"
    assert v.claim_verdict(list(-d), paper_gap=None).direction == "reversed"  # in words: the minuend above
    weak = v.claim_verdict([2.0, -1.0, 0.5], paper_gap=1.0)
    assert weak.direction == "undecided" and weak.needed is not None


def test_fewer_than_three_pairs_are_undecided_and_pairs_are_planned_from_the_pooled_spread():
    two = v.claim_verdict([5.0, 6.0], paper_gap=1.0, spread=spread(1.0, 6))
    assert (two.direction, two.size, two.pairs, two.mean) == ("undecided", "undecided", 2, pytest.approx(5.5))
    # the fewest pairs at which a one-sided paired t-test at 5% sees a gap of 1 with s 1 80% of the time, by scipy's
    # noncentral t
    power = [stats.nct.sf(stats.t.ppf(0.95, n - 1), n - 1, math.sqrt(n)) for n in range(3, 40)]
    assert two.needed == 3 + next(i for i, p in enumerate(power) if p >= 0.8) == 8
    assert v.claim_verdict([5.0, 6.0], paper_gap=1.0, spread=spread(2.0, 6)).needed_why == "more than 20"
    assert v.claim_verdict([], 1.0).pairs == 0 and v.claim_verdict([], 1.0).needed_why
    assert v.paired_claim({0: 3.0, 1: 4.0, 2: 5.0}, {1: 1.0, 2: 2.0, 3: 9.0}, 1.0).pairs == 2


def test_a_comparable_claim_is_a_paired_tost():
    d = np.array([0.3, -0.2, 0.1, 0.0])
    got = v.claim_verdict(list(d), paper_gap=0.29, kind="comparable", margin=2.0)
    by_hand = max(stats.ttest_1samp(d + 2, 0, alternative="greater").pvalue,
                  stats.ttest_1samp(d - 2, 0, alternative="less").pvalue)
    assert got.p == pytest.approx(by_hand) and got.direction == "holds" and got.size == "reproduced"
    apart = v.claim_verdict([5.0, 6.0, 5.5], paper_gap=0.29, kind="comparable", margin=2.0)
    assert apart.direction == "fails" and apart.size == "differs"
    # undecided: its pairs from the paired TOST's power with no true gap (s 2.5: 15 pairs)
    loose = v.claim_verdict([3.0, -2.0, 0.5], paper_gap=0.29, kind="comparable", margin=2.0)
    assert (loose.direction, loose.needed) == ("undecided", 15)
    assert v.tost_power(2.0, 2.5 / math.sqrt(15), 14) >= 0.8 > v.tost_power(2.0, 2.5 / math.sqrt(14), 13)


def test_a_tables_margin_is_the_smallest_gap_the_paper_ranks():
    """FPL's Table 2: its bold row above every other on each dataset, the smallest of those gaps FPL over FedProto on
    Digits (83.12 - 81.16); a domain's margin at least one image of its test set. FedPLVM's Table 4 calls its two rows
    comparable: within the smallest gap its Table 1 ranks on Digit-5 (FedPLVM over FPL, 69.25 - 66.88)."""
    from benchmark import paper
    from ray_jobs.tables import TABLES

    t2, t12 = paper.TABLE2, paper.FEDPLVM_TABLE12
    gaps = [t2["fpl"][ds]["AVG"] - t2[m][ds]["AVG"] for ds in ("digits", "office_caltech") for m in t2 if m != "fpl"]
    assert TABLES["2"].margin.avg == pytest.approx(min(gaps)) == pytest.approx(1.96)
    assert TABLES["2"].margin.domain(30) == pytest.approx(100 / 30) and TABLES["2"].margin.domain(2000) == 1.96
    assert TABLES["fedplvm4"].margin.avg == pytest.approx(
        min(t12["fedplvm"]["digit5"]["AVG"] - t12[m]["digit5"]["AVG"] for m in t12 if m != "fedplvm"))
    assert [c.kind for c in TABLES["fedplvm4"].claims] == ["comparable"]
    assert TABLES["fedplvm_fig4a"].margin is None  # a grid: no numbers in the paper
    assert (TABLES["fedplvm12"].paper_runs, TABLES["fedplvm12"].paper_seeds) == (5, 1)  # 5 runs of seed 0


def test_the_plan_takes_first_the_runs_that_decide_the_most_per_run():
    """Made-up: cell A (fedavg) needs 5 seeds (has 0-2: runs 3, 4), cell B (fpl) 4 (run 3), the claim fpl minus
    fedavg 4 pairs (both rows' seed 3). Greedy: B's one run decides B; then fedavg's seed 3 decides the claim (one
    run, one target; A's two runs would decide two); then fedavg's seed 4 decides A."""
    from ray_jobs.cells import TableData, plan_frame
    from ray_jobs.config import RunConfig

    every = [RunConfig.from_preset("fpl-office", method=m, seed=s) for m in ("fedavg", "fpl") for s in (0, 1, 2)]
    seeds = pd.DataFrame([{"dataset": "office_caltech", "preset": "fpl-office", "method": m, "domain": "AVG",
                           "seed": s, "run": f"{m}{s}", "wall_time_s": 100.0 * (1 + s), "hardware": "CPU"}
                          for m in ("fedavg", "fpl") for s in (0, 1, 2)])
    cells = pd.DataFrame([{"dataset": "office_caltech", "method": m, "domain": "AVG", "endpoint": "primary",
                           "compared": True, "verdict": "inconclusive", "seeds_needed": n, "needed_why": ""}
                          for m, n in (("fedavg", 5), ("fpl", 4))])
    claims = pd.DataFrame([{"label": "T", "what": "fpl minus fedavg", "dataset": "office_caltech", "minuend": "fpl",
                            "subtrahend": "fedavg", "direction": "undecided", "pairs": 3, "pairs_needed": 4}])
    plan = plan_frame(TableData("2", seeds, cells, claims), every, not_run=[])
    assert list(zip(plan.method, plan.seed)) == [("fpl", 3), ("fedavg", 3), ("fedavg", 4)]
    assert [d.split(" (")[0] for d in plan.decides] == [
        "office_caltech fpl AVG", "T: fpl minus fedavg on office_caltech", "office_caltech fedavg AVG"]
    assert list(plan.cpu_s) == [200.0] * 3 and set(plan.cpu_cost) == {"measured"}  # the median of its 3 runs
    assert set(plan.gpu_cost) == {"not measured"} and not plan.in_table_seeds.any()
