"""The house's three floors: `benchmark` (what defines a benchmark, no method), `lightning_modules` (the methods and
the client side of a round) and `ray_jobs` (what runs things). A module imports only from its own floor or those
below; every relative link of the README and docs/ points at a file that exists, and at a heading it has."""
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


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a Markdown page's headings (outside code blocks): lower case, punctuation but - and _
    dropped, spaces as -, a repeated heading's with -1, -2."""
    out, seen, fence = set(), {}, False
    for line in page.read_text().splitlines():
        fence ^= line.lstrip().startswith("```")
        heading = re.match(r"#{1,6} (.+)", line)
        if fence or not heading:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1).strip())  # a link's text
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        out.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return out


def test_every_relative_link_of_the_readme_and_docs_resolves():
    """Each link to a file names one that exists, and each link to a heading (#...) one that the page has."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_anchors_as_github_makes_them(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# FedPLVM's Table 1 (Digit-5)\n```\n# not a heading\n```\n## Setup\n## Setup\n"
                    "### See [docs/x.md](docs/x.md): `make_table`\n")
    assert anchors(page) == {"fedplvms-table-1-digit-5", "setup", "setup-1", "see-docsxmd-make_table"}
