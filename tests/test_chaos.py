"""tools/chaos.py's short form (issue 54): a sweep SIGKILLed twice at moments drawn from a seed, started again until
its run completes, gives the run of an undisturbed sweep bit for bit and leaves no half-written file; the comparison
it makes sees a changed number and the file check a truncated checkpoint."""
from __future__ import annotations

import json
import subprocess
import sys

import tool_script

from benchmark import checkpoint

TOOL = tool_script.TOOLS / "chaos.py"
chaos = tool_script.load("chaos")


def test_a_sweep_killed_twice_resumes_to_the_undisturbed_sweeps_run_and_nothing_is_half_written(data_root, tmp_path):
    out = tmp_path / "chaos"
    done = subprocess.run([sys.executable, str(TOOL), "--out", str(out), "--kills", "2", "--methods", "feddyn",
                           "--seeds", "0", "--executors", "local", "--seed", "1", "--data-root", str(data_root)],
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
