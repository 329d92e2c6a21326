"""Readings (`ray_jobs.tables.Reading`): the report's section of each reading's AVG and its gaps to the rows it is
paired with seed by seed, from the committed Office-Caltech runs (FedAPC's; FPL Table 2's FedDyn and FedAvg) and
made-up reading runs whose numbers are set here; every gap computed here by hand from the summary files."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np

from benchmark.results import protocol
from ray_jobs.plan import plan, reading_run
from ray_jobs.report import reading_lines
from ray_jobs.sweep import main as sweep
from ray_jobs.tables import TABLES, Reading

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


def test_table_2s_readings_pair_feddyn_and_fedprox_with_their_own_rows_on_office_caltech_alone(tmp_path):
    """FPL's Table 2 (issue 52): a FedDyn setting is paired with FedDyn as the table runs it (the control `OWN`)
    and with FedAvg; a section per method, none for a method whose readings have not run; none on Digits."""
    spec = TABLES["2"]
    for m in ("fedavg", "feddyn"):  # the committed rows (seeds 0, 1 and 2)
        for s in (0, 1, 2):
            name = f"{m}-office_caltech-default-seed{s}"
            (tmp_path / "runs" / name).mkdir(parents=True)
            shutil.copy(RUNS / name / "summary.json", tmp_path / "runs" / name)
    planned = plan("2", "full", ["mnist", "usps", "syn"], tmp_path, None, find_data=False)
    clip = next(r for r in spec.readings if r.hparams == {"max_grad_norm": 10})
    run = reading_run(planned, "office_caltech", 1, clip, False)
    assert Path(run.out).name == "feddyn-office_caltech-default-max_grad_norm10-seed1"  # as ray_jobs.run names it
    made_up(run, 49.0)
    lines = reading_lines(spec, "office_caltech", planned, "full")
    dyn, avg = ({s: last5_avg(f"{m}-office_caltech-default-seed{s}") for s in (0, 1, 2)} for m in ("feddyn", "fedavg"))
    assert lines[1].startswith("Readings of feddyn, each beside") and "erasing" not in lines[1]
    assert lines[3] == "| reading | seeds | AVG | − the method as the table runs it | − FedAvg |"
    gap = np.mean([dyn[s] - avg[s] for s in (0, 1, 2)])
    # the paper's FedDyn minus FedAvg on Office-Caltech: 55.25 - 54.36
    assert (f"| FedDyn as the table runs it: momentum 0.9, no clipping | 0, 1, 2 | {np.mean(list(dyn.values())):.2f} "
            f"| (itself) | {gap:+.2f} (+0.89), 3 pairs; undecided |") in lines
    assert (f"| FedDyn with Acar et al.'s clipping (max-norm 10) | 1 | 49.00 | {49 - dyn[1]:+.2f}, 1 pair | "
            f"{49 - avg[1]:+.2f}, 1 pair |") in lines
    assert lines[-1] == ("Not run yet: FedDyn with momentum 0 (Acar et al.'s) (`python -m ray_jobs.run --preset "
                         "fpl-office --method feddyn --hp momentum=0 --seed S`).")
    assert not any("fedprox" in x for x in lines)  # FedProx's rows and readings not run here: no section
    made_up(reading_run(planned, "digits", 0, spec.readings[0], False), 90.0)  # Digits' FedDyn row: not shown there
    assert reading_lines(spec, "digits", planned, "full") == []
    assert reading_lines(spec, "office_caltech", planned, "smoke") == []  # a smoke run is not a reading's
    # a reading that sets a hyperparameter to its default is its row's run: "(itself)", and the paper's gap
    at_default = dataclasses.replace(spec, readings=(Reading("alpha at its default", "feddyn", {"alpha": 0.01}),))
    row = next(x for x in reading_lines(at_default, "office_caltech", planned, "full") if x.startswith("| alpha"))
    assert row.split(" | ")[3:] == ["(itself)", f"{gap:+.2f} (+0.89), 3 pairs; undecided |"]


def test_a_sweep_with_readings_makes_the_readings_of_the_chosen_rows_and_skips_those_complete(tmp_path, capsys):
    """`--readings`: the runs the report's sections read (not the rows), of the seeds and datasets chosen, a
    reading with erasing with its FedAvg control; a complete one is not made again; a table without readings is an
    error naming those with some."""
    def dry(*args) -> list[str]:
        assert sweep(["--readings", "--dry-run", "--results-dir", str(tmp_path), *args]) == 0
        return [Path(line.strip()).name for line in capsys.readouterr().out.splitlines() if "/runs/" in line]

    assert dry("--table", "2", "--datasets", "office_caltech", "--seeds", "1") == [
        "fedprox-office_caltech-default-mu0.0001-seed1", "feddyn-office_caltech-default-max_grad_norm10-seed1",
        "feddyn-office_caltech-default-momentum0-seed1"]
    assert dry("--table", "2", "--datasets", "digits") == []  # Table 2 shows its readings on Office-Caltech alone
    fedapc = ["fedapc-office_caltech-fedapc-prototypeslast_epoch-seed0", "fedapc-office_caltech-fedapc-erasing-seed0",
              "fedavg-office_caltech-fedapc-erasing-seed0", "fedapc-office_caltech-fedapc-tau0.1-seed0",
              "fedapc-office_caltech-fedapc-tau0.5-seed0"]
    assert dry("--table", "fedapc", "--datasets", "office_caltech", "--seeds", "0") == fedapc
    planned = plan("fedapc", "full", None, tmp_path, None)
    tau = next(r for r in TABLES["fedapc"].readings if r.hparams == {"tau": 0.1})
    made_up(reading_run(planned, "office_caltech", 0, tau, False), 60.0)
    assert dry("--table", "fedapc", "--datasets", "office_caltech", "--seeds", "0") == [
        n for n in fedapc if "tau0.1" not in n]
    assert sweep(["--table", "1", "--readings", "--dry-run", "--results-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "error: table 1 has no readings; --readings is for 2, fedapc.\n"


def test_a_control_beside_a_reading_takes_its_method_where_own_and_erases_only_where_both_are_marked():
    own, fedavg = TABLES["2"].reading_controls  # (the method as the table runs it, FedAvg): neither marked
    erasing_fedavg = TABLES["fedapc"].reading_controls[1]  # FedAvg, marked: erases beside an erasing reading
    plain, erased = Reading("tau 0.1", "fedapc", {"tau": 0.1}), Reading("erasing", "fedapc", erasing=True)
    assert own.beside(plain) == (Reading(own.what, "fedapc"), False)
    assert fedavg.beside(erased) == (fedavg, False)
    assert erasing_fedavg.beside(plain) == (erasing_fedavg, False)
    assert erasing_fedavg.beside(erased) == (erasing_fedavg, True)
    assert TABLES["2"].shows_readings("office_caltech") and not TABLES["2"].shows_readings("digits")
    assert not TABLES["1"].shows_readings("office_caltech")  # a table without readings
