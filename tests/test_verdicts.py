"""A verdict per compared cell and per claim (`benchmark.verdicts`), checked against the statistics computed here by
hand (numpy formulas; scipy only for the t distribution's tail), and a table's counts (`ray_jobs.report.verdicts`)
from a tiny made-up table."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from benchmark import verdicts as v
from ray_jobs.config import RunConfig
from ray_jobs.report import collect, verdicts
from ray_jobs.tables import Claim, Table


def test_a_cell_with_a_paper_std_is_welchs_test_of_the_two_summaries():
    """Ours 52, 55, 53.5 against the paper's 55 ± 1.2 over 5 runs: Welch's t and degrees of freedom by hand."""
    ours, (pm, ps, pn) = [52.0, 55.0, 53.5], (55.0, 1.2, 5)
    m, s, n = np.mean(ours), np.std(ours, ddof=1), len(ours)
    a, b = s ** 2 / n, ps ** 2 / pn
    t = (m - pm) / np.sqrt(a + b)
    df = (a + b) ** 2 / (a ** 2 / (n - 1) + b ** 2 / (pn - 1))
    p = 2 * stats.t.sf(abs(t), df)
    got = v.cell_verdict(ours, pm, ps, pn)
    assert (got.test, got.verdict) == ("Welch", "consistent" if p >= 0.05 else "differs")
    assert got.p == pytest.approx(p, rel=1e-9) and 0.2 < p < 0.25  # t = -1.47 on 3.57 degrees of freedom
    half = stats.t.ppf(0.975, n - 1) * s / np.sqrt(n)  # our mean's 95% interval
    assert got.ci == pytest.approx((m - half, m + half))
    # 49, 50, 51 against the same: t = -6.34 on 5.06 degrees of freedom, p 0.0014
    assert v.cell_verdict([49.0, 50.0, 51.0], pm, ps, pn).verdict == "differs"


def test_a_cell_without_a_paper_std_is_a_one_sample_test_and_says_what_it_could_detect():
    ours, paper = [58.0, 61.0, 60.4, 57.0], 60.5
    m, s, n = np.mean(ours), np.std(ours, ddof=1), len(ours)
    t = (m - paper) / (s / np.sqrt(n))
    got = v.cell_verdict(ours, paper)
    assert got.test == "one-sample t" and got.p == pytest.approx(2 * stats.t.sf(abs(t), n - 1), rel=1e-9)
    assert got.verdict == "consistent" and "detects ±" in got.words()
    # the smallest difference it detects 80% of the time: 40,000 made-up sets of 4 seeds with our spread, that far
    # from the paper, tested by hand
    draws = np.random.default_rng(0).normal(paper + got.detectable, s, size=(40_000, n))
    t_draws = (draws.mean(1) - paper) / (draws.std(1, ddof=1) / np.sqrt(n))
    assert np.mean(np.abs(t_draws) > stats.t.ppf(0.975, n - 1)) == pytest.approx(0.80, abs=0.01)


def test_one_seed_is_undecided_and_plans_from_the_papers_std_where_it_prints_one():
    assert v.cell_verdict([50.0], 60.0).words() == "undecided (1 seed; no spread to plan from: a second seed first)"
    got = v.cell_verdict([50.0], 55.0, 1.2, 5)
    assert got.verdict == "undecided" and got.needed is not None
    # the fewest seeds at which Welch's test, with the paper's std for ours, reaches 80% against the gap of 5
    assert v.power(5.0, *v.welch_se_df(1.2, got.needed, 1.2, 5)) >= 0.8 > v.power(
        5.0, *v.welch_se_df(1.2, got.needed - 1, 1.2, 5))
    assert got.short() == f"?→{got.needed}"


def test_a_claim_is_a_paired_t_test_with_three_pairs_a_sign_test_with_fewer():
    minuend, subtrahend = np.array([60.0, 61.0, 59.75]), np.array([55.0, 55.5, 56.0])
    d = minuend - subtrahend
    t = d.mean() / (d.std(ddof=1) / np.sqrt(len(d)))
    got = v.claim_verdict(list(d), paper_gap=6.5)
    assert (got.test, got.verdict) == ("paired t", "holds")
    assert got.p == pytest.approx(2 * stats.t.sf(abs(t), len(d) - 1), rel=1e-9) and got.p < 0.05
    assert got.mean == pytest.approx(4.75)
    assert v.claim_verdict(list(d), paper_gap=-1.0).verdict == "reversed"
    # two pairs, both positive: the sign test's p is 2 x (1/2)^2 = 0.5, undecided whatever their size
    two = v.claim_verdict([5.0, 6.0], paper_gap=6.5)
    assert (two.test, two.verdict, two.p) == ("sign test", "undecided", 0.5)
    assert two.needed is not None and two.needed >= 3
    assert v.claim_verdict([], 1.0).words() == "undecided (no seed both rows have)"


def test_a_tables_counts_from_a_tiny_made_up_table(tmp_path):
    """FedAvg with 3 seeds (Amazon 9 points below the paper, 1 point of spread: differs; the rest consistent), FPL
    with 3 (Webcam 6 above, AVG 1.75 below with a spread of 0.66: differ), FedProx with 1 (undecided). Claims: FPL
    above FedAvg (seed by seed +5, +5.5, +3.75: holds), FedProx above FedAvg (one pair: undecided), and a made-up
    claim that FedAvg is above FPL (reversed)."""
    doms = ["caltech", "amazon", "webcam", "dslr"]
    seeds = {"fedavg": [[60, 70, 50, 40], [61, 71, 52, 38], [62, 72, 48, 42]],
             "fpl": [[65, 75, 55, 45], [66, 76, 56, 46], [64, 74, 57, 44]], "fedprox": [[60, 70, 50, 40]]}
    runs = []
    for m, rows in seeds.items():
        for seed, accs in enumerate(rows):
            out = tmp_path / f"{m}-{seed}"
            out.mkdir()
            last5 = {**dict(zip(doms, map(float, accs))), "AVG": float(np.mean(accs))}
            (out / "summary.json").write_text(json.dumps({"last5": last5}))
            runs.append(RunConfig(method=m, dataset="office_caltech", seed=seed, out=str(out)))

    def row(*values):
        return {"office_caltech": dict(zip([*doms, "AVG"], values))}

    numbers = {"fedavg": row(61, 80, 50, 40, 55.5), "fpl": row(65, 75, 50, 45, 62), "fedprox": row(60, 70, 50, 40, 55)}
    spec = Table("tiny", [(m, "fpl-office") for m in numbers], numbers, paper_runs=3, claims=(
        Claim("T", "fpl minus fedavg", "fpl", "fedavg", "office_caltech"),
        Claim("T", "fedprox minus fedavg", "fedprox", "fedavg", "office_caltech"),
        Claim("T", "fedavg minus fpl", "fedavg", "fpl", "office_caltech", paper=1.0)))
    got = verdicts(spec, collect(runs), {"office_caltech": doms})
    assert {k: c.verdict for k, c in got.cells.items() if c.verdict != "consistent"} == {
        ("office_caltech", "fedavg", "amazon"): "differs", ("office_caltech", "fpl", "webcam"): "differs",
        ("office_caltech", "fpl", "AVG"): "differs",
        **{("office_caltech", "fedprox", d): "undecided" for d in [*doms, "AVG"]}}
    # FedProx minus FedAvg over the one seed both have: 55 - 55 = 0 (the rows' means would give 55 - 55.5)
    assert got.claims[1][2].mean == 0.0
    assert [(c.what, gap, c_v.verdict) for c, gap, c_v in got.claims] == [
        ("fpl minus fedavg", 6.5, "holds"), ("fedprox minus fedavg", -0.5, "undecided"),
        ("fedavg minus fpl", 1.0, "reversed")]
    assert got.summary() == ("cells 7 consistent, 3 differ, 5 undecided; claims 1 holding, 1 reversed, "
                             "1 undecided")


def test_a_grids_claims_pair_its_rows_and_fig5s_baseline_is_the_run_of_tables_1_and_2(tmp_path):
    """FedPLVM's Figure 5, its claims in words (FedPLVM at each tau above FPL, the best baseline of Tables 1 and 2),
    from made-up summaries in the folders the real planner gives: FedPLVM's grid runs, and FPL's runs as Table 1-2's
    plan names them (FPL is no row of the grid). Digit-5: three pairs, a paired t-test by hand; Office-10: FPL's
    seed 2 missing, two pairs, a sign test (p 0.5, undecided)."""
    from benchmark.results import protocol
    from ray_jobs.plan import plan
    from ray_jobs.report_grid import grid_verdicts

    def write(cfg, avg):
        Path(cfg.out).mkdir(parents=True)
        (Path(cfg.out) / "summary.json").write_text(json.dumps(
            {"complete": True, "protocol": protocol(cfg), "final": {"AVG": avg}}))

    domains = ["mnist", "usps", "syn", "mnistm", "amazon", "caltech", "dslr", "webcam"]
    grid = plan("fedplvm_fig5", "full", domains, tmp_path, None, find_data=False)
    fpl = [c for c in plan("fedplvm12", "full", domains, tmp_path, None, find_data=False) if c.method == "fpl"]
    base = {"digit5": 50.0, "office10": 40.0}
    for c in grid:
        write(c, base[c.dataset] + 10 * c.hparams["tau"] + c.seed ** 2)  # tau 0.07, seed 2: 50 + 0.7 + 4
    for c in fpl:
        if not (c.dataset == "office10" and c.seed == 2):
            write(c, base[c.dataset] + c.seed)
    got = {(c.dataset, c.minuend_value): (gap, v) for c, gap, v in grid_verdicts("fedplvm_fig5", "full", grid).claims}
    assert len(got) == 10 and all(gap == 1.0 for gap, _ in got.values())
    d = np.array([0.7 + s ** 2 - s for s in range(3)])  # 0.7, 0.7, 2.7
    t = d.mean() / (d.std(ddof=1) / np.sqrt(3))
    _, v07 = got[("digit5", 0.07)]
    assert (v07.test, v07.pairs) == ("paired t", 3) and v07.mean == pytest.approx(d.mean())
    assert v07.p == pytest.approx(2 * stats.t.sf(t, 2), rel=1e-6) and v07.verdict == ("holds" if v07.p < 0.05 else
                                                                                       "undecided")
    _, office = got[("office10", 0.2)]
    assert (office.test, office.pairs, office.p, office.verdict) == ("sign test", 2, 0.5, "undecided")
    assert office.mean == pytest.approx(2.0)  # 40 + 2 + s^2 - (40 + s) over seeds 0, 1: 2, 2
    assert office.needed == 3  # no spread at all: the third pair (a paired t-test) decides it
