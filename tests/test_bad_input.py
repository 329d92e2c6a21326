"""Bad input stops at once with one clear message, before any training and without a run folder claiming completion."""
from __future__ import annotations

import io
import shutil
import socket
import sys

import numpy as np
import pytest

from benchmark.protocols import PRESETS, unknown_name
from lightning_modules.registry import METHODS
from ray_jobs.config import RunConfig
from ray_jobs.run import main
from ray_jobs.tables import GROUPS, TABLES

SMALL = ["--rounds", "1", "--local-epochs", "1", "--client-fraction", "0.05", "--eval-max", "50", "--executor", "local"]


def fails(capsys, argv, out):
    code = main([*argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert not (out / "summary.json").exists()
    return err


def test_unknown_method(capsys, tmp_path, data_root):
    err = fails(capsys, ["--method", "fedfoo", "--data-root", str(data_root)], tmp_path)  # near none of them
    assert err == f"error: unknown method 'fedfoo'; choose one of: {', '.join(sorted(METHODS))}.\n"


@pytest.mark.parametrize("argv,expected", [
    (["--method", "fedavgg"], f"unknown method 'fedavgg' (did you mean fedavg?); choose one of: "
                              f"{', '.join(sorted(METHODS))}."),
    (["--dataset", "office"], "unknown dataset 'office' (did you mean office_caltech, office10?); choose one of: "
                              "digits, office_caltech, digit5, mnist, office10."),
    (["--preset", "fpl-ofice"], f"unknown preset 'fpl-ofice' (did you mean fpl-office?); choose one of: "
                                f"{', '.join(PRESETS)}."),
    (["--split", "pape"], "unknown split 'pape' (did you mean paper?) for digits; choose one of: code, paper, fedapc, "
                          "100clients, 500clients, random."),
    (["--domains", "mnist,usp"], "unknown domain(s) 'usp' (did you mean usps?) for digits; choose one of: mnist, usps, "
                                 "svhn, syn."),
    (["--method", "fedopt", "--hp", "server_momentun=0.5"],
     f"unknown hyperparameter(s) 'server_momentun' (did you mean server_momentum?) for fedopt; choose one of: "
     f"{', '.join(sorted(METHODS['fedopt'].defaults))}."),
    (["--method", "fedopt", "--hp", "weighting=sample"], "unknown weighting value 'sample' (did you mean samples?); "
                                                         "choose one of: uniform, samples."),
    (["--method", "fedavg", "--hp", "mu=0.1"], "unknown hyperparameter(s) 'mu' for fedavg; there is no "
                                                "hyperparameter to choose."),
    (["--engine", "fussed"], "unknown engine 'fussed' (did you mean fused?); choose one of: auto, sequential, fused."),
    (["--executor", "lcoal"], "argument --executor: unknown choice 'lcoal' (did you mean local?); choose one of: ray, "
                              "local; see `python -m ray_jobs.run --help`."),
])
def test_a_misspelt_name_is_answered_with_the_nearest_then_every_choice(capsys, tmp_path, data_root, argv, expected):
    assert fails(capsys, [*argv, "--data-root", str(data_root)], tmp_path) == f"error: {expected}\n"


def test_unknown_name_puts_the_nearest_choices_before_every_choice():
    assert unknown_name("method", "fedavgg", ["fedavg", "fedprox", "fpl"]) == (
        "unknown method 'fedavgg' (did you mean fedavg?); choose one of: fedavg, fedprox, fpl.")
    # a prefix: difflib's ratio for office_caltech is 0.6, under the cutoff; starting with it is enough
    assert unknown_name("dataset", "office", ["digits", "office_caltech", "office10"]) == (
        "unknown dataset 'office' (did you mean office_caltech, office10?); choose one of: digits, office_caltech, "
        "office10.")
    assert unknown_name("method", "FPL", ["fedavg", "fpl"]) == (
        "unknown method 'FPL' (did you mean fpl?); choose one of: fedavg, fpl.")  # another case
    assert unknown_name("table", "table2", ["1", "2", "all"]) == (
        "unknown table 'table2' (did you mean 2?); choose one of: 1, 2, all.")  # it holds a choice
    assert unknown_name("method", "fed", ["fedavg", "fedprox", "fpl", "fedproto", "moon"]) == (
        "unknown method 'fed' (did you mean fedavg, fedprox, fedproto?); choose one of: fedavg, fedprox, fpl, "
        "fedproto, moon.")  # at most three
    assert unknown_name("method", "scaffold", ["fedavg", "fedprox", "fpl"]) == (
        "unknown method 'scaffold'; choose one of: fedavg, fedprox, fpl.")  # nothing near: no "did you mean"
    # several names, each with its own nearest (none for an empty one); numbers as they are
    assert unknown_name("domain", ["mnsit", "", "kodak"], ["mnist", "usps"], " for digits") == (
        "unknown domain(s) 'mnsit' (did you mean mnist?), '', 'kodak' for digits; choose one of: mnist, usps.")
    assert unknown_name("seed", [7], [0, 1, 2]) == "unknown seed(s) 7; choose one of: 0, 1, 2."
    assert unknown_name("hyperparameter", ["mu"], [], " for fedavg") == (
        "unknown hyperparameter(s) 'mu' for fedavg; there is no hyperparameter to choose.")


def test_unknown_dataset(capsys, tmp_path, data_root):
    err = fails(capsys, ["--dataset", "cifar", "--data-root", str(data_root)], tmp_path)
    assert "unknown dataset 'cifar'" in err and "office_caltech" in err


def test_a_preset_with_another_dataset_names_the_presets_split(capsys, tmp_path, data_root):
    err = fails(capsys, ["--preset", "fedproto-mnist-n3", "--dataset", "office_caltech", "--data-root",
                         str(data_root)], tmp_path)
    assert err == ("error: preset fedproto-mnist-n3 is for mnist (split 3way), and office_caltech has no split "
                   "'3way'; with --dataset office_caltech name one of its splits with --split (default, fedapc, "
                   "random), or leave --dataset out.\n")


def test_unknown_split(capsys, tmp_path, data_root):
    err = fails(capsys, ["--split", "mine", "--data-root", str(data_root)], tmp_path)
    assert "unknown split 'mine' for digits" in err and "code" in err and "paper" in err


@pytest.mark.parametrize("method,hp,allowed", [
    ("fedopt", "weighting", "uniform, samples"),
    ("moon", "frozen_mode", "train, eval"),
    ("moon", "initial_previous", "own, global"),
    ("fpl", "upcr_reduction", "mean, sum"),
])
def test_choice_hyperparameter_refused_naming_the_allowed_values(capsys, tmp_path, data_root, method, hp, allowed):
    err = fails(capsys, ["--method", method, "--hp", f"{hp}=foo", "--data-root", str(data_root)], tmp_path)
    assert err == f"error: unknown {hp} value 'foo'; choose one of: {allowed}.\n"


@pytest.mark.parametrize("method", ["moon", "fedproto"])
def test_double_forward_must_be_a_boolean(capsys, tmp_path, data_root, method):
    err = fails(capsys, ["--method", method, "--hp", "double_forward=2", "--data-root", str(data_root)], tmp_path)
    assert "double_forward must be true or false (got 2)" in err


@pytest.mark.parametrize("tau", ["0", "-0.5"])
def test_tau_not_positive(capsys, tmp_path, data_root, tau):
    err = fails(capsys, ["--method", "fpl", "--hp", f"tau={tau}", "--data-root", str(data_root)], tmp_path)
    assert "tau must be" in err and "> 0" in err and f"(got {tau})" in err


def test_unknown_engine(capsys, tmp_path, data_root):
    err = fails(capsys, ["--engine", "batched", "--data-root", str(data_root)], tmp_path)
    assert "unknown engine 'batched'" in err and "sequential" in err and "fused" in err and "auto" in err


def test_unknown_precision(capsys, tmp_path, data_root):
    err = fails(capsys, ["--precision", "bf16", "--data-root", str(data_root)], tmp_path)
    assert err.strip() == ("error: unknown precision 'bf16' (did you mean bf16-mixed?); choose one of: 32-true, "
                           "bf16-mixed, auto.")


def test_unknown_aggregation_or_client_init(capsys, tmp_path, data_root):
    err = fails(capsys, ["--aggregation", "mean", "--data-root", str(data_root)], tmp_path)
    assert "unknown aggregation 'mean'; choose one of: samples, uniform." in err
    err = fails(capsys, ["--client-init", "random", "--data-root", str(data_root)], tmp_path)
    assert "unknown client initialisation 'random'; choose one of: shared, own." in err


def test_rounds_below_one(capsys, tmp_path, data_root):
    err = fails(capsys, ["--rounds", "0", "--data-root", str(data_root)], tmp_path)
    assert "rounds must be at least 1 (got 0)" in err


def test_unreachable_ray_address(capsys, tmp_path, data_root, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    argv = ["--dataset", "office_caltech", "--data-root", str(data_root), *SMALL[:-2], "--executor", "ray"]
    err = fails(capsys, argv, tmp_path)
    assert f"RAY_ADDRESS=127.0.0.1:{port} is unreachable" in err and "ray start --head" in err
    assert not (tmp_path / "config.json").exists()  # stopped before the run folder was started


def test_missing_domain_file(capsys, tmp_path, data_root):
    """The shared data has no full SVHN: all four Digits domains cannot run, and the message says what to do."""
    err = fails(capsys, ["--dataset", "digits", "--data-root", str(data_root), *SMALL], tmp_path)
    assert "missing data file" in err and "digits/svhn_train.npz" in err
    assert "make data" in err and err.endswith(" Without svhn: --domains mnist,usps,syn.\n")
    assert not (tmp_path / "config.json").exists()


def test_missing_svhn_names_the_other_domains_of_the_dataset_run(capsys, tmp_path, data_root):
    """Digit-5 without SVHN keeps MNIST-M: the hint names the run's own other domains, not Digits'."""
    err = fails(capsys, ["--preset", "fedplvm-digit5", "--data-root", str(data_root), *SMALL], tmp_path)
    assert err.endswith(" Without svhn: --domains mnist,usps,syn,mnistm.\n")


def _copy_root(src, dst, names):
    lines = [l for l in (src / "SHA256SUMS").read_text().splitlines() if l.split()[1] in names]
    for n in names:
        (dst / n).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / n, dst / n)
    (dst / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def test_corrupt_file(capsys, tmp_path, data_root, monkeypatch):
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "root"
    names = ["digits/usps_train.npz", "digits/usps_test.npz"]
    _copy_root(data_root, root, names)
    blob = bytearray((root / names[0]).read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (root / names[0]).write_bytes(bytes(blob))
    err = fails(capsys, ["--domains", "usps", "--data-root", str(root), *SMALL], tmp_path / "out")
    assert f"{root / names[0]} is corrupt" in err and "sha256" in err


def test_split_asks_more_than_the_domain_has(capsys, tmp_path, data_root, monkeypatch):
    """A USPS with 50 training images cannot give 4 clients int(1% x 50) = 0 images each."""
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "root"
    _copy_root(data_root, root, ["digits/usps_test.npz"])
    with np.load(data_root / "digits/usps_train.npz") as z:
        np.savez(root / "digits/usps_train.npz", x=z["x"][:50], y=z["y"][:50])
    import hashlib

    digest = hashlib.sha256((root / "digits/usps_train.npz").read_bytes()).hexdigest()
    with open(root / "SHA256SUMS", "a") as f:
        f.write(f"{digest}  digits/usps_train.npz\n")
    err = fails(capsys, ["--domains", "usps", "--data-root", str(root), *SMALL], tmp_path / "out")
    assert "digits/usps" in err and "more samples than the domain has" in err and "int(0.01 x 50) = 0" in err


# ------------------------------------------------------------------ the rest of the command line: one line, code 2


@pytest.mark.parametrize("argv,expected", [
    (["--domains", "mnist,kodak"], "unknown domain(s) 'kodak' for digits; choose one of: mnist, usps, svhn, syn."),
    (["--domains", ""], "unknown domain(s) '' for digits; choose one of: mnist, usps, svhn, syn."),  # not: all
    (["--local-epochs", "0"], "local epochs must be at least 1 (got 0)."),
    (["--client-fraction", "0"], "client fraction must be in (0, 1] (got 0.0)."),
    (["--client-fraction", "1.5"], "client fraction must be in (0, 1] (got 1.5)."),
    (["--eval-max", "0"], "eval-max must be at least 1 (got 0)."),
    (["--num-actors", "0"], "num-actors must be at least 1 (got 0)."),
    (["--checkpoint-every", "-1"], "checkpoint-every must be 0 (no checkpoint) or more (got -1)."),
    (["--hp", "tau"], "--hp takes name=value (got 'tau')."),
    (["--hp", "mu=0.5"], "unknown hyperparameter(s) 'mu' for fpl; choose one of: cpcl, cpcl_protos, lambda, tau, "
                         "upcr"),
    (["--rounds", "two"], "argument --rounds: invalid int value: 'two'; see `python -m ray_jobs.run --help`."),
    (["--rounds", "2.5"], "argument --rounds: invalid int value: '2.5'"),
    (["--client-fraction", "half"], "argument --client-fraction: invalid float value: 'half'"),
    (["--executor", "k8s"], "argument --executor: unknown choice 'k8s'; choose one of: ray, local; see"),
    (["--device", "tpu"], "unknown device 'tpu'; choose one of: auto, cpu, cuda (or cuda:N)."),
    (["--seed", "-1"], "seed must be 0 or more (got -1)."),
    (["--lr", "-0.01"], "lr must be a finite number, 0 or more (got -0.01)."),
    (["--momentum", "nan"], "momentum must be a finite number, 0 or more (got nan)."),
    (["--momentum", "5"], "momentum must be below 1 (got 5.0); the papers use 0.9 (FPL, FedAPC) or 0.5 (FedPLVM)."),
    (["--cpus-per-actor", "-1"], "cpus-per-actor must be a finite number, 0 or more (got -1.0)."),
    (["--gpus-per-actor", "inf"], "gpus-per-actor must be a finite number, 0 or more (got inf)."),
    (["--gpus-per-actor", "1.5"], "gpus-per-actor 1.5: Ray gives a process a fraction of one GPU (at most 1) or whole "
                                  "GPUs; use 1, 2 or a fraction below 1."),
    (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
])
def test_bad_flag_one_line_code_2(capsys, tmp_path, data_root, argv, expected):
    err = fails(capsys, [*argv, "--data-root", str(data_root)], tmp_path)
    assert expected in err
    assert "usage:" not in err and "Traceback" not in err
    assert not (tmp_path / "config.json").exists()


def test_out_where_no_folder_can_be_made(capsys, tmp_path, data_root):
    """A run folder under a file cannot be made: one line naming it, before any work; nothing is left behind."""
    (tmp_path / "notes.txt").write_text("mine")
    err = fails(capsys, ["--data-root", str(data_root), "--domains", "usps", *SMALL], tmp_path / "notes.txt" / "run")
    assert err == (f"error: the run folder {tmp_path / 'notes.txt' / 'run'} cannot be made (Not a directory); name a "
                   "folder you can write to with --out.\n")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_refused_run_leaves_no_folder_it_made_for_the_check(capsys, tmp_path, data_root, monkeypatch):
    """The check that the run folder can be made removes what it made: a run refused after it (an unreachable Ray
    head, found when the run starts Ray) leaves no empty folders."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    out = tmp_path / "a" / "b" / "run"
    assert main(["--dataset", "office_caltech", "--data-root", str(data_root), *SMALL[:-2], "--executor", "ray",
                 "--out", str(out)]) == 2
    assert "is unreachable" in capsys.readouterr().err and not (tmp_path / "a").exists()


def test_out_naming_a_file_leaves_the_file(capsys, tmp_path, data_root):
    (tmp_path / "notes.txt").write_text("mine")
    err = fails(capsys, ["--data-root", str(data_root)], tmp_path / "notes.txt")
    assert f"--out {tmp_path / 'notes.txt'} is a file" in err and "name a new folder" in err
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("report_only", [[], ["--report-only"]])
def test_sweep_results_dir_naming_a_file_leaves_the_file(capsys, tmp_path, data_root, report_only):
    from ray_jobs.sweep import main as sweep

    (tmp_path / "notes.txt").write_text("mine")
    code = sweep(["--table", "2", "--profile", "smoke", "--datasets", "office_caltech", "--executor", "local",
                  "--data-root", str(data_root), "--results-dir", str(tmp_path / "notes.txt"), *report_only])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == (f"error: --results-dir {tmp_path / 'notes.txt'} is a file; a sweep writes "
                                         "its run folders and reports under a folder there: name a folder (new or "
                                         "results/).")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_sweep_report_only_without_runs_names_the_make_target(capsys, tmp_path, data_root):
    from ray_jobs.sweep import main as sweep

    assert sweep(["--table", "2", "--profile", "smoke", "--data-root", str(data_root), "--results-dir",
                  str(tmp_path), "--report-only"]) == 2
    assert "run its sweep first (make table2)." in capsys.readouterr().err


@pytest.mark.parametrize("argv,expected", [
    (["--table", "table2"], f"argument --table: unknown choice 'table2' (did you mean 2?); choose one of: "
                            f"{', '.join(sorted([*TABLES, *GROUPS]))}; see `python -m ray_jobs.sweep --help`."),
    (["--table", "fedplvm1"], "argument --table: unknown choice 'fedplvm1' (did you mean fedplvm10, fedplvm11, "
                              "fedplvm12?); choose one of: "),
    (["--table", "2", "--methods", "fedavg,fedprx"], "unknown method(s) 'fedprx' (did you mean fedprox, fedproc?) in "
                                                     "table 2 at the smoke profile; choose one of: fedavg, fedprox, "),
    (["--table", "2", "--datasets", "office"], "unknown dataset(s) 'office' (did you mean office_caltech?) in table "
                                               "2 at the smoke profile; choose one of: digits, office_caltech."),
    (["--table", "2", "--seeds", "0,1"], "unknown seed(s) 1 in table 2 at the smoke profile; choose one of: 0."),
    (["--table", "2", "--domains", "mnist,sv"], "unknown domain(s) 'sv' (did you mean svhn?); choose one of: "
                                                "mnist, "),
])
def test_a_sweep_answers_a_misspelt_name_with_the_nearest(capsys, tmp_path, data_root, argv, expected):
    """`make table2 PROFILE=smoke METHODS=...` and the like: one line, the nearest names first, before any run."""
    from ray_jobs.sweep import main as sweep

    args = ["--profile", "smoke", "--executor", "local", "--data-root", str(data_root), "--results-dir",
            str(tmp_path)]
    try:
        code = sweep([*argv, *args])
    except SystemExit as e:  # argparse's check of --table's choices
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {expected}") and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_a_finished_run_is_never_replaced_from_the_command_line(capsys, tmp_path, data_root):
    """A run folder that holds a finished run (summary.json; a table's committed run is one, at the default
    `results/runs/<name>`) is refused, with or without --resume, whatever the flags; every file stays as it was."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    files = {"summary.json": '{"last5": {}}', "config.json": '{"lr": 0.01}', "metrics.jsonl.gz": "x"}
    for name, text in files.items():
        (run_dir / name).write_text(text)
    for extra in ([], ["--resume"], ["--rounds", "3", "--lr", "0.1"]):
        code = main(["--data-root", str(data_root), "--out", str(run_dir), *extra])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
        assert f"{run_dir} holds a finished run" in err and "another folder with --out" in err
        assert {p.name: p.read_text() for p in run_dir.iterdir()} == files


def test_device_cuda_without_a_gpu(capsys, tmp_path, data_root):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    err = fails(capsys, ["--device", "cuda", "--dataset", "office_caltech", "--data-root", str(data_root), *SMALL],
                tmp_path)
    assert "--device cuda but this machine has no CUDA GPU" in err and "--device cpu" in err
    assert not (tmp_path / "config.json").exists()


def test_device_cuda_on_ray_without_gpu_shares(capsys, tmp_path, data_root):
    err = fails(capsys, ["--device", "cuda", "--executor", "ray", "--dataset", "office_caltech",
                         "--data-root", str(data_root)], tmp_path)
    assert "--device cuda with the Ray executor needs a GPU share" in err and "--gpus-per-actor 0" in err


def test_gpus_requested_on_a_cluster_without_any(capsys, tmp_path, data_root, ray_cluster):
    argv = ["--dataset", "office_caltech", "--data-root", str(data_root), *SMALL[:-2], "--executor", "ray",
            "--gpus-per-actor", "0.5"]
    err = fails(capsys, argv, tmp_path)
    assert "asks for 3 CPUs and 1 GPUs (driver plus 2 actors; a GPU holds fractions up to 1)" in err
    assert "has 4 CPUs and 0 GPUs" in err
    assert not (tmp_path / "config.json").exists()


def test_device_cuda_n_on_ray(capsys, tmp_path, data_root):
    """Under Ray a process sees only its reserved GPUs, as cuda:0: cuda:1 would be an invalid ordinal there."""
    err = fails(capsys, ["--device", "cuda:1", "--executor", "ray", "--driver-gpus", "1", "--gpus-per-actor", "1",
                         "--dataset", "office_caltech", "--data-root", str(data_root)], tmp_path)
    assert "--device cuda:1 picks a GPU of this machine, but under Ray each process sees only the GPUs" in err
    assert "use --device cuda with --driver-gpus and --gpus-per-actor" in err


@pytest.mark.parametrize("shares,gpus", [
    ([0, 0, 0], 0),
    ([0, 0.5, 0.5], 1),
    ([0, 0.6, 0.6, 0.6], 3),  # 1.8 in all, but no two of 0.6 share a GPU
    ([0.5] * 4, 2),
    ([1, 0.5, 0.5, 0.3], 3),  # a whole GPU, then 0.5 + 0.5 on one, 0.3 on another
    ([0.4, 0.3, 0.3, 0.6], 2),  # 0.6 + 0.4, 0.3 + 0.3
    ([2, 0.25, 0.25, 0.25, 0.25], 3),
])
def test_gpus_needed_packs_fractions_as_ray_places_them(shares, gpus):
    from ray_jobs.run import gpus_needed

    assert gpus_needed(shares) == gpus


def test_auto_device_rule(monkeypatch):
    """--device auto: cuda where the process sees a GPU; in a Ray actor only with a GPU share (Ray no longer hides
    the GPUs from an actor without one)."""
    import torch

    from lightning_modules.clients import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")  # in process
    assert resolve_device("auto", 0.5) == torch.device("cuda")
    assert resolve_device("auto", 0.0) == torch.device("cpu")
    assert resolve_device("cpu", 1.0) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == resolve_device("auto", 1.0) == torch.device("cpu")


def test_help_exits_zero_and_lists_every_method_with_what_it_is(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--local-epochs" in out
    listed = out[out.index("\nmethods (--method):\n"):].splitlines()[2:]
    # every registered method, in the registry's order, with its description (whatever the registry holds: a
    # method added as docs/adding-a-method.md says is listed with no edit here)
    assert [line.split(None, 1) for line in listed] == [[name, m.description] for name, m in METHODS.items()]
    assert "  fpl_cpcl_only                 Table 1: CPCL only" in listed


def test_the_demo_answers_help_without_training(capsys, tmp_path, monkeypatch):
    """`python -m ray_jobs.demo --help` prints what the demo does and writes, and starts nothing (it once ran the
    whole demo, whatever its arguments)."""
    from ray_jobs import demo

    monkeypatch.setattr(demo, "run", lambda *a, **k: pytest.fail("the demo started a run"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        demo.main(["--help"])
    assert e.value.code == 0
    assert "usage: python -m ray_jobs.demo [-h]" in capsys.readouterr().out and not list(tmp_path.iterdir())


def test_a_run_that_reserves_no_gpu_on_a_cluster_with_gpus_is_told_so():
    from ray_jobs.run import unused_gpus_note

    cfg = RunConfig(method="fpl", dataset="office_caltech")
    note = unused_gpus_note(cfg, {"CPU": 32, "GPU": 4})
    assert note.startswith("note: the Ray cluster has 4 GPUs but this run reserves none, so it trains on CPUs")
    assert unused_gpus_note(cfg, {"CPU": 32}) is None  # a cluster without GPUs
    shared = RunConfig(method="fpl", dataset="office_caltech", gpus_per_actor=0.25, driver_gpus=0.25)
    assert unused_gpus_note(shared, {"CPU": 32, "GPU": 4}) is None


def test_a_run_without_ray_given_rays_placement_is_told_so():
    from ray_jobs.run import ray_only_note

    assert ray_only_note(RunConfig(executor="local", spread=True, gpus_per_actor=0.5)) == (
        "note: --spread, --gpus-per-actor place Ray's actors; the local executor runs every client group in this "
        "process and ignores them (--device picks its device).")
    # the groups' and the driver's CPU threads: read in process too (`LocalExecutor`, `Driver`), no note
    assert ray_only_note(RunConfig(executor="local", num_actors=3, cpus_per_actor=2, driver_cpus=2)) is None
    assert ray_only_note(RunConfig(executor="ray", spread=True)) is None


@pytest.mark.parametrize("command, argv, expected", [
    ("bench", ["--device", "tpu"], "error: unknown device 'tpu'; choose one of: auto, cpu, cuda (or cuda:N); see "
                                   "`python -m ray_jobs.bench --help`."),
    ("bench", ["--device", "cuda"], "error: --device cuda but this machine has no CUDA GPU; use --device cpu or auto; "
                                    "see `python -m ray_jobs.bench --help`."),
    ("bench", ["--full-rounds", "0"], "error: --full-rounds must be at least 1 (got 0); see "
                                      "`python -m ray_jobs.bench --help`."),
    ("bench", ["--profile", "huge"], "error: argument --profile: unknown choice 'huge'; choose one of: auto, small; "
                                     "see `python -m ray_jobs.bench --help`."),
    ("bench", ["--profile", "smal"], "error: argument --profile: unknown choice 'smal' (did you mean small?); choose "
                                     "one of: auto, small; see `python -m ray_jobs.bench --help`."),
    ("figures", ["tsne"], "error: the following arguments are required: RUN_DIR; see "
                          "`python -m ray_jobs.figures tsne --help`."),
    ("figures", ["draw"], "error: argument {tsne,all}: unknown choice 'draw'; choose one of: tsne, all; see "
                          "`python -m ray_jobs.figures --help`."),
    ("figures", ["tnse"], "error: argument {tsne,all}: unknown choice 'tnse' (did you mean tsne?); choose one of: "
                          "tsne, all; see `python -m ray_jobs.figures --help`."),
    ("figures", [], "error: the following arguments are required: {tsne,all}; see `python -m ray_jobs.figures "
                    "--help`."),
    ("results_table", ["--wirte"], "error: unrecognized arguments: --wirte; see "
                                   "`python -m ray_jobs.results_table --help`."),
    ("demo", ["--rounds", "3"], "error: unrecognized arguments: --rounds 3; see `python -m ray_jobs.demo --help`."),
])
def test_every_command_line_answers_bad_flags_with_one_line(capsys, tmp_path, command, argv, expected):
    """Each `python -m ray_jobs.X` answers a bad flag with one line naming it and its --help, no usage block,
    before it writes anything (the bench's --out-dir stays empty)."""
    import importlib

    cli = importlib.import_module(f"ray_jobs.{command}")
    extra = ["--out-dir", str(tmp_path / "perf")] if command == "bench" else []
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, *extra])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == expected
    assert not (tmp_path / "perf").exists()


def test_what_ray_prints_by_itself_is_not_read_as_our_output(capsys):
    """The suite's capsys (conftest's WithoutRayLines) leaves out the lines Ray's driver prints from its threads, as
    Ray's own printer writes them (prefix, colour codes), and keeps ours, parentheses and pids included."""
    from ray._private.worker import print_worker_logs  # (print_to_stdstream's, without its 5-s deduplication)

    from conftest import RAY_LINE

    ours_out = ["error: the run asks for 3 CPUs (pid=12 left alone)", "(4) client engines: 3 clients of 128 samples"]
    ours_err = ["[fpl] round 1/2 (ETA 00:10)"]
    ray_out = {"lines": ["Warning: The following resource request cannot be scheduled right now."], "pid": "raylet",
               "is_err": False}
    ray_err = {"lines": ["round 1 done"], "pid": 4321, "actor_name": "ClientActor", "is_err": True,
               "ip": "10.0.0.2", "localhost": "10.0.0.1"}
    raw = io.StringIO()  # what Ray writes: both its lines, prefixed (and coloured)
    for batch in (ray_out, ray_err):
        print_worker_logs(batch, raw, ignore_prefix=False)
    assert len(raw.getvalue().splitlines()) == 2 and len(RAY_LINE.findall(raw.getvalue())) == 2
    assert "(raylet)" in raw.getvalue() and "(ClientActor pid=4321, ip=10.0.0.2)" in raw.getvalue()
    print(ours_out[0])
    print_worker_logs(ray_out, sys.stdout, ignore_prefix=False)
    print(ours_out[1])
    print_worker_logs(ray_err, sys.stderr, ignore_prefix=False)
    print(ours_err[0], file=sys.stderr)
    out, err = capsys.readouterr()
    assert (out, err) == ("".join(f"{line}\n" for line in ours_out), f"{ours_err[0]}\n")


# /proc/cpuinfo's flags of this 2-core AMD EPYC (2026-11-29, their AVX ones): AVX2, no AVX-512, no AMX
AVX2_FLAGS = {"fpu", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"}


@pytest.mark.parametrize("flags,cuda,picked", [
    (AVX2_FLAGS, False, "32-true"),
    (AVX2_FLAGS | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}, False, "32-true"),  # AVX-512 without its BF16
    (AVX2_FLAGS | {"avx512f", "avx512_bf16"}, False, "bf16-mixed"),  # Zen 4, Cooper Lake
    (AVX2_FLAGS | {"amx_bf16", "amx_tile"}, False, "bf16-mixed"),  # Sapphire Rapids
    (AVX2_FLAGS | {"avx512_bf16", "amx_bf16"}, True, "32-true"),  # on CUDA: 32-true, as before
    (set(), False, "32-true"),  # no /proc/cpuinfo
])
def test_precision_auto_picks_bf16_mixed_only_on_a_cpu_with_native_bfloat16(flags, cuda, picked):
    from ray_jobs.config import auto_precision

    assert auto_precision(flags, cuda) == picked


@pytest.mark.slow
def test_a_run_is_32_true_unless_asked_and_auto_records_its_pick(capsys, tmp_path, data_root, monkeypatch):
    """`ray_jobs.run` without --precision: the preset's 32-true on either processor (flags given here both ways);
    with --precision auto, picked from the flags, and the pick (never auto) in config.json, the protocol, the
    run's name (-bf16-mixed: away from the preset's precision), its recorded departures and its summary line."""
    import json

    from benchmark.results import protocol
    from ray_jobs.run import build_parser, config_from_args

    for flags, picked in ((AVX2_FLAGS, "32-true"), (AVX2_FLAGS | {"avx512_bf16"}, "bf16-mixed")):
        monkeypatch.setattr("ray_jobs.config.cpu_flags", lambda flags=flags: set(flags))
        plain = config_from_args(build_parser().parse_args(["--executor", "local", "--device", "cpu"]))
        assert (plain.precision, plain.departures, plain.run_name) == ("32-true", {}, "fpl-digits-code-seed0")
        auto = config_from_args(build_parser().parse_args(["--executor", "local", "--device", "cpu",
                                                            "--precision", "auto"]))
        assert auto.precision == picked and protocol(auto)["precision"] == picked
        assert auto.run_name == "fpl-digits-code-seed0" if picked == "32-true" else \
            auto.run_name == "fpl-digits-code-bf16-mixed-seed0"
    out = tmp_path / "run"  # the last pick, bf16-mixed, through a run (5 test images a domain: bfloat16 without
    # native support trains and tests at 5 images/s, 13 times slower than 32-true; this test took 19.0 s alone with
    # 50, 13.8 s with 5, on a 2-core AVX2 machine, 2026-12-02)
    assert main(["--method", "fedavg", "--dataset", "office_caltech", "--domains", "webcam,dslr", *SMALL, "--quiet",
                 "--eval-max", "5", "--device", "cpu", "--precision", "auto", "--data-root", str(data_root),
                 "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["precision"] == "bf16-mixed" and config["departures"] == {
        "rounds": 1, "local_epochs": 1, "client_fraction": 0.05, "eval_max": 5, "precision": "bf16-mixed"}
    assert config["run_name"] == ("fedavg-office_caltech-no_caltech_amazon-default-rounds1-epochs1-fraction0.05-"
                                  "evalmax5-bf16-mixed-seed0")
    assert json.loads((out / "summary.json").read_text())["protocol"]["precision"] == "bf16-mixed"
    title = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("fedavg on"))
    assert title.startswith("fedavg on office_caltech (default split, seed 0, 1 rounds, bf16-mixed)")
    assert title.endswith("away from the preset's protocol: rounds 1, local_epochs 1, client_fraction 0.05, "
                          "eval_max 5, precision bf16-mixed")
