"""Runs that survive faults: per-round checkpoints and resume, a client actor killed mid-round, the entry point
SIGKILLed mid-run, a corrupt checkpoint, a non-finite loss, a checkpoint of another protocol. Each faulty run must give
the metrics of the uninterrupted run (timings aside), which runs in process: a faulty run through Ray thus also gives
the numbers of the local executor, to the bit. Runs go through real Ray only where a test checks Ray itself (a client
actor or the driver actor killed, the entry point on the session's cluster, the clients' states kept in Ray's actors):
the start-ups of such a run's three processes (each imports torch and Lightning) are about half its time."""
from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from benchmark import checkpoint
from benchmark.checkpoint import CheckpointError
from benchmark.results import computed_metrics as metrics, computed_summary as summary, read_jsonl
from ray_jobs.config import RunConfig
from ray_jobs.run import RunError, main, run

PROJECT = Path(__file__).resolve().parent.parent
# FedDyn keeps state on both sides (h_k per client, the drift on the server): what a resume must carry
SETTING = dict(method="feddyn", dataset="office_caltech", domains=["webcam", "dslr"], rounds=3, local_epochs=1,
               client_fraction=0.1, eval_max=30, num_actors=2, driver_cpus=1, cpus_per_actor=1)
FLAGS = ["--method", "feddyn", "--dataset", "office_caltech", "--domains", "webcam,dslr", "--rounds", "3",
         "--local-epochs", "1", "--client-fraction", "0.1", "--eval-max", "30", "--num-actors", "2", "--quiet"]


def config(root, out, **kw) -> RunConfig:
    return RunConfig(**{**SETTING, **kw}, data_root=str(root), out=str(out))


def wait_for(predicate, timeout=300, what="the run"):
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def rows(out: Path) -> int:
    try:
        return len(read_jsonl(out / "metrics.jsonl"))
    except (OSError, ValueError):
        return 0


def timed_train_calls(monkeypatch) -> list[tuple[str, float, float]]:
    """Each client group's `train` call from now on: (thread name, start, end)."""
    from lightning_modules.clients import ClientGroup

    calls, train = [], ClientGroup.train

    def timed(self, *args, **kwargs):
        t = time.monotonic()
        try:
            return train(self, *args, **kwargs)
        finally:
            calls.append((threading.current_thread().name, t, time.monotonic()))

    monkeypatch.setattr(ClientGroup, "train", timed)
    return calls


@pytest.fixture(scope="module")
def reference_run(slow_setup, data_root, tmp_path_factory) -> tuple[Path, list]:
    """The uninterrupted run, in process (the local executor's default: its 2 client groups train at the same time,
    each in a thread of its own), and its groups' `train` calls (`timed_train_calls`)."""
    out = tmp_path_factory.mktemp("reference")
    with pytest.MonkeyPatch.context() as mp:
        calls = timed_train_calls(mp)
        run(config(data_root, out, executor="local"), quiet=True)
    assert not (out / checkpoint.DIR).exists()  # a complete run keeps no checkpoint
    return out, calls


@pytest.fixture(scope="module")
def reference(reference_run) -> Path:
    return reference_run[0]


@pytest.mark.slow
def test_client_actor_killed_mid_round_gives_the_same_metrics(ray_cluster, reference, data_root, tmp_path, capsys):
    out = tmp_path / "run"
    result = {}
    thread = threading.Thread(target=lambda: result.update(summary=run(config(data_root, out), quiet=True)))
    thread.start()
    wait_for(lambda: rows(out) >= 1, what="round 0")
    pid = json.loads((out / "config.json").read_text())["provenance"]["actors"][0]["pid"]
    os.kill(pid, signal.SIGKILL)  # mid-run: round 1 is training
    thread.join(timeout=600)
    assert "summary" in result, "the run did not complete"
    note = capsys.readouterr().out
    assert ": client actor 0 (clients [0, 2, 4]) died (" in note and "1 of 3 restarts used" in note
    assert metrics(out) == metrics(reference)
    assert summary(out) == summary(reference)


# the clients' states of Ray actors that Ray will not restart are read for each checkpoint only, every two rounds
# (after round 1 and the last)
KEEPS_STATES = dict(actor_restarts=0, checkpoint_every=2)


@pytest.fixture(scope="module")
def actor_died_in_round_2(slow_setup, ray_cluster, data_root, tmp_path_factory) -> tuple[Path, list[str]]:
    """A run through Ray (`KEEPS_STATES`) whose client actor 1 is SIGKILLed once round 1's checkpoint is written: it
    stops in round 2; with the errors the run raised."""
    out = tmp_path_factory.mktemp("actor_died") / "run"
    errors = []

    def target():
        try:
            run(config(data_root, out, **KEEPS_STATES), quiet=True)
        except RunError as e:
            errors.append(str(e))

    thread = threading.Thread(target=target)
    thread.start()
    wait_for(lambda: checkpoint.checkpoint_path(out / checkpoint.DIR, 1).exists() or not thread.is_alive(),
             what="round 1's checkpoint")
    os.kill(json.loads((out / "config.json").read_text())["provenance"]["actors"][1]["pid"], signal.SIGKILL)
    thread.join(timeout=600)
    return out, errors


@pytest.mark.slow
def test_an_actor_that_dies_too_often_stops_the_run_naming_its_clients(actor_died_in_round_2, reference):
    out, errors = actor_died_in_round_2
    assert len(errors) == 1
    assert "client actor 1 (clients [1, 3]) died 1 times in this run, more than --actor-restarts 0" in errors[0]
    assert "without dropping its clients" in errors[0]
    assert not (out / "summary.json").exists()
    assert metrics(out) == metrics(reference)[: rows(out)]  # whatever rounds it finished are the reference's


@pytest.fixture(scope="module")
def killed(slow_setup, ray_cluster, data_root, tmp_path_factory):
    """The entry point, a separate process on the session's Ray cluster, SIGKILLed once round 1's
    checkpoint is written."""
    import ray

    out = tmp_path_factory.mktemp("killed") / "run"
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "RAY_AUTH_MODE": "token",
           "PYTHONPATH": str(PROJECT)}
    proc = subprocess.Popen([sys.executable, "-m", "ray_jobs.run", *FLAGS, "--data-root", str(data_root),
                             "--out", str(out)], env=env, cwd=PROJECT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        wait_for(lambda: checkpoint.checkpoint_path(out / checkpoint.DIR, 1).exists() or proc.poll() is not None,
                 what="round 1's checkpoint")
    finally:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert not (out / "summary.json").exists()
    return out


@pytest.mark.slow
def test_sigkilled_entry_point_resumes_to_identical_metrics(killed, reference, data_root, tmp_path, capsys):
    """The run killed on Ray, resumed in process (its checkpoint holds no trace of an executor)."""
    out = tmp_path / "run"
    shutil.copytree(killed, out)
    done = [int(p.stem.split("_")[1]) for p in checkpoint.listing(out / checkpoint.DIR)]
    assert 1 <= len(done) <= checkpoint.KEEP and done[0] >= 1  # the latest two at most
    cfg = config(data_root, out, executor="local")
    run(cfg, quiet=True, resume=True)
    assert f"note: resuming {cfg.run_name} after round {done[0]} of 3" in capsys.readouterr().out
    assert metrics(out) == metrics(reference)
    assert summary(out) == summary(reference)
    assert json.loads((out / "config.json").read_text())["resumed_after_round"] == done[0]


@pytest.mark.slow
def test_corrupt_latest_checkpoint_is_detected_and_the_previous_used(killed, reference, data_root, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(killed, out)
    files = checkpoint.listing(out / checkpoint.DIR)
    assert len(files) == 2  # round 1's (at least) and the one before
    latest, previous = files[0], files[1]
    blob = bytearray(latest.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    latest.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="is truncated or corrupt"):
        checkpoint.read(latest)
    run(config(data_root, out, executor="local"), quiet=True, resume=True)
    said = capsys.readouterr().out
    assert (f"note: {latest} is truncated or corrupt (its sha256 does not match its content); trying the previous "
            "checkpoint") in said
    assert f"after round {int(previous.stem.split('_')[1])} of 3" in said
    assert metrics(out) == metrics(reference)


@pytest.fixture(scope="module")
def stopped_after_round_0(slow_setup, data_root, tmp_path_factory):
    """A run folder that keeps round 0 (its checkpoint, the only one): the run stopped by a non-finite loss in round
    1 (in process)."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    with pytest.raises(RunError):
        run(config(data_root, out, executor="local", test_faults={"nan_loss": [1, 3]}), quiet=True)
    assert [f.name for f in checkpoint.listing(out / checkpoint.DIR)] == ["round_0000.pt"]
    return out


def limited(limit: int):
    """A child's file-size limit (RLIMIT_FSIZE): a write past `limit` bytes fails with EFBIG, as a full disk's with
    ENOSPC (Python ignores SIGXFSZ, which would kill the process instead)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def cannot_write(path: Path) -> str:
    return (f"cannot write {path} (File too large); free space on its disk (or lift the file-size limit, `ulimit -f`), "
            "or write elsewhere (a run: --out; a sweep: --results-dir).")


def contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_failed_write_names_the_file_leaves_the_folder_and_the_resume_gives_the_same_metrics(
        stopped_after_round_0, reference, data_root, tmp_path):
    """The resumed run's round-1 checkpoint cannot be written: the entry point runs under a file-size limit below the
    checkpoint's size (RLIMIT_FSIZE, set in the child: its write fails with EFBIG as a full disk's with ENOSPC). One
    error line names the file and what to do; the folder keeps its checkpoint byte for byte and no temp file; resumed
    without the limit the run ends with the metrics of an undisturbed run."""
    out = tmp_path / "run"
    shutil.copytree(stopped_after_round_0, out)
    before = contents(out)
    kept = checkpoint.checkpoint_path(out / checkpoint.DIR, 0)
    limit = kept.stat().st_size // 2  # the next checkpoint is as large; metrics.jsonl and config.json far smaller
    argv = [*FLAGS, "--executor", "local", "--data-root", str(data_root), "--out", str(out), "--resume"]
    proc = subprocess.run([sys.executable, "-m", "ray_jobs.run", *argv], cwd=PROJECT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(PROJECT), "WANDB_MODE": "disabled"}, timeout=600,
                          preexec_fn=limited(limit))
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == proc.stderr.strip().splitlines(), proc.stderr[-3000:]  # one line, no traceback
    assert errors[0].startswith(f"error: {cannot_write(checkpoint.checkpoint_path(out / checkpoint.DIR, 1))} The "
                                "run folder keeps its rounds up to 0 (checkpoint); to continue, run: python -m "
                                "ray_jobs.run")
    after = contents(out)
    assert sorted(after) == sorted(before)  # no temp file left, nothing of round 1's checkpoint
    assert after[str(kept.relative_to(out))] == before[str(kept.relative_to(out))]
    assert metrics(out) == metrics(reference)[:2]  # round 1 was logged before its checkpoint failed

    run(config(data_root, out, executor="local"), quiet=True, resume=True)
    assert metrics(out) == metrics(reference)
    assert summary(out) == summary(reference)


@pytest.mark.slow
def test_a_failed_write_of_the_final_model_names_it_and_keeps_what_was_written(data_root, tmp_path):
    """Checkpoints off (--checkpoint-every 0), a file-size limit of 1 MiB: config.json and metrics.jsonl (a few kB)
    are written, the final model (float16 ResNet-10, about 10 MB) is not. One error line names model.pt, exit code 2;
    the folder keeps config.json and the round's record, error.txt says why, no checkpoint and no temp file (neither
    its own nor one an earlier run left, killed mid-write)."""
    out = tmp_path / "run"
    out.mkdir()
    (out / ".model.pt.tmp999").write_bytes(b"half a model")
    argv = [*FLAGS, "--rounds", "1", "--executor", "local", "--checkpoint-every", "0", "--data-root", str(data_root),
            "--out", str(out)]
    proc = subprocess.run([sys.executable, "-m", "ray_jobs.run", *argv], cwd=PROJECT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(PROJECT), "WANDB_MODE": "disabled"}, timeout=600,
                          preexec_fn=limited(2 ** 20))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr == f"error: {cannot_write(out / 'model.pt')}\n"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "error.txt", "metrics.jsonl"]
    assert (out / "error.txt").read_text() == cannot_write(out / "model.pt") + "\n"
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["method"], cfg["rounds"], cfg["checkpoint_every"]) == ("feddyn", 1, 0)
    (record,) = read_jsonl(out / "metrics.jsonl")
    assert record["round"] == 0 and set(record["accuracy"]) == {"webcam", "dslr", "AVG"}


WRITERS = """
import json, signal, resource, sys
from pathlib import Path
import numpy as np, torch
from benchmark import checkpoint
from benchmark.figures import plot_curves
from benchmark.results import FEATURES_FILE, MODEL_FILE, Recorder, WriteError

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (Python's default too)
out = Path(sys.argv[1])
recorder = Recorder(out, {"run_name": "r", "method": "fedavg", "dataset": "office_caltech", "seed": 0}, [], {})
recorder.log_round({"round": 0, "accuracy": {"AVG": 50.0}})
for name in (MODEL_FILE, FEATURES_FILE, "curves.png", "checkpoints/round_0000.pt"):  # what an earlier run wrote
    (out / name).parent.mkdir(exist_ok=True)
    (out / name).write_text(f"old {name}")
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
big = torch.rand(10_000, generator=torch.Generator().manual_seed(0))  # 40 kB, incompressible
said = []
for write in (lambda: recorder.save_model({"w": big}), lambda: recorder.save_features({"z": big.numpy()}),
              lambda: plot_curves([out], out / "curves", formats=("png",)),
              lambda: checkpoint.save(out / "checkpoints", 1, {"w": big}),
              lambda: recorder.log_round({"round": 1, "accuracy": {"AVG": 60.0}, "notes": "x" * 5000})):
    try:
        write()
    except WriteError as e:
        said.append(str(e))
print(json.dumps(said))
"""


def test_every_writer_of_a_run_fails_in_one_error_naming_its_file_and_leaves_the_folder(tmp_path):
    """Each file a run writes (model.pt, features.npz, the curves, a checkpoint, metrics.jsonl) past a file-size limit
    of 4 kB (set in a child process after the run folder was started): WriteError naming the file, the earlier
    version of every file as it was, no temp file."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", WRITERS, str(out)], cwd=PROJECT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(PROJECT), "WANDB_MODE": "disabled"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = ["model.pt", "features.npz", "curves.png", "checkpoints/round_0001.pt", "metrics.jsonl"]
    assert json.loads(proc.stdout) == [cannot_write(out / name) for name in names]
    assert contents(out) == {**{name: f"old {name}".encode() for name in
                                ["model.pt", "features.npz", "curves.png", "checkpoints/round_0000.pt"]},
                             "config.json": (out / "config.json").read_bytes(),
                             "metrics.jsonl": b'{"round": 0, "accuracy": {"AVG": 50.0}}\n'}
    assert json.loads((out / "config.json").read_text())["run_name"] == "r"


def test_an_unreadable_only_checkpoint_is_refused_in_one_line_naming_it_and_what_to_do(
        stopped_after_round_0, data_root, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(stopped_after_round_0, out)
    ckpt_dir = out / checkpoint.DIR
    only = checkpoint.checkpoint_path(ckpt_dir, 0)
    only.write_bytes(only.read_bytes()[: only.stat().st_size // 2])  # truncated, as by a crash mid-copy
    code = main([*FLAGS, "--executor", "local", "--data-root", str(data_root), "--out", str(out), "--resume"])
    got = capsys.readouterr()
    assert code == 2
    assert got.err == (f"error: no readable checkpoint in {ckpt_dir} ({only} is truncated or corrupt (its sha256 does "
                       f"not match its content)); delete {ckpt_dir} to start this run afresh.\n")
    assert f"note: {only} is truncated or corrupt" in got.out
    assert only.exists()  # refused, not deleted


# a non-finite loss of client 3 in round 2, in process, a checkpoint every two rounds (after round 1 and the last)
NAN_IN_ROUND_2 = dict(executor="local", checkpoint_every=2, test_faults={"nan_loss": [2, 3]})


@pytest.fixture(scope="module")
def stopped_in_round_2(slow_setup, data_root, tmp_path_factory) -> tuple[Path, str, str]:
    """A run stopped by a non-finite loss (`NAN_IN_ROUND_2`), its one checkpoint after round 1; with its error message
    and what it printed (started with --resume: nothing to resume)."""
    out = tmp_path_factory.mktemp("stopped_in_round_2") / "run"
    printed = io.StringIO()
    with pytest.raises(RunError) as e, contextlib.redirect_stdout(printed):
        run(config(data_root, out, **NAN_IN_ROUND_2), quiet=True, resume=True)
    return out, str(e.value), printed.getvalue()


@pytest.mark.slow
def test_nonfinite_loss_stops_naming_round_client_method_and_keeps_the_last_good_checkpoint(
        stopped_in_round_2, reference, data_root, capsys):
    out, msg, printed = stopped_in_round_2
    cfg = config(data_root, out, **NAN_IN_ROUND_2)
    assert f"note: no checkpoint in {out / checkpoint.DIR}; starting {cfg.run_name} from round 0" in printed
    assert msg.startswith("non-finite loss in round 2, client 3 (dslr), method feddyn;")
    assert "nothing of the round was averaged" in msg and "rounds up to 1 (checkpoint)" in msg
    assert not (out / "summary.json").exists() and "non-finite loss in round 2" in (out / "error.txt").read_text()
    assert metrics(out) == metrics(reference)[:2]  # round 2 never recorded
    files = checkpoint.listing(out / checkpoint.DIR)
    assert [f.name for f in files] == ["round_0001.pt"]  # (none after round 0: every two rounds)
    ck = checkpoint.read(files[0])
    assert ck["round"] == 1 and [(r["round"], r["accuracy"]) for r in ck["metrics"]] == [m[:2] for m in metrics(out)]
    state = ck["driver"]
    assert sorted(state["client_states"]) == list(range(5))
    assert all(torch.isfinite(v).all() for v in state["global_state"].values() if v.is_floating_point())
    assert set(state["rule_state"]) == {"drift", "avg"}

    # the same folder resumed under another protocol is refused, naming the difference (one line, code 2)
    code = main([*FLAGS, "--seed", "1", "--executor", "local", "--data-root", str(data_root), "--out", str(out),
                 "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "was written by another protocol (seed: 0 in the checkpoint, 1 here)" in err


@pytest.mark.slow
def test_driver_killed_or_entry_point_interrupted_names_the_exact_resume_command(ray_cluster, data_root, tmp_path,
                                                                                capsys, monkeypatch):
    out = tmp_path / "run"
    argv = [*FLAGS, "--data-root", str(data_root), "--out", str(out)]
    resume = "run: python -m ray_jobs.run " + " ".join([*argv, "--resume"])
    codes = []
    thread = threading.Thread(target=lambda: codes.append(main(argv)))
    thread.start()
    wait_for(lambda: checkpoint.checkpoint_path(out / checkpoint.DIR, 0).exists(), what="round 0's checkpoint")
    os.kill(json.loads((out / "config.json").read_text())["provenance"]["driver"]["pid"], signal.SIGKILL)
    thread.join(timeout=600)
    err = capsys.readouterr().err.strip().splitlines()
    assert codes == [2] and len(err) == 1 and err[0].startswith("error: ")
    assert "The run folder keeps its rounds up to" in err[0] and err[0].endswith(f"to continue, {resume}.")
    assert not (out / "summary.json").exists()

    # the same command without --resume is refused: the interrupted run's checkpoints are kept
    kept = checkpoint.listing(out / checkpoint.DIR)
    assert kept and main(argv) == 2
    assert capsys.readouterr().err == (f"error: {out} holds an interrupted run (its newest checkpoint after round "
                                       f"{checkpoint.newest_round(out / checkpoint.DIR)}); continue it with --resume, "
                                       f"or start it afresh by deleting {out / 'checkpoints'} (or name another "
                                       "folder with --out).\n")
    assert checkpoint.listing(out / checkpoint.DIR) == kept

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("ray_jobs.run.run", interrupted)
    assert main([*argv, "--resume"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: interrupted;") and err[0].endswith(f"To continue, {resume}")


@pytest.mark.slow
def test_ctrl_c_writes_error_txt_naming_the_kept_rounds_and_keeps_the_checkpoint(data_root, tmp_path):
    """A real SIGINT to the entry point (in-process executor) mid-run: exit code 130, the run folder says
    why it stopped (error.txt), keeps its checkpoint and claims no completion (no summary.json)."""
    out = tmp_path / "run"
    # 40 rounds (the last --rounds wins): a tiny round is fast, the signal must land mid-run
    argv = [*FLAGS, "--rounds", "40", "--executor", "local", "--data-root", str(data_root), "--out", str(out)]
    # SIGINT's default action restored in the child: a test process started in the background (nohup, `&`)
    # ignores SIGINT, its children would inherit that and Python would then raise no KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, "-m", "ray_jobs.run", *argv],
                            env={**os.environ, "PYTHONPATH": str(PROJECT), "WANDB_MODE": "disabled"},  # no W&B
                            cwd=PROJECT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for(lambda: checkpoint.checkpoint_path(out / checkpoint.DIR, 0).exists() or proc.poll() is not None,
                 what="round 0's checkpoint")
        assert proc.poll() is None, "the run ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    done = int(checkpoint.listing(out / checkpoint.DIR)[0].stem.split("_")[1])
    resume = "run: python -m ray_jobs.run " + " ".join([*argv, "--resume"])
    assert (out / "error.txt").read_text() == (f"interrupted (Ctrl-C). The run folder keeps its rounds up to {done} "
                                               f"(checkpoint); to continue, {resume}.\n")
    assert not (out / "summary.json").exists()
    assert done + 1 <= len(read_jsonl(out / "metrics.jsonl")) <= done + 2  # (a round logged, its checkpoint not yet)


@pytest.mark.slow
def test_sweep_resumes_an_interrupted_run_from_its_last_round(killed, reference, data_root, tmp_path, capsys):
    from ray_jobs.sweep import execute

    out = tmp_path / "run"
    shutil.copytree(killed, out)
    done = int(checkpoint.listing(out / checkpoint.DIR)[0].stem.split("_")[1])
    cfg = config(data_root, out, executor="local")
    assert execute([cfg], None) == [cfg.run_name]
    assert f"note: resuming {cfg.run_name} after round {done} of 3" in capsys.readouterr().out
    assert metrics(out) == metrics(reference)
    assert summary(out) == summary(reference)


@pytest.mark.parametrize("executor,restarts", [("local", 3), ("ray", 0)])
@pytest.mark.slow
def test_checkpoint_every_two_rounds_reads_the_states_from_the_groups_and_resumes_identically(
        request, reference, data_root, tmp_path, executor, restarts):
    """--checkpoint-every 2: checkpoints after round 1 and the last round, none after round 0. In process, and
    from Ray actors that Ray will not restart (--actor-restarts 0: none needs rebuilding), the clients' states
    stay in their groups between checkpoints (nothing sent per round); a checkpoint reads them, and a run
    resumed from it (in process: the checkpoint is what is checked) gives the metrics of an uninterrupted run
    (FedDyn's h_k carried). The run stopped in round 2 is another test's: in process the non-finite loss test's
    (`stopped_in_round_2`), through Ray the one whose client actor died (`actor_died_in_round_2`)."""
    from ray_jobs.driver import Driver
    from ray_jobs.run import plan_run_clients

    if executor == "ray":
        request.getfixturevalue("ray_cluster")
    cfg = config(data_root, tmp_path / "driver", executor=executor, actor_restarts=restarts)
    assert not cfg.states_every_round and config(data_root, tmp_path, executor="ray").states_every_round
    driver = Driver(cfg, plan_run_clients(cfg), str(data_root))
    driver.run_round(0)
    assert driver.executor.client_states == {}  # not sent out of the groups in the round
    ck = driver.checkpoint()
    if executor == "ray":
        import ray

        for actor in driver.executor.groups:  # (a run's driver actor takes its client actors with it)
            ray.kill(actor)
    assert ck["states_round"] == 0 and sorted(ck["client_states"]) == list(range(5))
    # h_k after round 0: the client's weight change, not the zeros it started from
    for st in ck["client_states"].values():
        assert any(bool(h.abs().sum() > 0) for h in st["h"]) and all(bool(torch.isfinite(h).all()) for h in st["h"])

    out = tmp_path / "run"
    if executor == "ray":
        stopped, (msg,) = request.getfixturevalue("actor_died_in_round_2")
    else:
        stopped, msg, _ = request.getfixturevalue("stopped_in_round_2")
    shutil.copytree(stopped, out)
    assert "The run folder keeps its rounds up to 1 (checkpoint)" in msg
    assert [f.name for f in checkpoint.listing(out / checkpoint.DIR)] == ["round_0001.pt"]
    run(config(data_root, out, executor="local", checkpoint_every=2), quiet=True, resume=True)
    assert metrics(out) == metrics(reference)
    assert summary(out) == summary(reference)


@pytest.mark.parametrize("method", ["feddyn", "moon"])
@pytest.mark.slow
def test_in_process_groups_train_at_the_same_time_with_the_numbers_of_one_after_another(
        reference_run, data_root, tmp_path, monkeypatch, method):
    """The local executor's default (2 client groups, --cpus-per-actor 1, --driver-cpus 1): the groups train in two
    threads at the same time, each on one CPU thread, and the run's metrics and summary are those of the groups one
    after another (as before 2026-11-29) to the bit (and, as every Ray run of this module checks, those of Ray's
    actors). FedDyn keeps a state per client and on the server: its run at the same time is the reference; MOON draws
    each client's own initialisation in round 0 (torch's global stream, in both threads)."""
    from ray_jobs.executors import LocalExecutor

    kw = dict(executor="local") if method == "feddyn" else dict(executor="local", method="moon", rounds=2)
    if method == "feddyn":
        together, calls = reference_run
    else:
        together, calls = tmp_path / "together", timed_train_calls(monkeypatch)
        run(config(data_root, together, **kw), quiet=True)
    threads = {name for name, *_ in calls}
    (a0, a1), (b0, b1) = [(t0, t1) for _, t0, t1 in calls[:2]]
    assert len(threads) == 2 and all(name.startswith("client-group") for name in threads)
    assert a0 < b1 and b0 < a1  # round 0's two calls overlap
    monkeypatch.setattr(LocalExecutor, "concurrent", False)
    calls = timed_train_calls(monkeypatch)
    run(config(data_root, tmp_path / "one_after_another", **kw), quiet=True)
    assert len({name for name, *_ in calls}) == 1
    assert metrics(together) == metrics(tmp_path / "one_after_another")
    assert summary(together) == summary(tmp_path / "one_after_another")
