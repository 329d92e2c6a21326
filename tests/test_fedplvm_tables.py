"""`make table-fedplvm PROFILE=smoke` end to end (Table 4's runs through Ray): FedPLVM's Tables 1 and 2 (its presets,
the final round, FedPCL and FedFA among its methods) and its Tables 3 to 5 as ablations, the run they share
(FedPLVM on Digit-5) run once; resumable; Table 4's prototypes per client per round from the runs' metrics."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmark import paper
from benchmark.results import read_jsonl
from lightning_modules.registry import METHODS
from ray_jobs.config import RunConfig
from ray_jobs.plan import plan
from ray_jobs.report import setting_line
from ray_jobs.sweep import execute, main
from ray_jobs.tables import GROUPS, TABLES, make_target

DOMAINS = "mnist,usps,amazon,dslr"  # two domains of each dataset (the shared data has no full SVHN)
T12 = ["fedavg", "fedprox", "fedproto", "fedpcl", "fedfa", "fpl", "fedplvm"]  # the paper's row order
# what the smoke profile's run names carry of its departures from the presets (`RunConfig.departures`)
SMOKE = RunConfig.from_preset("fedplvm-digit5", **TABLES["fedplvm12"].overrides("smoke")).departures_name
SKEW_SMOKE = RunConfig.from_preset("fedplvm-digit5-skew", **TABLES["fedplvm78"].overrides("smoke")).departures_name


@pytest.fixture(scope="module")
def smoke(slow_setup, ray_cluster, data_root, tmp_path_factory):
    """Table 4's two runs through Ray, then the whole group (`make table-fedplvm PROFILE=smoke`) in this
    process (`EXECUTOR=local`, the same round code; fewer process start-ups for CI): those two are complete."""
    out = tmp_path_factory.mktemp("fedplvm")
    args = ["--profile", "smoke", "--domains", DOMAINS, "--results-dir", str(out), "--data-root", str(data_root)]
    assert main(["--table", "fedplvm4", *args]) == 0
    assert main(["--table", "fedplvm", *args, "--executor", "local"]) == 0
    return out


def summary(out: Path, name: str) -> dict:
    return json.loads((out / "runs" / name / "summary.json").read_text())


def test_tables_1_and_2_beside_the_paper(smoke):
    df = pd.read_csv(smoke / "tablefedplvm12.csv")
    assert sorted(set(zip(df.method, df.dataset))) == sorted((m, d) for m in T12 for d in ("digit5", "office10"))
    assert set(df[df.dataset == "digit5"].domain) == {"mnist", "usps", "AVG of 2"}
    assert set(df[df.dataset == "office10"].domain) == {"amazon", "dslr", "AVG of 2"}
    cell = lambda m, d, dom: df[(df.method == m) & (df.dataset == d) & (df.domain == dom)].iloc[0]  # noqa: E731
    assert cell("fedplvm", "digit5", "mnist")["paper"] == 90.70  # PROTOCOL.md section 2, Table 1
    assert cell("fedproto", "office10", "dslr")["paper"] == 57.38  # Table 2
    assert cell("fpl", "office10", "AVG of 2")["paper"] == pytest.approx((54.38 + 61.25) / 2)
    for m in T12:  # ours: the final round of each run (FedPLVM's metric), not the last-5 mean
        for ds, name in (("digit5", f"{m}-digit5-no_svhn_syn_mnistm-default{SMOKE}-seed0"),
                         ("office10", f"{m}-office10-no_caltech_webcam-default{SMOKE}-seed0")):
            s = summary(smoke, name)
            assert s["rounds"] == 2
            cfg = json.loads((smoke / "runs" / name / "config.json").read_text())
            assert cfg["preset"] == f"fedplvm-{ds}" and "syn" not in cfg["domains"]  # no Synth stand-in run here
            for dom, v in s["final"].items():
                c = cell(m, ds, dom if dom != "AVG" else "AVG of 2")
                assert c["ours_mean"] == pytest.approx(v, abs=1e-4)
                assert c["diff"] == pytest.approx(v - c["paper"], abs=1e-3)
    assert TABLES["fedplvm12"].metric == "final" and not TABLES["fedplvm12"].not_implemented
    assert cell("fedpcl", "digit5", "usps")["paper"] == 84.74 and cell("fedfa", "office10", "dslr")["paper"] == 60.00
    assert list(dict.fromkeys(df.method)) == T12


def test_a_report_names_synth_a_stand_in_when_it_ran():
    """Digit-5's syn archive is FPL's SYN, not FedPLVM's SynthDigits: the report's setting line says so."""
    cfg = RunConfig.from_preset("fedplvm-digit5", method="fedplvm")
    line = setting_line(cfg, ["mnist", "usps", "syn"])
    assert line.startswith("Preset fedplvm-digit5: 50 rounds x 2 local epochs, batch 32")
    assert "syn: FPL's SYN (Roy et al. 2018" in line and "stands in for FedPLVM's SynthDigits" in line
    assert "stands in" not in setting_line(cfg, ["mnist", "usps"])
    assert "stands in" not in setting_line(RunConfig.from_preset("fpl-digits"), ["mnist", "syn"])  # FPL's own SYN


def test_ablation_tables_and_the_shared_run(smoke, data_root):
    t3 = pd.read_csv(smoke / "tablefedplvm3.csv")
    assert list(dict.fromkeys(t3.method)) == ["fedplvm_avg_avg", "fedplvm_avg_cluster", "fedplvm"]
    assert t3[(t3.method == "fedplvm") & (t3.domain == "usps")].iloc[0]["paper"] == 86.90  # Table 3's own run
    # Tables 4 and 5 give only an AVG over all five domains: not compared with an AVG over two
    for t, methods in (("4", ["fedplvm_no_global_clustering", "fedplvm"]),
                       ("5", ["fedplvm_no_loss", "fedplvm_contrast_only", "fedplvm_correction_only", "fedplvm"])):
        df = pd.read_csv(smoke / f"tablefedplvm{t}.csv")
        assert list(dict.fromkeys(df.method)) == methods and df.paper.isna().all()
        for m in methods:  # the paper's AVG over its five domains, none of its domain values
            assert set(TABLES[f"fedplvm{t}"].paper[m]["digit5"]) == {"AVG"}
    # every ablation's FedPLVM row is the one Digit-5 run of Tables 1-2: one folder per distinct run the group plans
    names = sorted(p.name for p in (smoke / "runs").iterdir())
    runs = {r.out: r for t in GROUPS["fedplvm"] for r in plan(t, "smoke", DOMAINS.split(","), smoke, str(data_root))}
    assert names == sorted(Path(out).name for out in runs)
    assert sum(Path(out).name == f"fedplvm-digit5-no_svhn_syn_mnistm-default{SMOKE}-seed0" for out in runs) == 1
    v = summary(smoke, f"fedplvm-digit5-no_svhn_syn_mnistm-default{SMOKE}-seed0")["final"]["AVG"]
    for t in ("3", "4", "5"):
        df = pd.read_csv(smoke / f"tablefedplvm{t}.csv")
        assert (df[(df.method == "fedplvm") & (df.domain == "AVG of 2")].iloc[0]["ours_mean"]
                == pytest.approx(v, abs=1e-4))
    executors = {n: json.loads((smoke / "runs" / n / "config.json").read_text())["executor"] for n in names}
    assert {n for n, e in executors.items() if e == "ray"} == {f"{m}-digit5-no_svhn_syn_mnistm-default{SMOKE}-seed0"
                                                              for m in ("fedplvm", "fedplvm_no_global_clustering")}
    # resumable: a second sweep of the group runs nothing
    assert execute(list(runs.values()), None) == []


def test_tables_7_and_8_label_skew(smoke):
    """FedPLVM's rows of Tables 7-8 at the smoke profile (the other methods run the same split code): Dirichlet
    label skew (Digit-5 at concentration 0.5, Office-10 at 1.0), every image of the drawn counts, weights averaged
    by sample count; compared with the paper's."""
    df = pd.read_csv(smoke / "tablefedplvm78.csv")
    assert set(df.method) == {"fedplvm"} and set(df.dataset) == {"digit5", "office10"}
    cell = lambda d, dom: df[(df.dataset == d) & (df.domain == dom)].iloc[0]  # noqa: E731
    assert cell("digit5", "usps")["paper"] == 73.98 and cell("office10", "dslr")["paper"] == 59.79
    assert cell("office10", "AVG of 2")["paper"] == pytest.approx((55.28 + 59.79) / 2)
    for ds, alpha, name in ((
            "digit5", 0.5, f"fedplvm-digit5-no_svhn_syn_mnistm-default-dirichlet0.5{SKEW_SMOKE}-seed0"),
            ("office10", 1.0, f"fedplvm-office10-no_caltech_webcam-default-dirichlet1{SKEW_SMOKE}-seed0")):
        cfg = json.loads((smoke / "runs" / name / "config.json").read_text())
        assert cfg["dirichlet_alpha"] == alpha and cfg["aggregation"] == "samples" and cfg["client_fraction"] == 1.0
        assert cfg["preset"] == f"fedplvm-{ds}-skew"
        assert all(sum(c["class_counts"]) == c["num_samples"] for c in cfg["clients"])
        assert summary(smoke, name)["final"]["AVG"] == pytest.approx(cell(ds, "AVG of 2")["ours_mean"], abs=1e-4)
    name = f"fedplvm-digit5-no_svhn_syn_mnistm-default-dirichlet0.5{SKEW_SMOKE}-seed0"
    usps = next(c for c in json.loads((smoke / "runs" / name / "config.json").read_text())["clients"]
                if c["domain"] == "usps")
    assert usps["class_counts"] == [5, 1, 2, 7, 2, 9, 20, 1, 3, 14]  # seed 0's draw (tests/test_label_skew.py)


def test_table9_kmeans(smoke):
    """Table 9 at the smoke profile: K-Means with FINCH's K (the K = 2 and 5 rows the same code, full profile only)."""
    df = pd.read_csv(smoke / "tablefedplvm9.csv")
    assert list(dict.fromkeys(df.method)) == ["fedplvm_kmeans_adaptive"]
    row = df[df.domain == "usps"].iloc[0]
    assert row["paper"] == 85.83
    s = summary(smoke, f"fedplvm_kmeans_adaptive-digit5-no_svhn_syn_mnistm-default{SMOKE}-seed0")
    assert s["hparams"]["clustering"] == "kmeans" and s["hparams"]["kmeans_k"] == "adaptive"
    assert row["ours_mean"] == pytest.approx(s["final"]["usps"], abs=1e-4)


def test_table12_local_clustering_global_average(smoke):
    df = pd.read_csv(smoke / "tablefedplvm_t12.csv")
    assert list(dict.fromkeys(df.method)) == ["fedplvm_cluster_avg"]
    assert df[df.domain == "mnist"].iloc[0]["paper"] == 89.43
    rounds = read_jsonl(smoke / "runs" / f"fedplvm_cluster_avg-digit5-no_svhn_syn_mnistm-default{SMOKE}-seed0"
                        / "metrics.jsonl")
    assert [r["prototypes_received"] for r in rounds[1:]] == [10]  # one global prototype per class


def test_table10_paper_avg_is_over_clients():
    """The paper's Table 10 Avg is its domains' values weighted by their clients (10), not FPL's mean over domains."""
    for m, by_domain in paper.FEDPLVM_TABLE10.items():
        v = by_domain["digit5"]
        over_clients = (v["mnist"] + 4 * v["svhn"] + 2 * v["usps"] + 2 * v["syn"] + v["mnistm"]) / 10
        assert over_clients == pytest.approx(paper.FEDPLVM_TABLE10_CLIENT_AVG[m], abs=0.005)
        assert v["AVG"] == pytest.approx(np.mean([v[d] for d in paper.FEDPLVM_DOMAINS["digit5"]]))
        assert abs(v["AVG"] - over_clients) > 3


def test_table10_unbalanced_clients(smoke, data_root):
    """Table 10's AVG over clients (the paper's Avg there), ours and the paper's weighted alike on the domains run,
    from the report's cells (`client_avg`); the AVG over domains beside it; SVHN's 4 clients not run."""
    from ray_jobs.report import client_avg

    name = f"fedplvm-digit5-no_svhn_syn_mnistm-unbalanced{SMOKE}-seed0"
    cfg = json.loads((smoke / "runs" / name / "config.json").read_text())
    assert [c["domain"] for c in cfg["clients"]] == ["mnist", "usps", "usps"]  # SVHN's 4 clients dropped with it
    assert [c["num_samples"] for c in cfg["clients"]] == [40, 40, 40]  # 4 of each class each (smoke: 40%)
    final = summary(smoke, name)["final"]
    (run,) = plan("fedplvm10", "smoke", DOMAINS.split(","), smoke, str(data_root))
    assert run.layout == {"mnist": 1, "svhn": 4, "usps": 2, "syn": 2, "mnistm": 1}
    df = pd.read_csv(smoke / "tablefedplvm10.csv").set_index(["method", "domain"])
    ours = {d: df.loc[("fedplvm", d), "ours_mean"] for d in ("mnist", "usps")}
    assert ours == pytest.approx({d: final[d] for d in ours}, abs=1e-4)
    got = client_avg(TABLES["fedplvm10"], "fedplvm", ours, run.layout, paper.FEDPLVM_TABLE10["fedplvm"]["digit5"])
    assert got == (pytest.approx((final["mnist"] + 2 * final["usps"]) / 3, abs=1e-4),
                   pytest.approx((90.90 + 2 * 85.92) / 3))
    assert (df.loc[("fedplvm", "AVG of 2"), "ours_mean"], df.loc[("fedplvm", "AVG of 2"), "paper"]) == (
        pytest.approx(final["AVG"], abs=1e-4), pytest.approx((90.90 + 85.92) / 2))


def test_table11_privacy(smoke):
    """Table 11 at the smoke profile: DP-SGD and prototype noise together (the other two rows: one of the two each),
    under the sequential engine (auto on the CPU), the model with GroupNorm; compared with the paper's w/ w/."""
    df = pd.read_csv(smoke / "tablefedplvm11.csv")
    assert list(dict.fromkeys(df.method)) == ["fedplvm_dp_both"]
    row = df[df.domain == "mnist"].iloc[0]
    assert row["paper"] == 89.74
    name = f"fedplvm_dp_both-digit5-no_svhn_syn_mnistm-default{SMOKE}-seed0"
    cfg = json.loads((smoke / "runs" / name / "config.json").read_text())
    assert cfg["hparams"]["dp_sgd"] and cfg["hparams"]["proto_noise"] and cfg["model_options"] == {"norm": "group"}
    assert {a["engine"] for a in cfg["provenance"]["actors"]} == {"sequential"}
    assert row["ours_mean"] == pytest.approx(summary(smoke, name)["final"]["mnist"], abs=1e-4)
    assert paper.FEDPLVM_TABLE11["fedplvm_dp_protos"]["digit5"]["AVG"] == 68.48


def test_table4_prototypes_received_per_round(smoke):
    """Table 4's prototypes each client receives per round, from the runs' metrics by hand: what the report's
    column (`prototypes_received`) holds; the paper's beside it."""
    from ray_jobs.report import prototypes_received

    got = {}
    for m in ("fedplvm_no_global_clustering", "fedplvm"):
        rounds = read_jsonl(smoke / "runs" / f"{m}-digit5-no_svhn_syn_mnistm-default{SMOKE}-seed0" / "metrics.jsonl")
        assert "prototypes_received" not in rounds[0]  # round 0: no prototypes yet
        got[m] = np.mean([r["prototypes_received"] for r in rounds[1:]])
        uploaded = [sum(c["up_prototypes"] for c in r["communication"]["per_client"].values()) / 512
                    for r in rounds[:-1]]  # each round's local prototypes, 512 floats each
        if m == "fedplvm_no_global_clustering":  # every local prototype of the round before goes to every client
            assert [r["prototypes_received"] for r in rounds[1:]] == uploaded
        else:  # FINCH's clusters of them: at most as many
            assert all(r["prototypes_received"] <= n for r, n in zip(rounds[1:], uploaded))
        run = smoke / "runs" / f"{m}-digit5-no_svhn_syn_mnistm-default{SMOKE}-seed0"
        assert prototypes_received(run) == pytest.approx(got[m]) and m in paper.FEDPLVM_TABLE4_PROTOTYPES
    # without global clustering every local prototype is sent: at least one per class from each of the two
    # clients; FINCH's last partition has fewer clusters than points, at least one per class
    assert got["fedplvm_no_global_clustering"] >= 20 and got["fedplvm_no_global_clustering"] > got["fedplvm"] >= 10


def test_make_targets():
    assert make_target("2") == "table2" and make_target("fedplvm4") == "table-fedplvm"
    assert set(GROUPS["fedplvm"]) <= set(TABLES)


def test_figure_9_local_prototypes_per_class_from_what_each_client_uploaded(smoke):
    """Each round records, per client, the prototypes it uploads per class it holds: for FedPLVM the count of its
    uploaded prototype floats over (feature width x its 10 classes), for FPL's class means exactly 1; Table 1's
    report draws FedPLVM's counts per domain over rounds (its Figure 9)."""
    from benchmark.models import MODELS

    dim = MODELS["resnet10_plvm"].feature_dim
    for m, expect_one in (("fedplvm", False), ("fpl", True)):
        recs = read_jsonl(smoke / "runs" / f"{m}-digit5-no_svhn_syn_mnistm-default{SMOKE}-seed0" / "metrics.jsonl")
        for rec in recs:
            counts, comm = rec["local_prototypes_per_class"], rec["communication"]["per_client"]
            assert sorted(counts) == sorted(comm) == ["0", "1"]
            for cid, n in counts.items():
                assert n == (1.0 if expect_one else comm[cid]["up_prototypes"] / (dim * 10))
                assert n >= 1
    assert (smoke / "figures" / "tablefedplvm12" / "local_prototypes.svg").exists()
    assert (smoke / "figures" / "tablefedplvm12" / "local_prototypes.png").exists()
    assert not (smoke / "figures" / "tablefedplvm3" / "local_prototypes.png").exists()  # Table 1's figure only


# --------------------------------------------------------------------------- Figures 4 and 5: hyperparameter grids
GRIDS = {"fedplvm_fig4a": ("alpha", [0.125, 0.25, 0.5, 0.75, 1.0], ["fedplvm"], ["digit5"]),
         "fedplvm_fig4b": ("lambda", [0.1, 1.0, 10.0, 100.0], ["fpl", "fedplvm"], ["digit5"]),
         "fedplvm_fig5": ("tau", [0.02, 0.045, 0.07, 0.1, 0.2], ["fedplvm"], ["digit5", "office10"])}


def test_grid_tables_plan_a_run_per_value_the_default_one_table_1s(data_root, tmp_path):
    """Each grid table's full plan: a run per row, value and seed, the value in its hparams over the method's
    default; the run at the default is Table 1-2's own (same name, folder and protocol), the others' names say
    the value."""
    from benchmark.results import protocol

    t12 = {c.out: c for c in plan("fedplvm12", "full", DOMAINS.split(","), tmp_path, str(data_root))}
    for table, (name, values, methods, datasets) in GRIDS.items():
        runs = plan(table, "full", DOMAINS.split(","), tmp_path, str(data_root))
        assert len(runs) == len(values) * len(methods) * len(datasets) * 3
        assert {c.seed for c in runs} == {0, 1, 2} and table in GROUPS["fedplvm"]
        for m in methods:
            for ds in datasets:
                got = [c for c in runs if c.method == m and c.dataset == ds and c.seed == 1]
                assert [c.hparams[name] for c in got] == values
                default = METHODS[m].defaults[name]
                for c in got:
                    assert c.hparams == {**METHODS[m].defaults, name: c.hparams[name]}
                    dom = "no_svhn_syn_mnistm" if ds == "digit5" else "no_caltech_webcam"
                    suffix = "" if c.hparams[name] == default else f"-{name}{c.hparams[name]:g}"
                    assert c.run_name == f"{m}-{ds}-{dom}-default{suffix}-seed1"
                    if c.hparams[name] == default:  # the very run of Tables 1 and 2
                        assert protocol(t12[c.out]) == protocol(c)
                    else:
                        assert c.out not in t12
    names = [c.run_name for c in plan("fedplvm_fig4b", "full", None, tmp_path, str(data_root)) if c.seed == 0]
    assert names == ["fpl-digit5-default-lambda0.1-seed0", "fpl-digit5-default-seed0",
                     "fpl-digit5-default-lambda10-seed0", "fpl-digit5-default-lambda100-seed0",
                     "fedplvm-digit5-default-lambda0.1-seed0", "fedplvm-digit5-default-lambda1-seed0",
                     "fedplvm-digit5-default-lambda10-seed0", "fedplvm-digit5-default-seed0"]
    # 54 runs beside Tables 1-2's: the group's full plan
    group = {c.out for t in GROUPS["fedplvm"] for c in plan(t, "full", None, tmp_path, str(data_root))}
    others = {c.out for t in GROUPS["fedplvm"] if TABLES[t].grid is None for c in plan(t, "full", None, tmp_path,
                                                                                        str(data_root))}
    assert len(group - others) == 3 * (4 + 3 + 3 + 4 * 2)


def test_a_sweep_runs_the_grid_values_it_names(data_root, tmp_path, capsys):
    """`--values` (make VALUES=...): a grid table's runs at those values of its hyperparameter, the default one
    included; one-line errors for a value not in the grid, a table without one, and a value that is not a
    number."""
    from ray_jobs.plan import select

    runs = plan("fedplvm_fig4b", "full", None, tmp_path, str(data_root))
    picked = select("fedplvm_fig4b", "full", runs, values=[1.0, 10.0])
    assert sorted({(c.method, c.run_name.split("-")[-2]) for c in picked}) == [
        ("fedplvm", "lambda1"), ("fedplvm", "lambda10"), ("fpl", "default"), ("fpl", "lambda10")]  # FPL's default: 1
    assert len(picked) == 2 * 2 * 3
    assert select("fedplvm_fig4b", "full", runs, methods=["fpl"], seeds=[0], values=[0.1])[0].run_name == \
        "fpl-digit5-default-lambda0.1-seed0"
    base = ["--profile", "full", "--results-dir", str(tmp_path), "--data-root", str(data_root), "--executor", "local"]
    for args, message in ((["--table", "fedplvm_fig5", "--values", "0.3"], "unknown value(s) 0.3 in table "
                           "fedplvm_fig5 at the full profile; choose one of: 0.02, 0.045, 0.07, 0.1, 0.2."),
                          (["--table", "fedplvm12", "--values", "1"], "table fedplvm12 has no hyperparameter grid: "
                           "--values is for fedplvm_fig4a, fedplvm_fig4b, fedplvm_fig5."),
                          (["--table", "fedplvm_fig5", "--values", "low"], "--values takes comma-separated numbers")):
        assert main([*args, *base]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_grid_reports_and_figures(smoke):
    """The grids' smoke profile in the group: Figure 4 left at alpha 0.25 (Table 1's run) and 1, Figure 4 right FPL at
    lambda 1 (Table 1's FPL run) and 10, Figure 5 at tau 0.07 (Table 1-2's runs); each report's cells are the runs'
    final values, the figure redrawn by `python -m ray_jobs.figures all`."""
    from ray_jobs import figures as cli

    dom = {"digit5": "no_svhn_syn_mnistm", "office10": "no_caltech_webcam"}
    expect = {"fedplvm_fig4a": [("fedplvm", "digit5", 0.25, ""), ("fedplvm", "digit5", 1.0, "-alpha1")],
              "fedplvm_fig4b": [("fpl", "digit5", 1.0, ""), ("fpl", "digit5", 10.0, "-lambda10")],
              "fedplvm_fig5": [("fedplvm", "digit5", 0.07, ""), ("fedplvm", "office10", 0.07, "")]}
    for table, rows in expect.items():
        name = GRIDS[table][0]
        df = pd.read_csv(smoke / f"table{table}.csv")
        assert len(df) == 3 * len(rows)
        for m, ds, v, suffix in rows:
            s = summary(smoke, f"{m}-{ds}-{dom[ds]}-default{suffix}{SMOKE}-seed0")
            assert s["hparams"][name] == v and s["rounds"] == 2
            for d, acc in s["final"].items():
                cell = df[(df.method == m) & (df.dataset == ds) & (df.value == v)
                          & (df.domain == (d if d != "AVG" else "AVG of 2"))].iloc[0]
                assert cell["ours_mean"] == pytest.approx(acc, abs=1e-4) and cell["seeds"] == 1
                assert cell["default"] == (v == METHODS[m].defaults[name]) and cell["hparam"] == name
        assert set(df.profile) == {"smoke"} and (smoke / "figures" / f"table{table}" / "grid.png").exists()
        links = re.findall(r"\]\(([^)\s]+)\)", (smoke / f"table{table}.md").read_text())  # its figure, nothing else
        assert sorted(links) == [f"figures/table{table}/grid.{f}" for f in ("png", "svg")]
    fig = smoke / "figures" / "tablefedplvm_fig4a" / "grid.png"
    fig.unlink()
    written = cli.regenerate([smoke])
    assert fig.exists() and fig in written
