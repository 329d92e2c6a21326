"""The house's three floors: `benchmark` (what defines a benchmark, no method), `lightning_modules` (the methods and
the client side of a round) and `ray_jobs` (what runs things). A module imports only from its own floor or those
below; every relative link of the README and docs/ points at a file that exists."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLOORS = {"benchmark": 0, "lightning_modules": 1, "ray_jobs": 2}


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, those inside functions included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return out


def upward(package: str) -> list[str]:
    return [f"{f.relative_to(ROOT)}:{line} imports {mod}"
            for f in sorted((ROOT / package).glob("*.py")) for line, mod in imports(f)
            if FLOORS.get(mod.split(".")[0], -1) > FLOORS[package]]


@pytest.mark.parametrize("package", FLOORS)
def test_imports_run_only_downward(package):
    assert upward(package) == []


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    (tmp_path / "benchmark").mkdir()
    (tmp_path / "benchmark" / "x.py").write_text("def f():\n    from ray_jobs.run import run\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert upward("benchmark") == ["benchmark/x.py:2 imports ray_jobs.run"]


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_relative_link_of_the_readme_and_docs_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
