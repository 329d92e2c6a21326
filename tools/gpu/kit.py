"""The lent GPU machine's missing Python packages, fetched here and carried in parts (tools/gpu/stage.sh uses it).

    python tools/gpu/kit.py wheels DEST [--extra default]     # here: Ray (this environment's version) and every
                                                              # package it requires that the machine lacks, as
                                                              # wheels for its Python 3.12 on x86-64 Linux
    python tools/gpu/kit.py split FILE PREFIX [--part-mib 60]  # FILE in parts: PREFIX1/, PREFIX2/, ...
    python tools/gpu/kit.py join DIR OUT                      # there: the parts gathered in DIR back into OUT
    python tools/gpu/kit.py import TGZ --commit SHA --gpu-run JSON  # here: a window's results-small.tgz into
                                                              # the checkout, each run's provenance completed

What the machine has (docs/running.md, GPU runbook): torch, lightning, numpy, pandas, scikit-learn, matplotlib, tqdm and
what they require, read from this environment's installed metadata; every other package that Ray requires (with
--extra default, also those of ray[default], as pyproject.toml asks; stage.sh asks none: the machine's runs need no
dashboard) is fetched, and what those require in turn.
`split` and `join` need only the standard library (the machine's Python runs `join`).
"""
from __future__ import annotations

import argparse
import email.parser
import hashlib
import math
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

PRESENT = ("torch", "lightning", "numpy", "pandas", "scikit-learn", "matplotlib", "tqdm")
# the machine's interpreter (Python 3.12 on x86-64 Linux, KINDS.md) for environment markers and wheel tags
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
          "implementation_version": "3.12.3", "platform_python_implementation": "CPython", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix", "platform_release": "",
          "platform_version": ""}
# glibc 2.39 there (Ubuntu 24.04's Python 3.12.3); pip matches these tags exactly, so every older one is named
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 4, -1)] + ["manylinux2014_x86_64", "manylinux2010_x86_64",
                                                                     "manylinux1_x86_64"]
PART = re.compile(r"^(?P<name>.+)\.part(?P<k>\d+)of(?P<n>\d+)$")


class KitError(RuntimeError):
    """Staging cannot go on; the message says why."""


class MissingParts(KitError):
    """Not every part has arrived yet (join's exit code 3: carry the rest)."""


def requirements(lines: list[str] | None, extras: frozenset[str] = frozenset()):
    """The requirements among Requires-Dist `lines` that apply on the machine with these extras asked for."""
    from packaging.requirements import Requirement

    out = []
    for line in lines or []:
        r = Requirement(line)
        if r.marker is None or any(r.marker.evaluate({**TARGET, "extra": e}) for e in ("", *extras)):
            out.append(r)
    return out


def present() -> set[str]:
    """The machine's packages: PRESENT and everything they require (with the extras asked), as installed here."""
    from packaging.utils import canonicalize_name

    seen, todo = set(), [(name, frozenset()) for name in PRESENT]
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in seen:
            continue
        seen.add((canonicalize_name(name), extras))
        try:
            requires = metadata.distribution(name).requires
        except metadata.PackageNotFoundError:
            continue
        todo += [(r.name, frozenset(r.extras)) for r in requirements(requires, extras)]
    return {name for name, _ in seen}


def wheel_requires(path: Path) -> list[str]:
    """A wheel's Requires-Dist lines."""
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(z.read(name).decode()).get_all("Requires-Dist") or []


def download(requirement, dest: Path) -> Path:
    """One wheel for the machine of a packaging Requirement (not its dependencies), into dest; its path."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *(f"--platform={p}" for p in PLATFORMS), "-d", str(dest),
           f"{requirement.name}{requirement.specifier}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise KitError(f"pip found no wheel for {requirement} (Python 3.12, manylinux x86-64): "
                       f"{(res.stderr.strip().splitlines() or ['?'])[-1]}")
    name = canonicalize_name(requirement.name)
    return next(p for p in dest.glob("*.whl") if parse_wheel_filename(p.name)[0] == name)


def fetch_wheels(dest: Path, version: str, extras: frozenset[str]) -> dict[str, tuple[str, str]]:
    """Ray `version` (with `extras`) and every package it requires, in turn, that the machine lacks, as wheels in
    dest (a new folder); returns {name: (version, wheel file)}. Each requirement on a fetched package must hold."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename

    if dest.exists() and any(dest.iterdir()):
        raise KitError(f"{dest} is not empty; give a new folder.")
    dest.mkdir(parents=True, exist_ok=True)
    have = present()
    got: dict[str, tuple[str, str]] = {}
    seen = set()  # (package, extras) whose requirements are queued
    edges = []  # (who requires, requirement) for the check at the end
    todo = [("(staging)", Requirement(f"ray[{','.join(sorted(extras))}]=={version}" if extras else f"ray=={version}"))]
    while todo:
        who, r = todo.pop(0)
        name = canonicalize_name(r.name)
        if name in have:
            continue
        edges.append((who, r))
        if (name, frozenset(r.extras)) in seen:
            continue
        seen.add((name, frozenset(r.extras)))
        if name not in got:
            wheel = download(r, dest)
            got[name] = (str(parse_wheel_filename(wheel.name)[1]), wheel.name)
        todo += [(name, req) for req in requirements(wheel_requires(dest / got[name][1]), frozenset(r.extras))]
    broken = [f"{who} needs {r} but {got[canonicalize_name(r.name)][0]} was fetched" for who, r in edges
              if not r.specifier.contains(got[canonicalize_name(r.name)][0], prereleases=True)]
    if broken:
        raise KitError("conflicting requirements: " + "; ".join(broken))
    return got


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()  # (about 100 MiB at most: Ray's wheels)


def split(path: Path, prefix: str, part_mib: float) -> list[Path]:
    """path in as few parts of at most part_mib MiB as it takes, as equal as can be: PREFIX<k>/<name>.part<k>of<n>,
    each folder with <name>.sha256 (of the whole file), to travel one folder a call."""
    size, limit = path.stat().st_size, int(part_mib * 2**20)
    if limit < 1:
        raise KitError(f"--part-mib must be positive (got {part_mib:g}).")
    n = max(1, math.ceil(size / limit))
    each = math.ceil(size / n)
    digest = sha256(path)
    dirs = []
    with open(path, "rb") as f:
        for k in range(1, n + 1):
            d = Path(f"{prefix}{k}")
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{path.name}.part{k}of{n}").write_bytes(f.read(each))
            (d / f"{path.name}.sha256").write_text(f"{digest}  {path.name}\n")
            dirs.append(d)
    return dirs


def join(parts_dir: Path, out: Path) -> None:
    """The parts gathered in parts_dir (of one file: <name>.part<k>of<n> and <name>.sha256) back into out, checked
    against the sha256; MissingParts naming those still to come, KitError when the joined file's sha256 differs
    (out is then not written)."""
    parts = {}
    for p in parts_dir.iterdir():
        m = PART.match(p.name)
        if m:
            parts[(m["name"], int(m["k"]))] = (int(m["n"]), p)
    names = sorted({name for name, _ in parts})
    if len(names) != 1:
        raise KitError(f"{parts_dir} holds parts of {len(names)} files ({', '.join(names) or 'none'}); one expected.")
    name = names[0]
    n = next(iter(parts.values()))[0]
    missing = [k for k in range(1, n + 1) if (name, k) not in parts]
    if missing:
        raise MissingParts(f"{n - len(missing)} of {n} parts of {name} here; carry the folder(s) with part(s) "
                           f"{', '.join(map(str, missing))} in the next call.")
    tmp = out.with_name(out.name + ".joining")
    with open(tmp, "wb") as f:
        for k in range(1, n + 1):
            f.write(parts[(name, k)][1].read_bytes())
    want = (parts_dir / f"{name}.sha256").read_text().split()[0]
    got = sha256(tmp)
    if got != want:
        tmp.unlink()
        raise KitError(f"the {n} parts of {name} joined have sha256 {got[:12]}..., not {want[:12]}...: a part is "
                       "damaged; stage them again.")
    tmp.rename(out)


def import_results(tgz: Path, root: Path, commit: str, gpu_run: dict) -> list[str]:
    """A window's results-small.tgz (on-device.sh poll) unpacked into the checkout at root; every run folder in it
    gets, in its config.json, what the lent machine could not record: the commit its code was copied from (the
    tree travels without .git) and `gpu_run` (date, device, what shared the GPU; a run's wall time is not a single
    run's where it did). Refuses, before writing anything, an archive with a path outside results/ or a run
    that root already holds complete (a committed run is never overwritten); a complete run whose code predates
    metrics.jsonl.gz gets it (the form committed). Returns the runs imported."""
    import json
    import tarfile

    from benchmark.results import METRICS_ARCHIVE, pack_metrics

    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise KitError(f"--commit takes the full 40-digit commit the window's tree was at (got {commit!r}); "
                       "`git rev-parse HEAD` at the time of the call gives it.")
    with tarfile.open(tgz) as tar:
        members = tar.getmembers()
        for m in members:
            parts = Path(m.name).parts
            if not m.isfile() or ".." in parts or Path(m.name).is_absolute() or parts[0] != "results":
                raise KitError(f"{tgz} holds {m.name!r}: only files under results/ are imported.")
        runs = sorted({Path(m.name).parts[2] for m in members
                       if Path(m.name).parts[:2] == ("results", "runs") and Path(m.name).name == "config.json"})
        held = [r for r in runs if (root / "results/runs" / r / "summary.json").exists()]
        if held:
            raise KitError(f"{root / 'results/runs'} already holds {', '.join(held)}: remove them first to replace "
                           "them (nothing was written).")
        tar.extractall(root, members=members, filter="data")
    for r in runs:
        path = root / "results/runs" / r / "config.json"
        cfg = json.loads(path.read_text())
        git = cfg["provenance"]["git"]
        if git.get("commit") is None:  # recorded without .git: the commit the tree was copied from
            cfg["provenance"]["git"] = {"commit": commit, "dirty": False}
        cfg["provenance"]["gpu_run"] = gpu_run
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        run = path.parent
        if ((run / "summary.json").exists() and (run / "metrics.jsonl").exists()
                and not (run / METRICS_ARCHIVE).exists()):
            pack_metrics(run)
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/gpu/kit.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wheels", help="fetch Ray's wheels and those of what it requires that the machine lacks")
    w.add_argument("dest", type=Path)
    w.add_argument("--extra", action="append", default=[], help="a Ray extra to include, e.g. default")
    w.add_argument("--ray-version", default=None, help="default: the Ray installed here")
    s = sub.add_parser("split", help="a file in parts that travel one a call")
    s.add_argument("file", type=Path)
    s.add_argument("prefix")
    s.add_argument("--part-mib", type=float, default=60)
    j = sub.add_parser("join", help="the parts of one file gathered in a folder back into that file")
    j.add_argument("dir", type=Path)
    j.add_argument("out", type=Path)
    i = sub.add_parser("import", help="a window's results-small.tgz into the checkout, provenance completed")
    i.add_argument("tgz", type=Path)
    i.add_argument("--commit", required=True, help="the commit (40 digits) the window's tree was at, clean")
    i.add_argument("--gpu-run", required=True, help='JSON: {"date", "device", "shared_gpu_with", ...}')
    i.add_argument("--root", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    try:
        if args.cmd == "wheels":
            version = args.ray_version or metadata.version("ray")
            got = fetch_wheels(args.dest, version, frozenset(args.extra))
            (args.dest / "REQUIRED.txt").write_text("".join(f"{n}=={v}\n" for n, (v, _) in sorted(got.items())))
            size = sum((args.dest / f).stat().st_size for _, f in got.values())
            print(f"{len(got)} wheels, {size / 2**20:.1f} MiB, in {args.dest}: "
                  + ", ".join(f"{n} {v}" for n, (v, _) in got.items()))
        elif args.cmd == "split":
            dirs = split(args.file, args.prefix, args.part_mib)
            print(f"{args.file.name} ({args.file.stat().st_size / 2**20:.1f} MiB) in {len(dirs)} part(s): "
                  + ", ".join(f"{d} ({sum(p.stat().st_size for p in d.iterdir()) / 2**20:.1f} MiB)" for d in dirs))
        elif args.cmd == "import":
            import json
            try:
                gpu_run = json.loads(args.gpu_run)
            except json.JSONDecodeError as e:
                raise KitError(f"--gpu-run is not JSON ({e}).") from None
            runs = import_results(args.tgz, args.root, args.commit, gpu_run)
            print(f"imported {len(runs)} run(s) into {args.root / 'results/runs'}: {', '.join(runs)}")
        else:
            join(args.dir, args.out)
            print(f"{args.out}: joined, sha256 checked")
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3 if isinstance(e, MissingParts) else 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
