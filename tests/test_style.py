"""The project's code style: lines of at most 120 characters in every Python file, so that reviewers can read
diffs side by side without lines running off the page."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_COLUMNS = 120
# where the Python files are when git cannot list them (no git, or a copy of the tree that is no checkout)
PACKAGES = ["benchmark", "lightning_modules", "ray_jobs", "tests", "tools"]


def python_files() -> list[Path]:
    """The tracked *.py files (`git ls-files`), else every *.py file under the project's packages."""
    try:
        listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return sorted(p for d in PACKAGES for p in (ROOT / d).rglob("*.py"))
    return [ROOT / rel for rel in listed.stdout.splitlines() if (ROOT / rel).is_file()]


def test_no_line_of_python_is_longer_than_120_characters():
    """The column limit of the project (120): reviewers read diffs side by side."""
    files = python_files()
    assert files, f"no Python file found under {ROOT}"
    long = [f"{path.relative_to(ROOT)}:{n} ({len(line)} characters)"
            for path in files
            for n, line in enumerate(path.read_text(encoding="utf-8").replace("\r\n", "\n").split("\n"), 1)
            if len(line) > MAX_COLUMNS]
    assert not long, (f"{len(long)} line(s) longer than {MAX_COLUMNS} characters; wrap these lines to at most "
                      f"{MAX_COLUMNS} characters:\n" + "\n".join(long))
