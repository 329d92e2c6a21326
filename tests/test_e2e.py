"""End to end: real data, real Ray (2 client actors), W&B offline files, small settings of the paper's code path."""
from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pytest

from benchmark.results import read_jsonl
from ray_jobs.config import RunConfig
from ray_jobs.run import RunError, run

from test_figures import wandb_records

SMALL = dict(rounds=2, local_epochs=1, eval_max=50, num_actors=2, driver_cpus=1, cpus_per_actor=1)


def wandb_run(out) -> tuple[dict, list[dict]]:
    """A run folder's offline W&B run, read from its .wandb file: its summary (key -> value) and its history (one
    dict of key -> value per logged step)."""
    summary, history = {}, []
    for rec in wandb_records(next((out / "wandb").glob("offline-run-*"))):
        kind = rec.WhichOneof("record_type")
        if kind == "summary":
            summary.update({u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in rec.summary.update})
        elif kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return summary, history


def small_run(tmp_path_factory, root, method, dataset, fraction, executor="ray", **kw):
    out = tmp_path_factory.mktemp(f"{method}-{dataset}-{executor}")
    cfg = RunConfig(method=method, dataset=dataset, data_root=str(root), out=str(out), executor=executor,
                    client_fraction=fraction, **{**SMALL, **kw})
    return out, run(cfg, quiet=True)


# FPL on both datasets (the Digits plan, prototypes), FedAvg (no prototypes) on Office-Caltech: each run through Ray
# costs its actors' start-ups, and a FedAvg Digits run showed nothing these do not (CI time). The Digits run trains
# with the fused engine (`FUSED`: its clients of a domain have equal size, so the fused groups hold several clients),
# which test_fused_engine_through_ray_equals_local compares with the same run in process
CASES = [("fpl", "digits", 0.03), ("fedavg", "office_caltech", 0.1), ("fpl", "office_caltech", 0.1)]
FUSED = dict(engine="fused", eval_max=50)


@pytest.fixture(scope="module")
def runs(slow_setup, ray_cluster, full_digits_root, tmp_path_factory):
    return {(m, d): small_run(tmp_path_factory, full_digits_root, m, d, f, **(FUSED if d == "digits" else {}))
            for m, d, f in CASES}


@pytest.mark.parametrize("method,dataset,fraction", CASES)
def test_summary_consistent_with_metrics(runs, method, dataset, fraction):
    out, summary = runs[(method, dataset)]
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    rounds = read_jsonl(out / "metrics.jsonl")
    assert [r["round"] for r in rounds] == [0, 1]
    # the committed form (metrics.jsonl.gz): the same bytes; a folder holding it alone (a fresh clone) reads the same
    assert gzip.decompress((out / "metrics.jsonl.gz").read_bytes()) == (out / "metrics.jsonl").read_bytes()
    clone = out.parent / f"{out.name}-as-committed"
    clone.mkdir()
    shutil.copy(out / "metrics.jsonl.gz", clone)
    assert read_jsonl(clone / "metrics.jsonl") == rounds
    domains = ["mnist", "usps", "svhn", "syn"] if dataset == "digits" else ["caltech", "amazon", "webcam", "dslr"]
    assert list(rounds[-1]["accuracy"]) == domains + ["AVG"]
    for r in rounds:
        acc = r["accuracy"]
        assert acc["AVG"] == pytest.approx(np.mean([acc[d] for d in domains]))
        assert all(0 <= acc[d] <= 100 for d in domains)
        assert set(r["time_s"]) >= {"local_training", "aggregation", "clustering", "evaluation", "round"}
        assert np.isfinite(r["train_loss"])
    assert on_disk["final"] == rounds[-1]["accuracy"]
    for d in domains + ["AVG"]:
        assert on_disk["last5"][d] == pytest.approx(np.mean([r["accuracy"][d] for r in rounds]))
    assert (on_disk["method"], on_disk["dataset"], on_disk["seed"], on_disk["rounds"]) == (method, dataset, 0, 2)
    # the clients of the default presets, in order, scaled by the client fraction
    per_domain = {"digits": {"mnist": (6, 600), "usps": (4, 72), "svhn": (3, 8), "syn": (7, 100)},
                  "office_caltech": {"caltech": (3, 179), "amazon": (2, 153), "webcam": (1, 47),
                                     "dslr": (4, 25)}}[dataset]
    expected = [d for d, (n, _) in per_domain.items() for _ in range(n)]
    assert [c["domain"] for c in on_disk["clients"]] == expected
    assert [c["id"] for c in on_disk["clients"]] == list(range(len(expected)))
    for c in on_disk["clients"]:
        base = max(1, int(fraction * per_domain[c["domain"]][1]))
        if dataset == "digits":
            assert c["num_samples"] == base
        else:  # Office fills a missing class with one sample of it, by a swap that keeps the size while some class
            # is held twice (`fill_by_swap`): a client ends with every class, at least 10 samples, its size if larger
            assert c["num_samples"] == max(base, 10)
    config = json.loads((out / "config.json").read_text())
    assert config["method"] == method and config["hparams"] == on_disk["hparams"]


@pytest.mark.parametrize("method,dataset", [(m, d) for m, d, _ in CASES])
def test_wandb_offline_run_holds_tables(runs, method, dataset):
    out, summary = runs[(method, dataset)]
    run_dirs = list((out / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1
    files = list(run_dirs[0].glob("files/media/table/accuracy_per_round_*.table.json"))
    assert len(files) == 1
    table = json.loads(files[0].read_text())
    rounds = read_jsonl(out / "metrics.jsonl")
    assert table["columns"] == ["round", *rounds[0]["accuracy"]]
    assert table["data"] == [[r["round"], *r["accuracy"].values()] for r in rounds]
    final = json.loads(next(run_dirs[0].glob("files/media/table/final_accuracy_*.table.json")).read_text())
    assert final["data"][1][1:] == pytest.approx(list(summary["last5"].values()))
    assert list(run_dirs[0].glob("run-*.wandb"))


@pytest.mark.slow
def test_same_seed_same_metrics_and_local_equals_ray(runs, full_digits_root, tmp_path_factory):
    """The same run again, in process: the Ray run's metrics. (A second Ray run of it showed nothing more:
    test_methods_apart runs FPL in 1 and 2 groups in process and through 3 actors, and the resume tests rerun through
    Ray.)"""
    out, _ = runs[("fpl", "office_caltech")]
    local, _ = small_run(tmp_path_factory, full_digits_root, "fpl", "office_caltech", 0.1, executor="local")
    strip = lambda rows: [(r["accuracy"], r["client_loss"]) for r in rows]  # noqa: E731
    ref = strip(read_jsonl(out / "metrics.jsonl"))
    assert len(ref) == 2 and strip(read_jsonl(local / "metrics.jsonl")) == ref


@pytest.mark.slow
def test_fused_engine_through_ray_equals_local(runs, full_digits_root, tmp_path_factory):
    """Digits (clients of a domain have equal size, so the fused groups hold several clients):
    2 Ray actors with the fused engine (the fixture's Digits run) give the same metrics as the local executor with
    it."""
    ray_out, _ = runs[("fpl", "digits")]
    local_out, _ = small_run(tmp_path_factory, full_digits_root, "fpl", "digits", 0.03, executor="local", **FUSED)
    strip = lambda rows: [(r["accuracy"], r["client_loss"]) for r in rows]  # noqa: E731
    assert strip(read_jsonl(ray_out / "metrics.jsonl")) == strip(read_jsonl(local_out / "metrics.jsonl"))
    assert json.loads((ray_out / "config.json").read_text())["engine"] == "fused"


@pytest.mark.slow
def test_other_seed_other_metrics(runs, full_digits_root, tmp_path_factory):
    out, _ = runs[("fedavg", "office_caltech")]
    other, _ = small_run(tmp_path_factory, full_digits_root, "fedavg", "office_caltech", 0.1, executor="local", seed=1)
    assert read_jsonl(other / "metrics.jsonl")[0]["client_loss"] != read_jsonl(out / "metrics.jsonl")[0]["client_loss"]


@pytest.mark.slow
def test_nonfinite_loss_stops_the_run(data_root, tmp_path):
    """FPL with tau 0.01 overflows (paper, Fig. 4): the run stops naming round and client, never completes. In
    process (test_reliability stops a run through Ray on an injected non-finite loss)."""
    out = tmp_path / "run"
    cfg = RunConfig(method="fpl", dataset="office_caltech", data_root=str(data_root), out=str(out),
                    client_fraction=0.1, hparams={"tau": 0.01}, **{**SMALL, "executor": "local"})
    with pytest.raises(RunError, match=r"non-finite loss in round 1, client \d+ \(\w+\)"):
        run(cfg, quiet=True)
    assert not (out / "summary.json").exists()
    assert "non-finite loss in round 1" in (out / "error.txt").read_text()
    assert "Lower the learning rate or raise tau." in (out / "error.txt").read_text()  # FPL's tau
    assert [r["round"] for r in read_jsonl(out / "metrics.jsonl")] == [0]


def test_git_state_ignores_run_outputs_under_results(tmp_path, monkeypatch):
    """A sweep's own new run folders (untracked files under results/) leave the tree clean; a changed source file
    does not."""
    import subprocess

    from benchmark import provenance

    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    monkeypatch.setattr(provenance, "PROJECT_ROOT", tmp_path)
    (tmp_path / "results/runs/a-run").mkdir(parents=True)
    (tmp_path / "results/runs/a-run/summary.json").write_text("{}")
    state = provenance.git_state()
    assert state["dirty"] is False and len(state["commit"]) == 40
    (tmp_path / "code.py").write_text("x = 2\n")
    assert provenance.git_state()["dirty"] is True


def test_config_records_provenance(runs, full_digits_root):
    """config.json: package versions, the git commit and dirty flag, the data files' sha256 as verified, the
    driver's and each actor's machine, device and engine, checked against independent reads."""
    import hashlib
    import os
    import socket
    import subprocess
    from importlib import metadata
    from pathlib import Path

    out, summary = runs[("fpl", "office_caltech")]
    prov = json.loads((out / "config.json").read_text())["provenance"]
    assert prov["packages"]["torch"] == metadata.version("torch") and prov["packages"]["ray"] == metadata.version("ray")
    assert set(prov["packages"]) == {"torch", "torchvision", "lightning", "ray", "wandb", "finch-clust", "opacus",
                                     "numpy"}
    assert prov["packages"]["opacus"] == metadata.version("opacus")  # DP-SGD runs (FedPLVM Table 11) say which
    repo = Path(__file__).resolve().parent.parent
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], capture_output=True, text=True).stdout  # noqa: E731
    changed = [line[3:] for line in git("status", "--porcelain").splitlines() if not line[3:].startswith("results/")]
    assert prov["git"] == {"commit": git("rev-parse", "HEAD").strip(), "dirty": bool(changed)}
    assert sorted(prov["data_sha256"]) == [f"office_caltech10/{d}.npz"
                                           for d in sorted(["amazon", "caltech", "dslr", "webcam"])]
    for rel, digest in prov["data_sha256"].items():
        assert hashlib.sha256((full_digits_root / rel).read_bytes()).hexdigest() == digest
    assert prov["executor"] == "ray"
    assert len(prov["actors"]) == 2
    assert sorted(c for a in prov["actors"] for c in a["clients"]) == [c["id"] for c in summary["clients"]]
    for p in [prov["driver"], *prov["actors"]]:
        assert p["host"] == socket.gethostname() and p["device"] == "cpu" and p["gpu"] is None
        assert p["cpu_count"] == os.cpu_count() and p["pid"] != os.getpid()
        assert p["torch_threads"] == 1 and p["load_1min"] >= 0  # driver_cpus, cpus_per_actor: 1 each
    assert {a["engine"] for a in prov["actors"]} == {"sequential"}
    # summary.json: each process's peak memory at the run's end, the same processes (by pid) as the provenance's
    mem = summary["peak_memory"]
    assert [m["pid"] for m in [mem["driver"], *mem["actors"]]] == [p["pid"] for p in [prov["driver"], *prov["actors"]]]
    for m in [mem["driver"], *mem["actors"]]:  # a process holding torch and its clients' tensors: 100 MiB to 20 GiB
        assert 100 < m["peak_rss_mib"] < 20 * 2**10 and m["cuda_peak_allocated_mib"] is None
    # the W&B run's summary: the driver's peak and the largest actor's (no CUDA figure on the CPU)
    summ, _ = wandb_run(out)
    assert {k: v for k, v in summ.items() if k.startswith("peak_memory/")} == {
        "peak_memory/driver_rss_mib": mem["driver"]["peak_rss_mib"],
        "peak_memory/actor_rss_mib": max(mem["actors"][0]["peak_rss_mib"], mem["actors"][1]["peak_rss_mib"])}


@pytest.mark.parametrize("method,dataset", [(m, d) for m, d, _ in CASES])
def test_communication_in_metrics_summary_and_wandb(runs, method, dataset):
    """Every client receives and uploads ResNet-10's state_dict each round; FPL's clients also upload 512
    float32 per class they hold and, from round 1, receive its payload; FedAvg moves no prototype. The summary
    holds the means over rounds and the total; the W&B summary the same."""
    from benchmark.communication import KEYS, count
    from benchmark.models import ResNet10

    out, summary = runs[(method, dataset)]
    entries, nbytes = count(ResNet10(10).state_dict())
    rounds = read_jsonl(out / "metrics.jsonl")
    for r in rounds:
        comm = r["communication"]
        assert sorted(comm["per_client"], key=int) == [str(c["id"]) for c in summary["clients"]]
        for c in comm["per_client"].values():
            assert c["up_weights"] == c["down_weights"] == entries
            if method == "fedavg":
                assert c["up_prototypes"] == c["down_prototypes"] == 0
            else:
                assert c["up_prototypes"] > 0 and c["up_prototypes"] % 512 == 0
                if dataset == "office_caltech":  # every Office client holds every class (the fill above): 10 x 512
                    assert c["up_prototypes"] == 5120
                assert (c["down_prototypes"] > 0) == (r["round"] > 0)
            assert c["up_bytes"] == 4 * (c["up_weights"] - entries) + nbytes + 4 * c["up_prototypes"]
        for k in KEYS:
            assert comm["mean_per_client"][k] == pytest.approx(np.mean([c[k] for c in comm["per_client"].values()]))
    total = summary["communication"]
    for k in KEYS:
        assert total["per_client_per_round"][k] == pytest.approx(np.mean([r["communication"]["mean_per_client"][k]
                                                                          for r in rounds]))
    assert total["total_bytes"] == sum(c["up_bytes"] + c["down_bytes"] for r in rounds
                                       for c in r["communication"]["per_client"].values())
    summ, history = wandb_run(out)
    logged = [items["communication/down_bytes"] for items in history if "communication/down_bytes" in items]
    assert summ["communication/total_bytes"] == total["total_bytes"]
    assert summ["communication/up_bytes"] == pytest.approx(total["per_client_per_round"]["up_bytes"])
    assert logged == pytest.approx([r["communication"]["mean_per_client"]["down_bytes"] for r in rounds])
