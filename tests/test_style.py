"""The project's code style: lines of at most 120 characters in every Python file, so that reviewers can read
diffs side by side without lines running off the page; pages and comments cite our code by file and name, never by
line number (a line number goes stale with the next edit above it)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_COLUMNS = 120
# where the Python files are when git cannot list them (no git, or a copy of the tree that is no checkout)
PACKAGES = ["benchmark", "lightning_modules", "ray_jobs", "tests", "tools"]


def python_files(pattern: str = "*.py") -> list[Path]:
    """The tracked files matching `pattern` (`git ls-files`), else every such file under the project's packages
    (and, for pages, docs/ and the README)."""
    try:
        listed = subprocess.run(["git", "ls-files", pattern], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return sorted(p for d in PACKAGES + ["docs"] for p in (ROOT / d).rglob(pattern)) + \
            ([ROOT / "README.md"] if pattern == "*.md" else [])
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


# a file name with an optional folder path before it, then ":" and a line number ("dir/name.py:12", "name.py:3-9")
LINE_CITATION = re.compile(r"(?<![\w./-])((?:[\w-]+/)*)([\w-]+\.py):\d+")


def test_no_page_or_comment_cites_a_line_of_our_code():
    """Our own files are cited by file and name (`load_domain` in `benchmark/data.py`): a line number goes stale
    with the next edit above it, as 19 in docs/gaps.md had by 2026-11-28. A citation is ours when its path is a
    file of this checkout, or a bare name that one of our files has; the official codes' files keep their line
    numbers (docs/gaps.md pins their commits), written with their folders where a name is also one of ours."""
    files = python_files()
    ours = {p.relative_to(ROOT).as_posix() for p in files}
    names = {p.name for p in files}
    cited = [f"{path.relative_to(ROOT)}:{n}: {m.group(0)}"
             for path in files + python_files("*.md")
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             for m in LINE_CITATION.finditer(line)
             if m.group(1) + m.group(2) in ours or (not m.group(1) and m.group(2) in names)]
    assert not cited, ("cite our code by file and name, not by line number (or, for an official code's file whose "
                       "name is also one of ours, write its folder):\n" + "\n".join(cited))
