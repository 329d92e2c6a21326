"""Faults thrown at a whole sweep, measured (docs/reliability.md, Chaos): a smoke sweep of MOON, FedDyn (both keep
per-client state) and FPL, seeds 0 and 1, once with the local executor (2 runs at once in worker processes) and once
with Ray (2 runs at once on a Ray instance of its own), first undisturbed, then with SIGKILLs at moments drawn from
--seed: a client actor, a driver actor, a run's worker process or the sweep process itself; each killed sweep is
started again (it resumes its runs) until every run completes; where the runs complete before the kills asked for
were made, another pass starts from empty folders (chaos-<executor>-pass2, ...). Then every run's metrics.jsonl and
summary.json are compared with the undisturbed sweep's (timings aside, as tests/test_reliability.py compares), every
file is read back, and the figures printed. Exit code 0 when every run is identical, no file is half-written (at the
end, or right after a kill), no temporary file of an interrupted write is left and the kills asked for were made.

    python tools/chaos.py --out /tmp/chaos --kills 20 --seed 0     # the campaign of docs/reliability.md
    python tools/chaos.py --out /tmp/chaos --kills 2 --methods feddyn --seeds 0 --executors local   # a short one
    python tools/chaos.py --out /tmp/chaos --kills 2 --methods feddyn --seeds 0 --executors local \
        --domains webcam,dslr                          # shorter: the two smallest domains (tests/test_chaos.py)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmark import checkpoint  # noqa: E402
from benchmark.checkpoint import CheckpointError  # noqa: E402
from benchmark.data import resolve_data_root  # noqa: E402
from benchmark.results import TEMP_FILES, computed_metrics, computed_summary, read_jsonl  # noqa: E402
from ray_jobs.config import RunConfig  # noqa: E402

# the smoke profile's tiny runs (ray_jobs.tables.PROFILES) on Office-Caltech-10, its 10 clients in 2 client groups
RUN = dict(dataset="office_caltech", local_epochs=1, client_fraction=0.05, eval_max=100)
KINDS = {"local": ("run process", "sweep"), "ray": ("client actor", "driver actor", "sweep")}
AT_ONCE = 2  # runs at once, with either executor
RAY_CPUS = 6  # the chaos sweep's own Ray instance: 2 runs of a driver and 2 client actors, 1 CPU each
MAX_STARTS = 200  # sweep processes per executor before the campaign gives up
MAX_PASSES = 10  # passes per executor (each from empty folders) before the campaign stops short of its kills
RESUMED = re.compile(r"note: resuming (\S+) after round (\d+)")


def plan(results: Path, executor: str, methods: list[str], seeds: list[int], rounds: int, data_root: str,
         domains: list[str] | None = None):
    return [RunConfig(method=m, seed=s, rounds=rounds, executor=executor, data_root=data_root, name=f"{m}-seed{s}",
                      out=str(results / "runs" / f"{m}-seed{s}"), domains=domains, **RUN)
            for m in methods for s in seeds]


def sweep_process(args) -> int:
    """The sweep itself (`--sweep-executor`): ray_jobs.sweep.execute over the plan, as `make table2` runs it."""
    from ray_jobs.run import RunError
    from ray_jobs.sweep import execute

    runs = plan(Path(args.results), args.sweep_executor, args.methods.split(","),
                [int(s) for s in args.seeds.split(",")], args.rounds, args.data_root,
                args.domains and args.domains.split(","))
    if args.sweep_executor == "ray":  # a Ray instance of this sweep's own, whatever else runs on the machine
        import ray

        ray.init(address="local", num_cpus=RAY_CPUS, include_dashboard=False, logging_level="WARNING")
    try:
        execute(runs, AT_ONCE)
    except RunError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


def start_sweep(args, executor: str, results: Path) -> subprocess.Popen:
    """A sweep process in a session of its own (its workers, Ray and actors with it), output to <results>/sweep.log."""
    results.mkdir(parents=True, exist_ok=True)
    with open(results / "sweep.log", "a") as log:
        return subprocess.Popen(
            [sys.executable, __file__, "--sweep-executor", executor, "--results", str(results), "--methods",
             args.methods, "--seeds", args.seeds, "--rounds", str(args.rounds), "--data-root", args.data_root,
             *(["--domains", args.domains] if args.domains else [])],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)})


def of_sweep(pid: int, sweep: subprocess.Popen) -> bool:
    """Whether `pid` is a live process of this sweep's session (not a pid reused by another)."""
    try:
        return os.getsid(pid) == sweep.pid
    except ProcessLookupError:
        return False


def targets(kind: str, sweep: subprocess.Popen, results: Path, since: float) -> list[int]:
    """The pids a kill of this kind could hit now, among the runs this sweep process is making (their config.json
    written since it started, no summary.json yet): the sweep's, a run's process (local: its worker, or the sweep
    for a run made in it; the one its provenance names as driver), a run's driver or client actors (Ray)."""
    pids = []
    for run in sorted((results / "runs").glob("*")):
        try:
            if (run / "summary.json").exists() or (run / "config.json").stat().st_mtime < since:
                continue
            prov = json.loads((run / "config.json").read_text())["provenance"]
        except (OSError, ValueError, KeyError):  # not written yet
            continue
        pids += {"sweep": [sweep.pid], "client actor": [a["pid"] for a in prov["actors"]]}.get(
            kind, [prov["driver"]["pid"]])
    return sorted({p for p in pids if of_sweep(p, sweep)})


def half_written(root: Path) -> list[str]:
    """Files that do not read back: JSON or JSONL that does not parse, a checkpoint whose sha256 fails, a model that
    does not load (the temporary files of atomic writes, `.<name>.tmp<pid>`, and W&B's folders aside)."""
    bad = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name.startswith(".") or "wandb" in path.parts:
            continue
        try:
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".jsonl":
                read_jsonl(path)
            elif path.parent.name == checkpoint.DIR:
                checkpoint.read(path)
            elif path.suffix == ".pt":
                torch.load(path, weights_only=True)
        except FileNotFoundError:  # replaced or deleted meanwhile by a run in flight
            continue
        except (ValueError, OSError, CheckpointError, RuntimeError, EOFError) as e:
            bad.append(f"{path.relative_to(root)}: {e}")
    return bad


def process_kind(cmdline: str) -> str:
    """What a left-behind process is, from its command line: a sweep's worker, multiprocessing's resource tracker, a
    Ray worker (its `ray::` title) or one of Ray's own processes (its program's name)."""
    if "resource_tracker" in cmdline:
        return "resource tracker"
    if "multiprocessing.spawn" in cmdline or "spawn_main" in cmdline:
        return "sweep worker"
    if cmdline.startswith("ray::"):
        return cmdline.split()[0]
    words = [w for w in cmdline.split() if not w.startswith("-")]
    program = [w for w in words[:3] if not Path(w).name.startswith("python")]
    return Path(program[0] if program else words[0]).name if words else "?"


def end(sweep: subprocess.Popen, limit: float = 30) -> Counter:
    """Waits for the sweep process, then for what is left of its session (a killed sweep's workers stop themselves,
    Ray's processes follow their driver) for up to `limit` s, then SIGKILLs that; returns the kinds of the processes
    so killed (`process_kind`), counted."""
    sweep.wait()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            os.killpg(sweep.pid, 0)
        except ProcessLookupError:
            return Counter()
        time.sleep(0.5)
    left = subprocess.run(["pgrep", "-a", "-s", str(sweep.pid)], capture_output=True, text=True).stdout.splitlines()
    try:
        os.killpg(sweep.pid, signal.SIGKILL)
    except ProcessLookupError:  # they ended since
        pass
    return Counter(process_kind(line.split(maxsplit=1)[1]) for line in left if " " in line)


def complete(results: Path, runs: int) -> bool:
    return len(list((results / "runs").glob("*/summary.json"))) == runs


def undisturbed(args, executor: str, results: Path, runs: int) -> tuple[float, float]:
    """The sweep without a fault: its wall time, and its runs' mean wall time (the span the kills' moments are
    drawn from)."""
    t0 = time.monotonic()
    sweep = start_sweep(args, executor, results)
    end(sweep)
    if sweep.returncode != 0 or not complete(results, runs):
        sys.exit(f"error: the undisturbed {executor} sweep failed (exit code {sweep.returncode}); see "
                 f"{results / 'sweep.log'}")
    spans = [json.loads(p.read_text())["wall_time_s"] for p in (results / "runs").glob("*/summary.json")]
    return time.monotonic() - t0, sum(spans) / len(spans)


def under_fire(args, executor: str, results: Path, runs: int, kills: int, span: float, rng: random.Random) -> dict:
    """Sweeps started again and again until every run completes, `kills` SIGKILLs thrown at them first, each at a
    moment drawn uniformly from [0, span] s after its target is there (`span`: an undisturbed run's wall time)."""
    made, seen, starts, leftovers, t0 = Counter(), [], 0, Counter(), time.monotonic()
    while not complete(results, runs):
        if starts == MAX_STARTS:
            sys.exit(f"error: {executor} runs still incomplete after {MAX_STARTS} sweep processes; see {results}")
        starts += 1
        since = time.time()
        sweep = start_sweep(args, executor, results)
        while sweep.poll() is None and sum(made.values()) < kills:
            kind = rng.choice(KINDS[executor])
            while sweep.poll() is None and not (pids := targets(kind, sweep, results, since)):
                time.sleep(0.2)
            if sweep.poll() is not None:
                break
            pid = rng.choice(pids)
            time.sleep(rng.uniform(0, span))
            if of_sweep(pid, sweep):
                os.kill(pid, signal.SIGKILL)
                made[kind] += 1
                print(f"  {executor}: kill {sum(made.values())}: {kind}, pid {pid}", flush=True)
                time.sleep(1)
                seen += half_written(results)
        leftovers += end(sweep)
    return {"kills": made, "starts": starts, "seconds": time.monotonic() - t0, "seen": seen, "leftovers": leftovers}


def compared(reference: Path, results: Path) -> list[str]:
    """The runs whose metrics.jsonl and summary.json, timings aside, differ from the undisturbed sweep's."""
    return [ref.name for ref in sorted((reference / "runs").iterdir())
            if computed_metrics(results / "runs" / ref.name) != computed_metrics(ref)
            or computed_summary(results / "runs" / ref.name) != computed_summary(ref)]


def resumes(results: Path) -> list[tuple[str, int]]:
    """(run, round) of every resume from a checkpoint the sweeps and their workers said."""
    logs = [results / "sweep.log", *sorted((results / "runs").glob("*/run.log"))]
    return [(name, int(r)) for log in logs for name, r in RESUMED.findall(log.read_text())]


def minutes(s: float) -> str:
    return f"{int(s // 60)} min {s % 60:.0f} s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/chaos.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="a new folder: the sweeps' run folders, their logs")
    ap.add_argument("--kills", type=int, default=20, help="SIGKILLs in all, split over the executors")
    ap.add_argument("--seed", type=int, default=0, help="draws the kills' kinds, targets and moments")
    ap.add_argument("--methods", default="moon,feddyn,fpl")
    ap.add_argument("--seeds", default="0,1", help="the runs' seeds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--domains", default=None, help="comma-separated Office-Caltech domains (default: all four)")
    ap.add_argument("--executors", default="local,ray")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--sweep-executor", help=argparse.SUPPRESS)  # the sweep process itself
    ap.add_argument("--results", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.sweep_executor:
        return sweep_process(args)
    if not args.out or (Path(args.out).exists() and any(Path(args.out).iterdir())):
        ap.error("--out takes a new or empty folder")
    out = Path(args.out).resolve()
    args.data_root = str(resolve_data_root(args.data_root))
    executors = args.executors.split(",")
    runs = len(args.methods.split(",")) * len(args.seeds.split(","))
    rng = random.Random(args.seed)
    base = {ex: undisturbed(args, ex, out / f"undisturbed-{ex}", runs) for ex in executors}
    fire, folders = {}, {ex: [] for ex in executors}
    for i, ex in enumerate(executors):  # the kills left, split over the executors left
        share = -(-(args.kills - sum(sum(f["kills"].values()) for f in fire.values())) // (len(executors) - i))
        passes, made = [], 0
        # a pass: from empty folders until every run completes; another while this executor's share of kills is not
        # made (its runs can complete before the kills asked for: each kill resumes them from their checkpoints)
        while not passes or (made < share and len(passes) < MAX_PASSES):
            folders[ex].append(out / (f"chaos-{ex}" + (f"-pass{len(passes) + 1}" if passes else "")))
            passes.append(under_fire(args, ex, folders[ex][-1], runs, share - made, base[ex][1], rng))
            made += sum(passes[-1]["kills"].values())
        fire[ex] = {"kills": sum((f["kills"] for f in passes), Counter()), "starts": sum(f["starts"] for f in passes),
                    "seconds": sum(f["seconds"] for f in passes), "seen": [b for f in passes for b in f["seen"]],
                    "leftovers": sum((f["leftovers"] for f in passes), Counter()), "passes": len(passes)}
    kills = sum((f["kills"] for f in fire.values()), Counter())
    differ = [f"{d.name}/{name}" for ex in executors for d in folders[ex]
              for name in compared(out / f"undisturbed-{ex}", d)]
    said = {d.name: resumes(d) for ex in executors for d in folders[ex]}
    left = [f"{d.name}/{b}" for ex in executors for d in folders[ex] for b in half_written(d)]
    seen = [b for f in fire.values() for b in f["seen"]]
    temp = sorted(str(p.relative_to(out)) for p in out.rglob(TEMP_FILES))
    lost = sum(f["seconds"] for f in fire.values()) - sum(base[ex][0] * fire[ex]["passes"] for ex in executors)
    total = runs * sum(f["passes"] for f in fire.values())
    print(f"kills: {sum(kills.values())} ({', '.join(f'{k} {n}' for k, n in sorted(kills.items()))}), moments drawn "
          f"from seed {args.seed}")
    starts = ", ".join(f"{ex} {fire[ex]['starts']}" for ex in executors)
    passes = ", ".join(f"{ex} {fire[ex]['passes']}" for ex in executors)
    print(f"passes (each from empty folders until every run completes): {passes}; sweep processes started: {starts}; "
          f"runs resumed from a checkpoint: {len({(d, n) for d in said for n, _ in said[d]})} of "
          f"{total} ({sum(map(len, said.values()))} resumes)")
    print(f"runs identical to the undisturbed sweep's (metrics.jsonl, summary.json; timings aside): "
          f"{total - len(differ)} of {total}" + (f"; differ: {differ}" * bool(differ)))
    print(f"files left half-written: {len(left)}" + (f" {left}" * bool(left)) + f"; seen right after a kill: "
          f"{len(seen)}" + (f" {seen}" * bool(seen)) + f"; temporary files of interrupted writes left: {len(temp)}"
          + (f" {temp}" * bool(temp)))
    leftovers = sum((f["leftovers"] for f in fire.values()), Counter())
    print(f"processes left by killed sweeps (SIGKILLed after 30 s): {sum(leftovers.values())}"
          + f" ({', '.join(f'{k} {n}' for k, n in sorted(leftovers.items()))})" * bool(leftovers))
    print(f"time: undisturbed {minutes(sum(b[0] for b in base.values()))} (once per pass in the time lost), under fire "
          f"{minutes(sum(f['seconds'] for f in fire.values()))}, "
          f"lost {minutes(lost)}")
    return 0 if not differ and not left and not seen and not temp and sum(kills.values()) >= args.kills else 1


if __name__ == "__main__":
    sys.exit(main())
