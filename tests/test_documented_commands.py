"""Every command the README and docs/ show for a run, a sweep or a table's make target is one a user can type:
each `python -m ray_jobs.run ...` makes its RunConfig (every check made before a run), each `python -m
ray_jobs.sweep ...` and `make table... VAR=...` plans its runs with `--dry-run` (the same checks as a sweep before
its first run; nothing runs, nothing is written), and each `python -m ray_jobs.bench`, `figures` or `results_table`
command passes its parser (the bench's checks before it measures included). A flag renamed or a preset dropped fails
here, naming the page."""
from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# the docs' placeholders, and what stands in for them here
PLACEHOLDERS = {"<method>": "fedavg", "--method NAME": "--method fedavg", "--table N": "--table 2",
                "RUN_DIR [RUN_DIR ...]": "results/runs/a results/runs/b", "RUN_DIR ...": "results/runs/a",
                "[RESULTS_DIR ...]": "results"}
# run flags whose value is the RunConfig field of the same name, as typed (--split dirichlet, --domains, --hp and
# --device auto are translated, so they are left out)
PLAIN_FIELDS = {"method", "dataset", "rounds", "local_epochs", "batch_size", "lr", "momentum", "seed", "executor",
                "num_actors", "engine", "precision", "eval_every", "eval_max", "participation", "client_fraction",
                "checkpoint_every", "client_memory", "preset", "dirichlet_alpha", "gpus_per_actor", "driver_gpus"}
COMMAND = re.compile(r"python -m ray_jobs\.(run|sweep|bench|figures|results_table)\b([^#`|]*)")
MAKE = re.compile(r"((?:[A-Z_]+=\S+ )*)make (table[-a-z0-9]*)((?: [A-Z_]+=[^\s`|\"]+)*)")
TABLE_TARGETS = re.search(r"^TABLES := (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
# the sweeps' only refusal accepted here: the offline data root lacks SVHN's full training set and its test set
NO_SVHN = "missing data file"


def snippets(page: Path) -> list[str]:
    """The page's code: each line of its fenced blocks (continuations joined, comments dropped) and each inline
    code span (line breaks inside it read as spaces)."""
    text = page.read_text()
    out, rest = [], []
    for i, part in enumerate(re.split(r"^```.*$", text, flags=re.M)):
        if i % 2:  # inside a fence
            joined = re.sub(r"\\\n\s*", " ", part)
            out += [line.split(" # ")[0] for line in joined.splitlines()]
        else:
            rest.append(part)
    out += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", "\n".join(rest))]
    return out


def commands() -> list[tuple[str, str, list[str]]]:
    """(page, kind, argv) for every run, sweep and table make command shown, placeholders filled in."""
    found = {}
    for page in PAGES:
        for snippet in snippets(page):
            for k, v in PLACEHOLDERS.items():
                snippet = snippet.replace(k, v)
            for kind, args in COMMAND.findall(snippet):
                if args.strip() or kind != "sweep":  # a bare `python -m ray_jobs.sweep` names the module in prose
                    found.setdefault((kind, args.strip()), page.name)
            for before, target, after in MAKE.findall(snippet):
                if target in TABLE_TARGETS and "..." not in before + after:
                    found.setdefault(("make", f"{target} {before}{after}".strip()), page.name)
    return [(page, kind, shlex.split(args)) for (kind, args), page in sorted(found.items())]


COMMANDS = commands()


def test_the_pages_show_commands_of_each_kind():
    """The extraction itself: the quick reference of docs/running.md alone shows dozens."""
    kinds = [kind for _, kind, _ in COMMANDS]
    assert kinds.count("run") >= 30 and kinds.count("sweep") >= 10 and kinds.count("make") >= 15, kinds
    assert kinds.count("bench") >= 4 and kinds.count("figures") >= 3 and kinds.count("results_table") >= 1, kinds
    assert ("fedapc.md", "run", ["--preset", "fedapc-office", "--method", "fedapc"]) in COMMANDS
    assert ("running.md", "figures", ["tsne", "results/runs/demo-fedavg-office_caltech",
                                      "results/runs/demo-fpl-office_caltech"]) in COMMANDS


@pytest.mark.parametrize("page, argv", [(p, a) for p, k, a in COMMANDS if k == "run"],
                         ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_a_documented_run_command_makes_its_config(page, argv):
    from ray_jobs.run import build_parser, config_from_args, run_folder

    cfg = config_from_args(build_parser().parse_args(argv))
    if "--method" in argv:
        assert cfg.method == argv[argv.index("--method") + 1], page
    if cfg.departures and not cfg.out:  # a short run: a folder of its own, free on a fresh clone (`departures_name`)
        assert cfg.departures_name in run_folder(cfg).name and not (run_folder(cfg) / "summary.json").exists(), page
    # every plain `--flag value` the page shows is the config's value (typed as the field), the preset's aside
    for flag, value in zip(argv, argv[1:]):
        name = flag.removeprefix("--").replace("-", "_")
        if flag.startswith("--") and not value.startswith("--") and name in PLAIN_FIELDS:
            field = getattr(cfg, name)
            assert field == type(field)(value), (page, flag, value, field)


@pytest.mark.parametrize("page, kind, argv", [c for c in COMMANDS if c[1] in ("bench", "figures", "results_table")],
                         ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_a_documented_bench_figures_or_results_table_command_parses(page, kind, argv):
    """Parsed only: the bench measures for minutes, `figures all` redraws every figure, `--write` rewrites the
    README (each one's own tests run it)."""
    from ray_jobs import bench, figures, results_table

    if kind == "bench":
        args = bench.parse_args(argv)
        assert args.full_runs == ("--full-runs" in argv) and args.skip_ray == ("--skip-ray" in argv), page
    elif kind == "figures":
        assert figures.build_parser().parse_args(argv).cmd == argv[0], page
    else:
        assert results_table.build_parser().parse_args(argv).write == ("--write" in argv), page


def sweep_argv(kind: str, argv: list[str]) -> list[str]:
    """The sweep's arguments of a sweep or make command, as a dry run (a report-only command's plan instead)."""
    if kind == "make":  # the Makefile's own translation of the target and its variables
        shown = subprocess.run(["make", "-s", "-n", *argv, "PY=python", "STAMP="], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout
        argv = shlex.split(shown.replace("\\\n", " "))[3:]  # after `python -m ray_jobs.sweep`
    return [a for a in argv if a not in ("--report-only", "--dry-run")] + ["--dry-run"]


@pytest.mark.parametrize("page, kind, argv", [c for c in COMMANDS if c[1] in ("sweep", "make")],
                         ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_a_documented_sweep_plans_its_runs(page, kind, argv, capsys, monkeypatch, data_root, full_digits_root):
    """A command that needs SVHN and names no --domains is refused on the offline data root (SVHN's files are
    missing) and plans its runs on a data root that has them (the 1,083 SVHN images split in two, see conftest)."""
    from ray_jobs.sweep import main

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("BENCH_DATA_ROOT", str(data_root))
    before = sorted(p.name for p in (ROOT / "results").rglob("*"))
    code = main(sweep_argv(kind, argv))
    out, err = capsys.readouterr()
    if code == 2 and NO_SVHN in err and "svhn" in err:
        assert "--domains" not in argv and not any(a.startswith("DOMAINS=") for a in argv), (page, err)
        monkeypatch.setenv("BENCH_DATA_ROOT", str(full_digits_root))
        code = main(sweep_argv(kind, argv))
        out, err = capsys.readouterr()
    assert code == 0 and out.startswith("dry run of --table ") and "No run started" in out, (page, out, err)
    assert sorted(p.name for p in (ROOT / "results").rglob("*")) == before  # nothing written


def test_a_dry_run_lists_the_runs_to_make_and_where_each_resumes(tmp_path, data_root, capsys):
    """Table 2's Office-Caltech FedAvg seed 0 in an empty results folder: one run to make; with a checkpoint file of
    round 7 in its folder, it says the run resumes there; a complete one is not listed."""
    from benchmark import checkpoint
    from ray_jobs.sweep import main

    argv = ["--table", "2", "--datasets", "office_caltech", "--methods", "fedavg", "--seeds", "0", "--executor",
            "local", "--results-dir", str(tmp_path), "--data-root", str(data_root), "--dry-run"]
    run_dir = tmp_path / "runs" / "fedavg-office_caltech-default-seed0"
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[:2] == [
        "dry run of --table 2 (full profile): 0 of 1 runs already complete; it would make 1:", f"  {run_dir}"]
    assert not run_dir.exists()
    (run_dir / checkpoint.DIR).mkdir(parents=True)
    checkpoint.checkpoint_path(run_dir / checkpoint.DIR, 7).write_bytes(b"")
    assert main(argv) == 0
    assert f"  {run_dir}  (resumes after round 7)" in capsys.readouterr().out
    committed = [a if a != str(tmp_path) else str(ROOT / "results") for a in argv]
    assert main(committed) == 0
    assert capsys.readouterr().out.splitlines()[0] == ("dry run of --table 2 (full profile): 1 of 1 runs already "
                                                       "complete; it would make 0.")


def test_every_variable_of_the_table_targets_is_documented():
    """Each variable the Makefile's table targets pass to the sweep is shown (`VAR=...`) on docs/running.md, whose
    sweep options list them (five were missing on 2026-11-28)."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("$(TABLES): $(STAMP)"):]
    recipe = recipe[:recipe.index("\n\n")] if "\n\n" in recipe else recipe
    used = sorted(set(re.findall(r"\$\(([A-Z_]+)\)", recipe)) - {"PY", "TABLES", "STAMP"})
    page = (ROOT / "docs" / "running.md").read_text()
    assert len(used) >= 15 and not [v for v in used if not re.search(rf"[` ]{v}=", page)], used
