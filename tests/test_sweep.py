"""`make table2 PROFILE=smoke` end to end: 16 method-dataset rows beside the paper; resumable sweep."""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmark.data import DataError
from benchmark.results import is_complete, protocol, read_jsonl, run_complete
from ray_jobs import figures as cli
from ray_jobs.config import RunConfig
from ray_jobs.plan import check_data, plan, reported_runs, select
from ray_jobs.run import RunError
from ray_jobs.sweep import execute, main
from ray_jobs.tables import TABLES

METHODS = ["fedavg", "fedprox", "moon", "feddyn", "fedopt", "fedproc", "fedproto", "fpl"]
ARGS = ["--table", "2", "--profile", "smoke", "--domains", "mnist,usps,syn"]
# what the smoke profile's run names carry of its departures from the presets (`RunConfig.departures`)
SMOKE = RunConfig.from_preset("fpl-office", **TABLES["2"].overrides("smoke")).departures_name


def test_precision_and_drop_last_are_part_of_a_runs_protocol(data_root, tmp_path):
    """`make table2 PRECISION=bf16-mixed`: another protocol, in folders of their own (named -bf16-mixed)."""
    fp32 = plan("2", "smoke", ["mnist", "usps", "syn"], tmp_path, str(data_root))
    bf16 = plan("2", "smoke", ["mnist", "usps", "syn"], tmp_path, str(data_root), {"precision": "bf16-mixed"})
    assert {c.precision for c in bf16} == {"bf16-mixed"}
    assert [c.out for c in bf16] == [c.out.replace("-seed", "-bf16-mixed-seed") for c in fp32]
    assert protocol(bf16[0]) == {**protocol(fp32[0]), "precision": "bf16-mixed"}
    assert protocol(fp32[0])["drop_last"] is False


def test_checkpoint_every_and_actor_restarts_are_not_part_of_a_runs_protocol(data_root, tmp_path):
    """`make table2 CHECKPOINT_EVERY=10 ACTOR_RESTARTS=0`: every run gets them, and a complete run stays complete."""
    plain = plan("2", "smoke", ["mnist", "usps", "syn"], tmp_path, str(data_root))
    fast = plan("2", "smoke", ["mnist", "usps", "syn"], tmp_path, str(data_root),
                {"checkpoint_every": 10, "actor_restarts": 0})
    assert {(c.checkpoint_every, c.actor_restarts, c.states_every_round) for c in fast} == {(10, 0, False)}
    assert {(c.checkpoint_every, c.actor_restarts, c.states_every_round) for c in plain} == {(1, 3, True)}
    assert ([protocol(c) for c in fast] == [protocol(c) for c in plain]
            and [c.out for c in fast] == [c.out for c in plain])


def test_sweep_stops_before_any_run_when_a_domain_it_reads_is_absent(data_root, tmp_path, capsys):
    assert main(["--table", "2", "--profile", "smoke", "--results-dir", str(tmp_path), "--data-root", str(data_root),
                 "--executor", "local"]) == 2
    assert re.search(r"svhn_train\.npz.*started no run.*DOMAINS=mnist,usps,syn make table2", capsys.readouterr().err)
    assert not (tmp_path / "runs").exists()
    # a table of a group has no make target of its own: the hint is the --domains the sweep takes, nothing more
    assert main(["--table", "fedplvm_fig4a", "--profile", "smoke", "--results-dir", str(tmp_path), "--data-root",
                 str(data_root), "--executor", "local"]) == 2
    assert capsys.readouterr().err.endswith("Without svhn: --domains mnist,usps,syn,mnistm. The sweep started no "
                                            "run.\n")


def test_a_domain_none_of_the_tables_reads_is_noted(data_root, tmp_path, capsys):
    """Table 2 has no MNIST-M: naming it changes nothing, and the sweep says so (one DOMAINS for a group's tables,
    some of which read only one dataset, stays fine); a group reads its tables' union."""
    assert main(["--table", "2", "--domains", "mnist,usps,syn,mnistm", "--results-dir", str(tmp_path),
                 "--data-root", str(data_root), "--dry-run"]) == 0
    assert capsys.readouterr().err == ("note: --table 2 reads no mnistm (its datasets digits, office_caltech have "
                                       "mnist, usps, svhn, syn, caltech, amazon, webcam, dslr): --domains changes "
                                       "nothing there for it.\n")
    assert main(["--table", "fedplvm", "--domains", "mnist,usps,syn,mnistm,caltech", "--results-dir", str(tmp_path),
                 "--data-root", str(data_root), "--dry-run"]) == 0
    assert "note:" not in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_sweep_checks_only_the_data_of_the_runs_it_makes(data_root, tmp_path):
    """Office-Caltech's runs of Table 2 need no Digits file: the missing SVHN stops nothing (as a new user tries it,
    with and without --domains)."""
    runs = plan("2", "smoke", None, tmp_path, str(data_root))  # planning reads no data file
    office = select("2", "smoke", runs, datasets=["office_caltech"])
    assert {c.dataset for c in office} == {"office_caltech"} and len(office) == 8
    check_data(office, "2")
    doms = plan("2", "smoke", ["caltech", "amazon", "webcam", "dslr"], tmp_path, str(data_root))
    check_data(select("2", "smoke", doms, datasets=["office_caltech"]), "2")
    with pytest.raises(DataError, match=r"svhn_train\.npz"):
        check_data(select("2", "smoke", runs, datasets=["digits"]), "2")


@pytest.fixture(scope="module")
def smoke(slow_setup, data_root, tmp_path_factory):
    """`make table2 PROFILE=smoke EXECUTOR=local`: Office-Caltech's 8 runs first (`--datasets office_caltech`, no
    W&B), then the table, which runs the 8 Digits runs (W&B offline), finds the Office-Caltech ones complete and
    reports all 16 (and logs the report to W&B). In this process: a sweep through Ray is
    test_a_failed_run_frees_its_actors_and_the_sweep_goes_on's, and Ray's runs equal local ones (test_e2e,
    test_methods_apart); 16 runs' actor start-ups were CI's slowest fixture."""
    out = tmp_path_factory.mktemp("table2")
    args = [*ARGS, "--results-dir", str(out), "--data-root", str(data_root), "--executor", "local"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "disabled")
        assert main([*args, "--datasets", "office_caltech"]) == 0
    assert main(args) == 0
    return out


def test_report_has_every_row_beside_the_paper(smoke):
    df = pd.read_csv(smoke / "table2.csv")
    assert set(df.profile) == {"smoke"}
    assert sorted(set(zip(df.method, df.dataset))) == sorted((m, d) for m in METHODS
                                                             for d in ("digits", "office_caltech"))
    assert set(df[df.dataset == "digits"].domain) == {"mnist", "usps", "syn", "AVG of 3"}  # svhn left empty
    assert set(df[df.dataset == "office_caltech"].domain) == {"caltech", "amazon", "webcam", "dslr", "AVG"}
    # paper values from PROTOCOL.md, Table 2
    cell = lambda m, d, dom: df[(df.method == m) & (df.dataset == d) & (df.domain == dom)].iloc[0]  # noqa: E731
    assert cell("fpl", "digits", "syn")["paper"] == 61.20
    assert cell("fedavg", "office_caltech", "dslr")["paper"] == 36.00
    assert cell("moon", "office_caltech", "AVG")["paper"] == 49.74
    assert cell("fedopt", "digits", "AVG of 3")["paper"] == pytest.approx((96.23 + 91.80 + 57.85) / 3)
    # our numbers are the summaries' last-5 means; diff and flag follow
    for m in METHODS:
        for ds, name in (("digits", f"{m}-digits-no_svhn-code{SMOKE}-seed0"),
                         ("office_caltech", f"{m}-office_caltech-default{SMOKE}-seed0")):
            s = json.loads((smoke / "runs" / name / "summary.json").read_text())
            for dom, v in s["last5"].items():
                c = cell(m, ds, dom if dom != "AVG" or ds == "office_caltech" else "AVG of 3")
                assert c["ours_mean"] == pytest.approx(v, abs=1e-4)
                assert c["diff"] == pytest.approx(v - c["paper"], abs=1e-3)
                assert c["flag"] == (abs(v - c["paper"]) > 2)
    # provenance, which the report's last line gives (`commit_label`, `hardware_label`): the commit the runs came from
    # and their hardware (no GPU here, this machine)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                          text=True).stdout.strip()
    for run in (smoke / "runs").iterdir():
        prov = json.loads((run / "config.json").read_text())["provenance"]
        assert prov["git"]["commit"] == head
        assert ({(p["gpu"], p["cpu_count"], p["host"]) for p in [prov["driver"], *prov["actors"]]}
                == {(None, os.cpu_count(), socket.gethostname())})


def test_a_report_says_its_profile_the_domains_left_out_the_runs_missing_and_where_they_came_from():
    """A report's title (`report.title`) and its provenance line's parts (`commit_label`, `hardware_label`), from
    hand-made values."""
    from benchmark.provenance import commit_label, hardware_label
    from ray_jobs.report import title

    assert title("FPL Table 2", "full", {}, 48, 48) == "# FPL Table 2: reproduction (full profile)"
    assert title("FPL Table 2", "smoke", {"digits": ["svhn"]}, 5, 16) == (
        "# FPL Table 2: reproduction (smoke profile, SMOKE SETTINGS: not comparable to the paper) — without svhn "
        "(digits) — PARTIAL: 5 of its 16 runs")
    assert commit_label({"git": {"commit": "0123456789abcdef", "dirty": True}}) == "0123456789ab (dirty tree)"
    assert commit_label({"git": {"commit": None}}) == "unknown commit"
    cpu = {"host": "a", "cpu": "AMD EPYC", "cpu_count": 2, "gpu": None}
    assert hardware_label({"driver": cpu, "actors": [cpu]}) == "no GPU; CPU AMD EPYC x 2; 1 host"
    assert hardware_label({"driver": cpu, "actors": [{**cpu, "host": "b", "gpu": "NVIDIA H200"}]}) == (
        "GPU NVIDIA H200; CPU AMD EPYC x 2; 2 hosts")
    assert hardware_label(None) == "unknown hardware"


@pytest.mark.slow
def test_rerun_runs_nothing_and_a_deleted_summary_reruns_exactly_that_run(ray_cluster, smoke, data_root):
    """Through Ray (the plan's default executor): the deleted run made in process comes back with its numbers."""
    runs = plan("2", "smoke", ["mnist", "usps", "syn"], smoke, str(data_root))
    assert len(runs) == 16
    assert execute(runs, None) == []
    victim = Path(runs[5].out)
    accuracies = lambda: [r["accuracy"] for r in read_jsonl(victim / "metrics.jsonl")]  # noqa: E731
    before = accuracies()
    (victim / "summary.json").unlink()
    assert execute(runs, None) == [runs[5].run_name]
    assert (victim / "summary.json").exists()
    assert accuracies() == before  # same seed, same numbers, through Ray as in process
    assert np.all([(Path(r.out) / "summary.json").exists() for r in runs])
    # a complete run of another protocol in the same folder does not count
    assert is_complete(Path(runs[0].out), protocol(runs[0]))
    assert not is_complete(Path(runs[0].out), {**protocol(runs[0]), "local_epochs": 10})


@pytest.mark.slow
def test_a_partial_sweep_runs_what_it_names_and_reports_every_complete_run(smoke, data_root, tmp_path, capsys,
                                                                          monkeypatch):
    """`--methods/--seeds/--datasets` pick the runs to run; the report covers the table's complete runs, says it is
    partial, and its cells are those of the full report (same runs, same numbers)."""
    monkeypatch.setenv("WANDB_MODE", "disabled")  # (the full report's W&B run is tested below, alone in $WANDB_DIR)
    copy = tmp_path / "part"
    shutil.copytree(smoke, copy)
    for run_dir in (copy / "runs").iterdir():  # only FedAvg and FPL stay complete
        if not run_dir.name.startswith(("fedavg-", "fpl-")):
            (run_dir / "summary.json").unlink()
    args = [*ARGS, "--results-dir", str(copy), "--data-root", str(data_root), "--executor", "local"]
    assert main([*args, "--methods", "fedavg,fpl", "--seeds", "0"]) == 0
    assert "4 of 4 runs already complete; running 0" in capsys.readouterr().out
    assert main([*args, "--methods", "fedprox", "--datasets", "office_caltech"]) == 0
    out = capsys.readouterr().out
    assert "0 of 1 runs already complete; running 1" in out
    name = f"fedprox-office_caltech-default{SMOKE}-seed0"
    final = json.loads((copy / "runs" / name / "summary.json").read_text())["final"]
    assert f"] {name}: round 2/2, AVG {final['AVG']:.2f}\n" in out  # the sweep's progress
    part, full = pd.read_csv(copy / "table2.csv"), pd.read_csv(smoke / "table2.csv")
    assert sorted(set(zip(part.method, part.dataset))) == [("fedavg", "digits"), ("fedavg", "office_caltech"),
                                                           ("fedprox", "office_caltech"), ("fpl", "digits"),
                                                           ("fpl", "office_caltech")]
    key = ["method", "dataset", "domain"]
    both = part.merge(full, on=key, suffixes=("", "_full"))
    assert len(both) == len(part) and np.allclose(both.ours_mean, both.ours_mean_full)
    runs = plan("2", "smoke", ["mnist", "usps", "syn"], copy, str(data_root))  # the title's "PARTIAL: 5 of its 16 runs"
    assert (sum(map(run_complete, runs)), len(runs)) == (5, 16)
    assert main([*args, "--seeds", "one"]) == 2  # (names not in the table: tests/test_bad_input.py)
    err = capsys.readouterr().err
    assert "--seeds takes comma-separated integers, e.g. 0,1,2 (got 'one')." in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_report_only_without_domains_reports_the_runs_made_on_fewer(smoke, data_root, tmp_path, monkeypatch):
    """A table's runs made with `--domains` (a data root without SVHN) are reported by `--report-only` without it:
    the same cells as the sweep's own report, the title naming the domain left out, nothing run."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    copy = tmp_path / "again"
    shutil.copytree(smoke, copy)
    (copy / "table2.csv").unlink()
    before = sorted(p.name for p in (copy / "runs").iterdir())
    assert main(["--table", "2", "--profile", "smoke", "--results-dir", str(copy), "--data-root", str(data_root),
                 "--report-only"]) == 0
    assert sorted(p.name for p in (copy / "runs").iterdir()) == before  # no run made
    again, full = pd.read_csv(copy / "table2.csv"), pd.read_csv(smoke / "table2.csv")
    pd.testing.assert_frame_equal(again, full)
    # the runs it reads, which its title names (without svhn (digits), not partial): those made on fewer domains
    runs = reported_runs(plan("2", "smoke", None, copy, str(data_root)))
    assert {c.dataset: c.dropped_domains for c in runs if c.dropped_domains} == {"digits": ["svhn"]}
    assert all(map(run_complete, runs))


def test_a_sweep_never_replaces_a_finished_run_of_another_protocol(smoke, data_root, tmp_path, capsys):
    """A finished run of another protocol under a run's name (a bf16-mixed run that `ray_jobs.run`'s former default,
    auto, made on a processor with native bfloat16 under the 32-true name), then a 32-true sweep: one line, code 2,
    naming the folder and the difference, no run started and every file of the finished runs as it was."""
    copy = tmp_path / "bf16"
    shutil.copytree(smoke, copy)
    folder = copy / "runs" / f"fedavg-office_caltech-default{SMOKE}-seed0"
    summary = json.loads((folder / "summary.json").read_text())
    summary["protocol"]["precision"] = "bf16-mixed"
    (folder / "summary.json").write_text(json.dumps(summary))
    before = {p: p.read_bytes() for p in (copy / "runs").rglob("*") if p.is_file()}
    code = main([*ARGS, "--results-dir", str(copy), "--data-root", str(data_root), "--executor", "local",
                 "--datasets", "office_caltech", "--methods", "fedavg"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert (f"error: 1 of the runs to make would replace a finished run of another protocol in its folder: {folder} "
            "(precision: 'bf16-mixed' there, '32-true' here). The sweep started no run.") in err
    assert {p: p.read_bytes() for p in (copy / "runs").rglob("*") if p.is_file()} == before


@pytest.mark.slow
def test_report_links_its_figures_and_make_figures_redraws_them(smoke):
    fig_dir = smoke / "figures" / "table2"
    expected = ["bars.png", "bars.svg", "curves.png", "curves.svg"]
    assert sorted(p.name for p in fig_dir.iterdir()) == expected
    links = re.findall(r"\]\(([^)\s]+)\)", (smoke / "table2.md").read_text())  # each figure once, and nothing else
    assert sorted(links) == [f"figures/table2/{name}" for name in expected]
    before = {p.name: p.stat().st_mtime_ns for p in fig_dir.iterdir()}
    for p in fig_dir.iterdir():
        p.unlink()
    assert cli.main(["all", str(smoke)]) == 0  # `make figures`: from the run folders, no training
    assert (sorted(p.name for p in fig_dir.iterdir()) == expected
            and all(p.stat().st_size > 5000 for p in fig_dir.iterdir()))
    assert set(before) == set(expected)


def test_sweep_report_run_holds_the_table_and_the_avg_chart(smoke):
    # the report's W&B run goes under $WANDB_DIR (wherever the fixture put it), the runs' under their folders
    media = next(d for root in (Path(os.environ["WANDB_DIR"]), smoke) for d in root.rglob("offline-run-*/files/media")
                 if list(d.glob("table/table2_*.table.json")))
    report = json.loads(next(media.glob("table/table2_*.table.json")).read_text())
    assert len(report["data"]) == len(pd.read_csv(smoke / "table2.csv"))
    assert len(list(media.glob("images/figures/*.png"))) == 2
    chart = json.loads(next(media.glob("table/avg_per_round/office_caltech_table_*.table.json")).read_text())
    rows = pd.DataFrame(chart["data"], columns=chart["columns"])
    assert set(rows.lineKey) == set(METHODS)
    for m in METHODS:
        metrics = read_jsonl(smoke / "runs" / f"{m}-office_caltech-default{SMOKE}-seed0" / "metrics.jsonl")
        assert rows[rows.lineKey == m].sort_values("step").lineVal.tolist() == pytest.approx(
            [r["accuracy"]["AVG"] for r in metrics])


@pytest.mark.slow
def test_a_failed_run_frees_its_actors_and_the_sweep_goes_on(ray_cluster, data_root, tmp_path, capsys):
    """FPL with tau 0.01 stops in round 1 (non-finite loss); the next run needs the same CPUs (one run fits the
    4-CPU test cluster at a time), so it could never start if the failed run's actors lived on."""
    small = dict(dataset="office_caltech", rounds=2, local_epochs=1, client_fraction=0.1, eval_max=50,
                 data_root=str(data_root))
    runs = [RunConfig(method="fpl", hparams={"tau": 0.01}, out=str(tmp_path / "fail"), name="fail", **small),
            RunConfig(method="fedavg", out=str(tmp_path / "ok"), name="ok", **small)]
    with pytest.raises(RunError, match=r"^1 of 2 runs failed, no report written: fail \(non-finite loss in round 1"):
        execute(runs, None)
    assert (tmp_path / "ok" / "summary.json").exists() and not (tmp_path / "fail" / "summary.json").exists()
    out = capsys.readouterr().out
    assert "[0 done, 0 running, 1 failed, 1 left, ETA " in out and "] fail FAILED: non-finite loss in round 1" in out
    assert "[1 done, 0 running, 1 failed, 0 left, ETA 00:00] ok: AVG " in out
    assert "sweep: 1 runs done, 1 failed, 0 already complete" in out


@pytest.mark.slow
def test_nothing_written_holds_a_secret(smoke, data_root, tmp_path):
    """A fresh process (W&B reads its environment once per process) with a Ray token and a W&B API key in its
    environment re-runs one run of a copy of the smoke sweep (local executor) and writes the report: no file it
    leaves (config.json, metrics.jsonl, summary.json, the W&B offline runs, the report and the report's W&B run)
    contains either secret."""
    copy = tmp_path / "table2"
    shutil.copytree(smoke, copy)
    victim = copy / "runs" / f"fpl-office_caltech-default{SMOKE}-seed0"
    (victim / "summary.json").unlink()
    ray_token, wandb_key = secrets.token_hex(32), secrets.token_hex(20)
    env = {**os.environ, "RAY_AUTH_TOKEN": ray_token, "WANDB_API_KEY": wandb_key, "WANDB_MODE": "offline",
           "WANDB_DIR": str(tmp_path / "wandb"), "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    (tmp_path / "wandb").mkdir()
    res = subprocess.run([sys.executable, "-m", "ray_jobs.sweep", *ARGS, "--results-dir", str(copy), "--data-root",
                          str(data_root), "--executor", "local"], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "15 of 16 runs already complete; running 1" in res.stdout
    files = [p for p in [*copy.rglob("*"), *(tmp_path / "wandb").rglob("*")] if p.is_file()]
    assert (victim / "summary.json").exists()
    # the new run's (the fixture ran Office-Caltech's runs without W&B)
    assert len(list((victim / "wandb").glob("offline-run-*/run-*.wandb"))) == 1
    assert any(p.suffix == ".wandb" for p in (tmp_path / "wandb").rglob("*"))  # the report's W&B run
    for secret in (ray_token, wandb_key):
        assert [p for p in files if secret.encode() in p.read_bytes()] == []


def test_table_all_runs_every_method_but_the_variants_and_picks_up_a_later_one(data_root, tmp_path):
    """`make table-all`: every registered method that is not an ablation variant, on both datasets, FPL's protocol;
    a method registered after the sweep module was imported joins without an edit."""
    from lightning_modules.fedavg import FedAvgClient, FedAvgServer
    from lightning_modules.registry import METHODS as REGISTRY
    from lightning_modules.registry import Method, register

    runs = plan("all", "full", ["mnist", "usps", "syn"], tmp_path, str(data_root))
    own = [m for m, spec in REGISTRY.items() if spec.variant_of is None]
    assert {"fedavg", "fpl", "fedapc"} <= set(own) and not {"fpl_cpcl_only", "fedapc_noaug"} & set(own)
    seed0 = [(c.method, c.dataset) for c in runs if c.seed == 0]
    assert seed0 == [(m, d) for d in ("digits", "office_caltech") for m in own]
    assert {(c.preset, c.split, c.batch_size, c.local_epochs) for c in runs} == {("fpl-digits", "code", 64, 10),
                                                                                ("fpl-office", "default", 64, 10)}
    class LaterClient(FedAvgClient):
        pass

    register(Method(name="later_method", client=LaterClient, server=FedAvgServer))
    # the same client module and server rule as a method before it: a variant (an ablation), left out
    register(Method(name="later_variant", client=LaterClient, server=FedAvgServer, defaults={"x": 1}))
    try:
        assert (REGISTRY["later_method"].variant_of, REGISTRY["later_variant"].variant_of) == (None, "later_method")
        later = plan("all", "full", ["mnist", "usps", "syn"], tmp_path, str(data_root))
        assert [c.method for c in later if c.dataset == "digits" and c.seed == 0] == [*own, "later_method"]
    finally:
        del REGISTRY["later_method"], REGISTRY["later_variant"]


def test_table_all_smoke_runs_a_method_named_outside_its_default_rows(data_root, tmp_path, capsys):
    """`make table-all PROFILE=smoke METHODS=fedavg,fedper DRY_RUN=1`: FedPer is no default row of the smoke profile
    (a fixed few), and named it takes its rows there at the smoke settings, as any method of the table would; a name
    that is no method of the table is refused, the choices naming every one."""
    from lightning_modules.registry import METHODS as REGISTRY
    from ray_jobs.tables import TABLES

    spec = TABLES["all"]
    outside = [m for m, s in REGISTRY.items() if s.variant_of is None and m not in spec.smoke_methods]
    assert "fedper" in outside
    args = ["--table", "all", "--profile", "smoke", "--domains", "mnist,usps,syn", "--results-dir", str(tmp_path),
            "--data-root", str(data_root), "--executor", "local", "--dry-run"]

    def listed(extra):
        assert main([*args, *extra]) == 0
        return [line.strip() for line in capsys.readouterr().out.splitlines() if line.startswith(f"  {tmp_path}")]

    doms = {"fpl-digits": ["mnist", "usps", "syn"], "fpl-office": ["caltech", "amazon", "webcam", "dslr"]}
    assert listed(["--methods", "fedavg,fedper"]) == [
        str(tmp_path / "runs" / RunConfig.from_preset(p, method=m, seed=0, domains=doms[p], executor="local",
                                                      precision="32-true", **spec.overrides("smoke")).run_name)
        for p in ("fpl-digits", "fpl-office") for m in ("fedavg", "fedper")]
    default = listed([])
    assert len(default) == 2 * len(spec.smoke_methods) and not [r for r in default if "fedper" in Path(r).name]
    assert main([*args, "--methods", "fedavg,fedperr"]) == 2
    err = capsys.readouterr().err
    assert "unknown method(s) 'fedperr' (did you mean fedper?) in table all" in err
    assert all(f" {m}," in err or f" {m}." in err for m in outside)


@pytest.mark.slow
def test_table_all_smoke_shares_table2_runs_and_reports_communication(smoke, data_root, tmp_path, capsys):
    """`make table-all PROFILE=smoke DATASETS=office_caltech` after `make table2` (a copy of its results, local
    executor): Table 2's 16 runs are reused, only the other methods run; every method is a row on both datasets
    with the paper value where FPL's Table 2 has one, and the MB a client uploads and receives per round: ResNet-10's
    state_dict each way for FedAvg, nothing for Local, only prototypes for FedProto as published."""
    from benchmark.communication import count
    from benchmark.models import ResNet10
    from lightning_modules.registry import METHODS as REGISTRY

    copy = tmp_path / "all"
    shutil.copytree(smoke, copy)
    own = [*METHODS, "local", "fedproto_orig", "fedapc"]  # the smoke profile's rows: Table 2's and three others
    assert all(REGISTRY[m].variant_of is None for m in own)
    assert main(["--table", "all", "--profile", "smoke", "--domains", "mnist,usps,syn", "--results-dir", str(copy),
                 "--data-root", str(data_root), "--executor", "local", "--datasets", "office_caltech"]) == 0
    out = capsys.readouterr().out
    assert "8 of 11 runs already complete; running 3" in out  # Office-Caltech's: the Digits rows run the same code
    df = pd.read_csv(copy / "tableall.csv")
    rows = [(m, d) for m in METHODS for d in ("digits", "office_caltech")] + [(m, "office_caltech") for m in own[8:]]
    assert sorted(set(zip(df.method, df.dataset))) == sorted(rows)
    avg = df[df.domain.str.startswith("AVG")].set_index(["method", "dataset"])
    assert avg.loc[("fpl", "office_caltech"), "paper"] == paper_avg("fpl")
    assert np.isnan(avg.loc[("fedapc", "office_caltech"), "paper"])
    assert np.isnan(avg.loc[("local", "office_caltech"), "paper"])
    weights = count(ResNet10(10).state_dict())[1]
    for ds in ("digits", "office_caltech"):
        assert avg.loc[("fedavg", ds), "up_bytes"] == avg.loc[("fedavg", ds), "down_bytes"] == weights
        assert avg.loc[("fpl", ds), "up_bytes"] > weights
    assert avg.loc[("local", "office_caltech"), "up_bytes"] == avg.loc[("local", "office_caltech"), "down_bytes"] == 0
    assert 0 < avg.loc[("fedproto_orig", "office_caltech"), "up_bytes"] <= 10 * 512 * 4  # at most one prototype a class
    for m, ds in (("fpl", "digits"), ("fpl", "office_caltech"), ("fedproto_orig", "office_caltech")):  # one seed each
        [summary] = [json.loads(p.read_text()) for p in (copy / "runs").glob(f"{m}-{ds}-*/summary.json")]
        per_round = summary["communication"]["per_client_per_round"]
        assert (avg.loc[(m, ds), "up_bytes"], avg.loc[(m, ds), "down_bytes"]) == (per_round["up_bytes"],
                                                                                  per_round["down_bytes"])


def paper_avg(method: str) -> float:
    from benchmark import paper
    return paper.TABLE2[method]["office_caltech"]["AVG"]
