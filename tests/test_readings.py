"""FedAPC's readings (`ray_jobs.tables.Reading`): the report's section of each reading's AVG and its gaps to the rows
it is paired with seed by seed, from the committed FedAPC Office-Caltech runs and two made-up reading runs whose
numbers are set here; every gap computed here by hand from the summary files."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from benchmark.results import protocol
from ray_jobs.plan import plan
from ray_jobs.report import reading_lines, reading_run
from ray_jobs.tables import TABLES

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "results" / "runs"


def last5_avg(name: str) -> float:
    return json.loads((RUNS / name / "summary.json").read_text())["last5"]["AVG"]


def made_up(cfg, avg: float) -> None:
    """A complete run folder of `cfg` whose last-5 AVG is `avg` (nothing else is read)."""
    out = Path(cfg.out)
    out.mkdir(parents=True)
    (out / "summary.json").write_text(json.dumps({"complete": True, "protocol": protocol(cfg),
                                                  "last5": {"AVG": avg}}))


def test_each_reading_is_paired_with_its_controls_over_the_seeds_both_have(tmp_path):
    spec = TABLES["fedapc"]
    for m in ("fedavg", "fedapc", "fedapc_noaug"):  # the committed rows (seeds 0 and 1)
        for s in (0, 1):
            name = f"{m}-office_caltech-fedapc-seed{s}"
            (tmp_path / "runs" / name).mkdir(parents=True)
            shutil.copy(RUNS / name / "summary.json", tmp_path / "runs" / name)
    planned = plan("fedapc", "full", ["mnist", "usps", "syn"], tmp_path, None, find_data=False)
    erased, control = spec.readings[2], spec.reading_controls[1]
    assert (erased.method, erased.erasing, control.method, control.erasing) == ("fedapc", True, "fedavg", True)
    made_up(reading_run(planned, "office_caltech", 0, erased, True), 65.0)
    made_up(reading_run(planned, "office_caltech", 0, control, True), 61.0)
    assert Path(reading_run(planned, "office_caltech", 0, erased, True).out).name == \
        "fedapc-office_caltech-fedapc-erasing-seed0"
    lines = reading_lines(spec, "office_caltech", planned, "full")
    avg, noaug, apc = ({s: last5_avg(f"{m}-office_caltech-fedapc-seed{s}") for s in (0, 1)}
                       for m in ("fedavg", "fedapc_noaug", "fedapc"))
    gap = lambda a, b: np.mean([a[s] - b[s] for s in (0, 1)])  # noqa: E731
    plain = (f"| as the table runs it: eval-mode prototypes after training, tau 0.02 | 0, 1 | "
             f"{np.mean(list(apc.values())):.2f} | {gap(apc, avg):+.2f} (+5.87), 2 pairs; undecided | "
             f"{gap(apc, avg):+.2f} (+5.87), 2 pairs; undecided | {gap(apc, noaug):+.2f} (+4.46), 2 pairs; undecided |")
    # 66.39 - 60.52 and 66.39 - 61.93: the paper's; beside a reading without erasing, FedAvg "with the same erasing"
    # is FedAvg as the paper ran it, its gap beside
    assert plain in lines
    # the erased reading: no paper gap (the paper's rows have no such setting); FedAvg with the same erasing: +4.00
    assert (f"| training batches erased too | 0 | 65.00 | {65 - avg[0]:+.2f}, 1 pair | +4.00, 1 pair | "
            f"{65 - noaug[0]:+.2f}, 1 pair |") in lines
    assert lines[-1] == (
        "Not run yet: prototypes from the last epoch's training batches (Alg. 1) (`python -m ray_jobs.run --preset "
        "fedapc-office --method fedapc --hp prototypes=last_epoch --seed S`); tau 0.1 (`python -m ray_jobs.run "
        "--preset fedapc-office --method fedapc --hp tau=0.1 --seed S`); tau 0.5 (`python -m ray_jobs.run --preset "
        "fedapc-office --method fedapc --hp tau=0.5 --seed S`).")
    assert reading_lines(spec, "digits", planned, "full") == []  # nothing run there: no section
    # a run of another protocol (here 2 rounds) is not the reading's
    summary_file = Path(reading_run(planned, "office_caltech", 0, control, True).out) / "summary.json"
    summary = json.loads(summary_file.read_text())
    summary["protocol"]["rounds"] = 2
    summary_file.write_text(json.dumps(summary))
    row = next(x for x in reading_lines(spec, "office_caltech", planned, "full") if x.startswith("| training"))
    assert row.split(" | ")[4] == "–"
