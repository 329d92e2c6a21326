"""tools/chaos.py's short form (issue 54): a sweep SIGKILLed twice at moments drawn from a seed, started again until
its run completes, gives the run of an undisturbed sweep bit for bit and leaves no half-written file; the comparison
it makes sees a changed number and the file check a truncated checkpoint."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import tool_script

from benchmark import checkpoint

TOOL = tool_script.TOOLS / "chaos.py"
chaos = tool_script.load("chaos")


@pytest.mark.slow
def test_a_sweep_killed_twice_resumes_to_the_undisturbed_sweeps_run_and_nothing_is_half_written(data_root, tmp_path):
    out = tmp_path / "chaos"
    done = subprocess.run([sys.executable, str(TOOL), "--out", str(out), "--kills", "2", "--methods", "feddyn",
                           "--seeds", "0", "--executors", "local", "--seed", "1", "--domains", "webcam,dslr",
                           "--data-root", str(data_root)],
                          capture_output=True, text=True, timeout=900)
    said = done.stdout
    assert done.returncode == 0, said + done.stderr
    assert "kills: 2 (" in said and "moments drawn from seed 1" in said
    # each kill (the sweep, or the process of its one run: the sweep too) ended the sweep: started 3 times
    assert "sweep processes started: local 3;" in said
    assert "runs identical to the undisturbed sweep's (metrics.jsonl, summary.json; timings aside): 1 of 1" in said
    assert "files left half-written: 0; seen right after a kill: 0;" in said
    assert "time: undisturbed " in said

    run, reference = out / "chaos-local" / "runs" / "feddyn-seed0", out / "undisturbed-local"
    assert chaos.compared(reference, out / "chaos-local") == []
    rounds = (run / "metrics.jsonl").read_text().splitlines()
    last = json.loads(rounds[-1])
    last["train_loss"] = float(last["train_loss"]) + 1e-12
    (run / "metrics.jsonl").write_text("\n".join([*rounds[:-1], json.dumps(last)]) + "\n")
    assert chaos.compared(reference, out / "chaos-local") == ["feddyn-seed0"]

    saved = checkpoint.save(run / checkpoint.DIR, 0, {"round": 0})
    saved.write_bytes(saved.read_bytes()[:-5])
    (run / "summary.json").write_text('{"final": ')
    assert [b.split(":")[0] for b in chaos.half_written(out / "chaos-local")] == [
        "runs/feddyn-seed0/checkpoints/round_0000.pt", "runs/feddyn-seed0/summary.json"]


@pytest.mark.slow
def test_what_a_killed_sweep_leaves_is_named_from_its_command_line(tmp_path):
    """`end` names the processes it must kill: here a session of a sleeping sweep worker (spawned as the sweep spawns
    them), multiprocessing's resource tracker beside it, and Ray's kinds from command lines Ray writes."""
    script = tmp_path / "leaves.py"
    script.write_text("import multiprocessing, os, time\n"
                      "if __name__ == '__main__':\n"
                      "    p = multiprocessing.get_context('spawn').Process(target=time.sleep, args=(60,))\n"
                      "    p.start()\n"
                      "    print('started', flush=True)\n"
                      "    os._exit(0)\n")  # as SIGKILL would: the parent gone, its worker and tracker left
    sweep = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    assert sweep.stdout.readline() == "started\n"
    left = chaos.end(sweep, limit=2)
    assert left["sweep worker"] == 1 and set(left) <= {"sweep worker", "resource tracker"}, left
    for _ in range(100):  # killed: gone once reaped
        if subprocess.run(["pgrep", "-s", str(sweep.pid)], capture_output=True).returncode == 1:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the session's processes outlived their SIGKILL")
    ray = "/v/lib/python3.11/site-packages/ray"
    assert chaos.process_kind(f"{ray}/core/src/ray/gcs/gcs_server --log_dir=/tmp/ray/x") == "gcs_server"
    assert chaos.process_kind(f"/v/bin/python -u {ray}/autoscaler/_private/monitor.py --logs-dir=x") == "monitor.py"
    assert chaos.process_kind("ray::ClientGroup.fit") == "ray::ClientGroup.fit"
    assert chaos.process_kind("/v/bin/python -c from multiprocessing.resource_tracker import main;main(5)") == \
        "resource tracker"


def run_folder(results: Path, loss: float) -> Path:
    """A stand-in sweep's one complete run (its train loss `loss`)."""
    run = results / "runs" / "feddyn-seed0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"round": 0, "accuracy": {"AVG": 50.0}, "client_loss": 1.0,
                                                   "train_loss": loss}) + "\n")
    (run / "summary.json").write_text(json.dumps({"final": {"AVG": 50.0}, "wall_time_s": 1.0,
                                                  "finished_utc": "x", "peak_memory": {}}))
    return run


def undisturbed(args, executor, results, runs):
    """A stand-in for the undisturbed sweep: its run, a 60 s sweep of 30 s runs."""
    run_folder(results, 2.0)
    (results / "sweep.log").write_text("")
    return 60.0, 30.0


def test_passes_go_on_from_empty_folders_until_the_kills_asked_for_are_made(data_root, tmp_path, monkeypatch, capsys):
    """Runs that complete before the kills asked for start another pass from empty folders: 3 kills over local and
    Ray, each pass of the (stand-in) sweeps under fire making one kill: local's share 2 (two passes), Ray's 1 (one);
    every pass's runs compared with the undisturbed sweep's, its resumes read from its logs, the time lost counted
    against an undisturbed sweep per pass. Only the sweeps are stood in for (their timing decides the kills); the
    test above runs them."""
    asked = []

    def under_fire(args, executor, results, runs, kills, span, rng):
        asked.append((executor, results.name, kills))
        run_folder(results, 2.0 if results.name != "chaos-ray" else 2.5)  # Ray's pass differs from its reference
        (results / "sweep.log").write_text("note: resuming feddyn-seed0 after round 1\n")
        return {"kills": Counter({"sweep": 1}), "starts": 2, "seconds": 100.0, "seen": [],
                "leftovers": Counter({"sweep worker": 1})}

    monkeypatch.setattr(chaos, "undisturbed", undisturbed)
    monkeypatch.setattr(chaos, "under_fire", under_fire)
    code = chaos.main(["--out", str(tmp_path / "c"), "--kills", "3", "--methods", "feddyn", "--seeds", "0",
                       "--data-root", str(data_root)])
    said = capsys.readouterr().out
    assert asked == [("local", "chaos-local", 2), ("local", "chaos-local-pass2", 1), ("ray", "chaos-ray", 1)]
    assert "kills: 3 (sweep 3)" in said
    assert "passes (each from empty folders until every run completes): local 2, ray 1; sweep processes started: " \
           "local 4, ray 2; runs resumed from a checkpoint: 3 of 3 (3 resumes)" in said
    assert "runs identical to the undisturbed sweep's (metrics.jsonl, summary.json; timings aside): 2 of 3; " \
           "differ: ['chaos-ray/feddyn-seed0']" in said
    assert "processes left by killed sweeps (SIGKILLed after 30 s): 3 (sweep worker 3)" in said
    assert "lost 2 min 0 s" in said  # 300 s under fire, 3 passes of a 60 s undisturbed sweep
    assert code == 1  # a run differs


@pytest.mark.parametrize("fault", [None, "half-written", "temporary file"])
def test_a_file_seen_half_written_after_a_kill_or_a_temporary_file_left_fails_the_campaign(
        data_root, tmp_path, monkeypatch, capsys, fault):
    """Every run identical and whole at the end, the kill asked for made: exit code 0, unless a file did not read
    back right after a kill (a summary.json cut short, read by `half_written` then, whole again by the end) or a
    temporary file of an interrupted write is left in a run folder; either is named and the exit code is 1. Only the
    sweeps are stood in for, as above."""
    def under_fire(args, executor, results, runs, kills, span, rng):
        run = run_folder(results, 2.0)
        (results / "sweep.log").write_text("")
        seen = []
        if fault == "half-written":
            whole = (run / "summary.json").read_text()
            (run / "summary.json").write_text('{"final": ')
            seen = chaos.half_written(results)
            (run / "summary.json").write_text(whole)
        if fault == "temporary file":
            (run / ".metrics.jsonl.tmp4321").write_text('{"round": 0, "accu')
        return {"kills": Counter({"sweep": kills}), "starts": 2, "seconds": 100.0, "seen": seen,
                "leftovers": Counter()}

    monkeypatch.setattr(chaos, "undisturbed", undisturbed)
    monkeypatch.setattr(chaos, "under_fire", under_fire)
    code = chaos.main(["--out", str(tmp_path / "c"), "--kills", "1", "--methods", "feddyn", "--seeds", "0",
                       "--executors", "local", "--data-root", str(data_root)])
    said = capsys.readouterr().out
    assert "kills: 1 (sweep 1)" in said and "runs identical to the undisturbed sweep's (metrics.jsonl, summary.json; " \
        "timings aside): 1 of 1" in said
    seen = (" ['runs/feddyn-seed0/summary.json: Expecting value: line 1 column 11 (char 10)']"
            if fault == "half-written" else "")
    temp = " ['chaos-local/runs/feddyn-seed0/.metrics.jsonl.tmp4321']" if fault == "temporary file" else ""
    assert (f"files left half-written: 0; seen right after a kill: {len(seen) and 1}{seen}; temporary files of "
            f"interrupted writes left: {len(temp) and 1}{temp}\n") in said
    assert code == (1 if fault else 0)
