"""docs/adding-a-method.md's steps are the only ones a new method needs: its FedAvgM example's code blocks (those
headed `# file: PATH` or `# add to: PATH`), applied as they stand to a copy of the repository, give a method that
passes its own and the fused engine's tests and joins table all's smoke sweep (its run, and its row in the report
beside the paper's), with no other edit; its run equals, bit for bit, FedOpt's with the settings the page says
cover FedAvgM, run the same way, and differs from FedAvg's."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "adding-a-method.md"
# what the new method's checks read of a clone (beside ../shared, its data)
COPIED = ("benchmark", "lightning_modules", "ray_jobs", "tests", "pyproject.toml")
IMPORT = ("from ", "import ")


def marked_blocks(text: str) -> list[tuple[str, str, str]]:
    """(how, path, code) of each fenced block whose first line is `# file: PATH` (the file it makes) or
    `# add to: PATH` (the file it adds to), that line left out."""
    return re.findall(r"^```\w*\n# (file|add to): (\S+)\n(.*?)^```", text, flags=re.M | re.S)


def apply(repo: Path, how: str, path: str, code: str) -> None:
    """A block as the page says: a new file; or its leading imports after the file's last import and the rest at
    the file's end."""
    target = repo / path
    if how == "file":
        assert not target.exists(), path
        target.write_text(code)
        return
    lines = code.splitlines(keepends=True)
    n = next(i for i, line in enumerate(lines) if not line.startswith(IMPORT))
    text = target.read_text().splitlines(keepends=True)
    last = max(i for i, line in enumerate(text) if line.startswith(IMPORT))
    target.write_text("".join(text[:last + 1] + lines[:n] + text[last + 1:] + ["\n"] + lines[n:]))


def test_marked_blocks_and_how_they_apply(tmp_path):
    """The extraction and the `add to` rule on a page and a file made here."""
    page = "x\n```python\n# file: a.py\nA = 1\n```\n```python\n# add to: b.py\nimport os\n\nB = os.sep\n```\n"
    blocks = marked_blocks(page)
    assert blocks == [("file", "a.py", "A = 1\n"), ("add to", "b.py", "import os\n\nB = os.sep\n")]
    (tmp_path / "b.py").write_text("import re\n\nC = 2\n")
    for block in blocks:
        apply(tmp_path, *block)
    assert (tmp_path / "a.py").read_text() == "A = 1\n"
    assert (tmp_path / "b.py").read_text() == "import re\nimport os\n\nC = 2\n\n\nB = os.sep\n"


def last_line(out: str) -> str:
    return out.strip().splitlines()[-1] if out.strip() else ""


@pytest.mark.slow
def test_fedavgm_added_by_the_page_alone_runs_its_tests_and_joins_the_smoke_table(tmp_path, data_root):
    repo, res = tmp_path / "repo", tmp_path / "results"
    repo.mkdir()
    (tmp_path / "shared").symlink_to(data_root.parent)  # a clone beside ../shared, as the project's checkout
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, repo / name)
    blocks = marked_blocks(PAGE.read_text())
    assert sorted(p for _, p, _ in blocks) == ["lightning_modules/fedavgm.py", "lightning_modules/registry.py",
                                               "tests/test_fedavgm.py"]
    assert max(len(line) for _, _, code in blocks for line in code.splitlines()) <= 120  # tests/test_style.py's
    for block in blocks:
        apply(repo, *block)
    env = {**os.environ, "PYTHONPATH": str(repo), "WANDB_MODE": "disabled"}

    def python(*args):
        done = subprocess.run([sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True)
        assert done.returncode == 0, (args, done.stdout[-3000:], done.stderr[-3000:])
        return done.stdout

    # the checklist's test command (the method's own tests and the fused engine's, which take it by name), with the
    # other tests that read every registered method: its unknown hyperparameter, the method list of --help
    out = python("-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/test_fedavgm.py", "tests/test_fused.py",
                 "tests/test_fpl_ablations.py", "tests/test_bad_input.py", "-k", "fedavgm or lists_every_method")
    for test in ("test_fedavgm.py::test_fedopt_with_the_covering_settings_is_fedavgm[0.9]",
                 "test_fused.py::test_fused_equals_sequential_in_float64[fedavgm-False]",
                 "test_fpl_ablations.py::test_unknown_hyperparameter_raises[fedavgm]",
                 "test_bad_input.py::test_help_exits_zero_and_lists_every_method_with_what_it_is"):
        assert re.search(rf"{re.escape(test)} PASSED", out), out[-3000:]
    assert " failed" not in last_line(out) and " passed" in last_line(out)
    # the checklist's sweep: table all's smoke profile, FedAvg and the new method on Office-Caltech
    python("-m", "ray_jobs.sweep", "--table", "all", "--profile", "smoke", "--methods", "fedavg,fedavgm",
           "--datasets", "office_caltech", "--executor", "local", "--results-dir", str(res), "--data-root",
           str(data_root))
    [fedavgm], [fedavg] = (list((res / "runs").glob(f"{m}-office_caltech-*")) for m in ("fedavgm", "fedavg"))
    cfg = json.loads((fedavgm / "config.json").read_text())
    # FedOpt's covering settings (the page's command), run with the sweep's run's settings
    python("-m", "ray_jobs.run", "--method", "fedopt", "--hp", "weighting=samples", "--hp", "step_from=global",
           "--hp", "server_lr=1", "--hp", "server_momentum=0.9", "--preset", cfg["preset"], "--seed", str(cfg["seed"]),
           "--rounds", str(cfg["rounds"]), "--local-epochs", str(cfg["local_epochs"]), "--client-fraction",
           str(cfg["client_fraction"]), "--eval-max", str(cfg["eval_max"]), "--precision", cfg["precision"],
           "--executor", "local", "--data-root", str(data_root), "--out", str(res / "fedopt"), "--quiet")
    summary = {d: json.loads((d / "summary.json").read_text()) for d in (fedavgm, fedavg, res / "fedopt")}
    ours, fedopt = summary[fedavgm], summary[res / "fedopt"]
    assert {k for k in ours["protocol"] if ours["protocol"][k] != fedopt["protocol"][k]} == {"method", "hparams"}
    assert cfg["rounds"] >= 2  # the momentum reaches the second round's step
    assert (ours["final"], ours["last5"]) == (fedopt["final"], fedopt["last5"])  # equal: no tolerance
    model = {d: torch.load(d / "model.pt", weights_only=True) for d in summary}
    assert all(torch.equal(v, model[res / "fedopt"][k]) for k, v in model[fedavgm].items())
    assert not all(torch.equal(v, model[fedavg][k]) for k, v in model[fedavgm].items())  # not FedAvg's model
    # its row of the smoke report, beside FedAvg's and the paper's (none of its own: not in FPL's Table 2)
    df = pd.read_csv(res / "tableall.csv")
    office = df[(df.dataset == "office_caltech") & (df.method == "fedavgm")].set_index("domain")
    assert office.ours_mean.to_dict() == pytest.approx(ours["last5"], abs=1e-4)  # (the CSV rounds to 4 places)
    assert office.paper.isna().all()
    assert df[(df.method == "fedavg") & (df.dataset == "office_caltech")].paper.notna().all()
