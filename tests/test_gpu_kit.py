"""tools/gpu/kit.py: a file in parts that travel one a call and join back bit for bit there; the wheels that make
Ray installable offline on the lent GPU machine (Python 3.12, x86-64 Linux) with `pip install --no-deps`."""
from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import torch

KIT = Path(__file__).resolve().parent.parent / "tools" / "gpu" / "kit.py"


def kit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(KIT), *args], cwd=cwd, capture_output=True, text=True, timeout=900)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_split_and_join_give_back_the_file(tmp_path):
    """2.5 MiB in parts of at most 1 MiB: three folders, one part each; joined with a part missing: exit 3 naming
    it; all three: the original bytes; a damaged part: no file, exit 2."""
    original = tmp_path / "ray-wheels.tar"
    original.write_bytes(os.urandom(5 * 2**19))
    res = kit("split", str(original), str(tmp_path / ".device" / "ray"), "--part-mib", "1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    dirs = sorted((tmp_path / ".device").iterdir())
    assert [d.name for d in dirs] == ["ray1", "ray2", "ray3"]
    parts = [d / f"ray-wheels.tar.part{k}of3" for k, d in enumerate(dirs, 1)]
    assert [p.stat().st_size for p in parts] == [873814, 873814, 873812]  # as equal as can be, each <= 1 MiB
    there = tmp_path / "there"  # the machine's folder that gathers the parts, one call after another
    there.mkdir()
    for d in dirs[:2]:
        for f in d.iterdir():
            shutil.copy(f, there)
    res = kit("join", str(there), str(there / "ray-wheels.tar"), cwd=tmp_path)
    assert res.returncode == 3 and not (there / "ray-wheels.tar").exists()
    assert res.stderr == ("error: 2 of 3 parts of ray-wheels.tar here; carry the folder(s) with part(s) 3 in the "
                          "next call.\n")
    for f in dirs[2].iterdir():
        shutil.copy(f, there)
    res = kit("join", str(there), str(there / "ray-wheels.tar"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert sha(there / "ray-wheels.tar") == sha(original)
    damaged = bytearray(parts[1].read_bytes())
    damaged[1000] ^= 1
    (there / parts[1].name).write_bytes(bytes(damaged))
    (there / "ray-wheels.tar").unlink()
    res = kit("join", str(there), str(there / "ray-wheels.tar"), cwd=tmp_path)
    assert res.returncode == 2 and "a part is damaged" in res.stderr and len(res.stderr.splitlines()) == 1
    assert not (there / "ray-wheels.tar").exists() and not (there / "ray-wheels.tar.joining").exists()


def registry_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def pip_cache(tmp_path_factory) -> Path:
    """One pip cache for the module's downloads: Ray's wheel (about 76 MiB) is fetched once."""
    return tmp_path_factory.mktemp("pip-cache")


@pytest.mark.skipif(not registry_reachable(), reason="needs the package registry (pypi.org)")
@pytest.mark.slow
def test_wheels_are_ray_of_this_environment_and_everything_it_needs_that_the_machine_lacks(tmp_path, pip_cache,
                                                                                          monkeypatch):
    """`kit.py wheels DEST --extra default`: one wheel per package, for CPython 3.12 on x86-64 Linux; Ray's version
    is this environment's; every requirement of Ray (with its default extra) and of each fetched wheel is either
    among the wheels or one of the machine's packages (torch, lightning, numpy, pandas, scikit-learn, matplotlib,
    tqdm and theirs), and no wheel is there that nothing requires. (stage.sh fetches Ray without the extra: its
    parts, `test_stage_with_ray_packs_its_parts_beside_the_office_data`.)"""
    monkeypatch.setenv("PIP_CACHE_DIR", str(pip_cache))
    from packaging.tags import compatible_tags, cpython_tags
    from packaging.utils import canonicalize_name, parse_wheel_filename

    spec = importlib.util.spec_from_file_location("kit", KIT)
    k = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(k)
    res = kit("wheels", str(tmp_path / "whl"), "--extra", "default", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    wheels = {}
    for p in (tmp_path / "whl").glob("*.whl"):
        name, version, _, tags = parse_wheel_filename(p.name)
        assert name not in wheels, f"two wheels of {name}"
        wheels[name] = (str(version), p, tags)
    listed = dict(line.split("==") for line in (tmp_path / "whl" / "REQUIRED.txt").read_text().split())
    assert listed == {n: v for n, (v, _, _) in wheels.items()}
    assert wheels["ray"][0] == metadata.version("ray")
    machine = set(cpython_tags((3, 12), platforms=k.PLATFORMS)) | set(compatible_tags((3, 12), "cp312", k.PLATFORMS))
    assert [n for n, (_, _, tags) in wheels.items() if not tags & machine] == []
    have = k.present()
    # aiohttp: fsspec[http]
    assert {"torch", "lightning", "numpy", "filelock", "packaging", "pyyaml", "aiohttp"} <= have
    required_by = {"ray": {"(staging)"}}
    for n, (_, p, _) in wheels.items():
        for r in k.requirements(k.wheel_requires(p), frozenset({"default"} if n == "ray" else ())):
            dep = canonicalize_name(r.name)
            assert dep in have or dep in wheels, f"{n} needs {r}, neither fetched nor on the machine"
            if dep in wheels:
                assert r.specifier.contains(wheels[dep][0], prereleases=True), f"{n} needs {r}"
                required_by.setdefault(dep, set()).add(n)
    assert set(required_by) == set(wheels)  # nothing fetched that nothing needs
    assert {"click", "jsonschema", "msgpack", "protobuf", "requests", "grpcio", "pydantic"} <= set(wheels)
    assert not {"torch", "numpy", "filelock", "packaging", "pyyaml", "aiohttp"} & set(wheels)


@pytest.mark.slow
def test_import_completes_the_provenance_of_a_windows_runs_and_overwrites_no_committed_run(tmp_path):
    """A window's results-small.tgz (runs recorded without .git): each run's config gets the commit given and the
    window's gpu_run entry, the other files land as they were; a second import of a run already complete, or an
    archive with a path outside results/, is refused with one line and writes nothing."""
    import io
    import json
    import tarfile

    def archive(path: Path, files: dict[str, str]) -> Path:
        with tarfile.open(path, "w:gz") as tar:
            for name, text in files.items():
                data = text.encode()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return path

    config = {"method": "moon", "seed": 1, "provenance": {"git": {"commit": None, "dirty": None}, "executor": "local"}}
    files = {"results/runs/moon-office_caltech-default-seed1/config.json": json.dumps(config),
             "results/runs/moon-office_caltech-default-seed1/summary.json": '{"complete": true}',
             "results/runs/moon-office_caltech-default-seed1/metrics.jsonl": '{"round": 0}\n',
             "results/table2.md": "# the device's report\n"}
    tgz = archive(tmp_path / "results-small.tgz", files)
    root = tmp_path / "checkout"
    root.mkdir()
    commit = "e115dcbc125ec51df516ef57173961beda310f58"
    gpu_run = '{"date": "2026-11-26", "device": "NVIDIA H200", "shared_gpu_with": "3 runs"}'
    done = kit("import", str(tgz), "--commit", commit, "--gpu-run", gpu_run, "--root", str(root), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"imported 1 run(s) into {root / 'results/runs'}: moon-office_caltech-default-seed1"
    run = root / "results/runs/moon-office_caltech-default-seed1"
    got = json.loads((run / "config.json").read_text())
    assert got["provenance"]["git"] == {"commit": commit, "dirty": False}
    assert got["provenance"]["gpu_run"] == json.loads(gpu_run) and got["method"] == "moon"
    assert (run / "metrics.jsonl").read_text() == '{"round": 0}\n'
    # a window's code before metrics.jsonl.gz: the committed form made here, its records those of the plain file
    assert gzip.decompress((run / "metrics.jsonl.gz").read_bytes()) == b'{"round": 0}\n'
    assert (root / "results/table2.md").read_text() == "# the device's report\n"

    (root / "results/table2.md").write_text("# ours\n")
    again = kit("import", str(tgz), "--commit", commit, "--gpu-run", gpu_run, "--root", str(root), cwd=tmp_path)
    assert (again.returncode == 2 and again.stderr.startswith("error: ")
            and "moon-office_caltech-default-seed1" in again.stderr)
    assert (root / "results/table2.md").read_text() == "# ours\n"  # nothing written
    evil = archive(tmp_path / "evil.tgz", {"results/../../outside.txt": "x"})
    refused = kit("import", str(evil), "--commit", commit, "--gpu-run", gpu_run, "--root", str(root), cwd=tmp_path)
    assert refused.returncode == 2 and "only files under results/ are imported" in refused.stderr
    assert not (tmp_path / "outside.txt").exists()
    short = kit("import", str(tgz), "--commit", "e115dcb", "--gpu-run", gpu_run, "--root", str(root), cwd=tmp_path)
    assert short.returncode == 2 and "40-digit commit" in short.stderr


def wheel(dest: Path, name: str) -> Path:
    """A pure-Python wheel of package `name` 1.0 (VALUE = 1), as a build backend writes one."""
    files = {f"{name}/__init__.py": b"VALUE = 1\n",
             f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{name}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                            b"Tag: py3-none-any\n"}
    b64 = lambda data: base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()  # noqa: E731
    record = "".join(f"{p},sha256={b64(d)},{len(d)}\n" for p, d in files.items()) + f"{name}-1.0.dist-info/RECORD,,\n"
    path = dest / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in {**files, f"{name}-1.0.dist-info/RECORD": record.encode()}.items():
            z.writestr(p, d)
    return path


@pytest.mark.slow
def test_stage_on_the_machine_gathers_rays_parts_over_two_calls_then_installs_and_checks_ray(tmp_path):
    """`bash tools/gpu/on-device.sh stage` as the runbook's calls run it, here (KIT_HOME a temporary folder, this
    environment's Python as the machine's): call 1 carries the first data folder, finch-clust's wheel (a stand-in
    wheel) and Ray's first part; call 2 the second data folder and part, while a detached job runs. After call 1:
    the data and the code are in place, the wheel installed, the part kept for the next call, nothing of Ray's
    installed. After call 2: both data folders merged, the code left as it was (a job reads it), the parts joined,
    Ray's wheels (a stand-in) installed and the parts removed, then Ray checked: on this machine, without a GPU,
    its one-line error."""
    proj, home = tmp_path / "proj", tmp_path / "home"
    (proj / "tools" / "gpu").mkdir(parents=True)
    for f in ("kit.py", "on-device.sh"):
        shutil.copy(KIT.parent / f, proj / "tools" / "gpu" / f)
    (proj / "code.txt").write_text("v1\n")
    dev = proj / ".device"
    for d, files in {"data1": ["SHA256SUMS", "office_caltech10/dslr.npz"], "data2": ["digits/syn_test.npz"]}.items():
        for f in files:
            (dev / d / f).parent.mkdir(parents=True, exist_ok=True)
            (dev / d / f).write_bytes(f"{d}/{f}".encode())
    (dev / "whl").mkdir()
    wheel(dev / "whl", "finchstand")
    raywhl = tmp_path / "raywhl"
    raywhl.mkdir()
    wheel(raywhl, "raystand")
    (raywhl / "REQUIRED.txt").write_text("raystand==1.0\n")
    with tarfile.open(tmp_path / "ray-wheels.tar", "w") as t:
        t.add(raywhl, arcname=".")
    tar = (tmp_path / "ray-wheels.tar").stat().st_size
    assert kit("split", str(tmp_path / "ray-wheels.tar"), str(dev / "ray"), "--part-mib", str(tar / 2 / 2**20 + 1e-6),
               cwd=tmp_path).returncode == 0
    later = tmp_path / "later"  # what call 2 carries
    later.mkdir()
    for d in ("data2", "ray2"):
        shutil.move(dev / d, later / d)
    # Ray's check starts a new local instance (never one a `ray start` left in /tmp/ray), its files in a folder of
    # its own (short: Ray's socket paths must stay under 107 characters)
    ray_tmp = Path(tempfile.mkdtemp(prefix="rk", dir="/tmp"))
    env = {**os.environ, "RAY_ADDRESS": "local", "RAY_TMPDIR": str(ray_tmp), "KIT_HOME": str(home),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def stage() -> str:
        proc = subprocess.Popen(["bash", "tools/gpu/on-device.sh", "stage"], cwd=proj, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=300)
        finally:  # and whatever it started (Ray's instance) when it did not end
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 0, out
        return out

    out = stage()
    assert "error: 1 of 2 parts of ray-wheels.tar here; carry the folder(s) with part(s) 2 in the next call." in out
    assert (home / "fpdata" / "office_caltech10" / "dslr.npz").read_bytes() == b"data1/office_caltech10/dslr.npz"
    assert (home / "proj" / "code.txt").read_text() == "v1\n" and not (home / "proj" / ".device").exists()
    assert (home / "site" / "finchstand" / "__init__.py").exists() and not (home / "site" / "raystand").exists()
    assert sorted(p.name for p in (home / "rayparts").iterdir()) == ["ray-wheels.tar.part1of2", "ray-wheels.tar.sha256"]

    shutil.rmtree(dev)  # call 2: a fresh copy of the tree, with call 2's folders only
    dev.mkdir()
    for d in ("data2", "ray2"):
        shutil.move(later / d, dev / d)
    (proj / "code.txt").write_text("v2\n")
    job = subprocess.Popen(["sleep", "300"])  # a detached job of an earlier call, reading the code folder
    try:
        (home / "logs" / "sweep.pid").write_text(f"{job.pid}\n")
        out = stage()
    finally:
        job.kill()
        job.wait()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert f"detached jobs running: code in {home / 'proj'} left as it is" in out
    assert (home / "proj" / "code.txt").read_text() == "v1\n"
    assert (home / "fpdata" / "digits" / "syn_test.npz").read_bytes() == b"data2/digits/syn_test.npz"
    assert (home / "fpdata" / "SHA256SUMS").exists()  # call 1's data kept
    assert "installed: raystand==1.0" in out and (home / "site" / "raystand" / "__init__.py").exists()
    assert not (home / "rayparts").exists() and not (home / "ray-wheels.tar").exists()
    if torch.cuda.is_available():  # (a machine with a GPU: Ray's two tasks share it)
        assert "two tasks of 0.5 GPU each" in out and "error: Ray detects no GPU" not in out
    else:
        assert "error: Ray detects no GPU; runs with --gpus-per-actor cannot start (torch sees 0)" in out


@pytest.mark.skipif(not registry_reachable(), reason="needs the package registry (pypi.org): stage.sh fetches "
                                                     "finch-clust's wheel")
@pytest.mark.slow
def test_stage_packs_the_data_in_folders_that_each_fit_one_call_beside_the_tree(data_root, tmp_path):
    """`bash tools/gpu/stage.sh` in a clone of this checkout: every file the runbook's runs read, byte for byte, in
    folders data1, data2, ... each of which fits one call beside the tree (the run tool carries 64 MiB a call; the
    script keeps 1 MiB spare), Office-Caltech in the first; finch-clust's wheel at this environment's version; the
    calls printed in order."""
    clone, res, tree = stage_in_clone(tmp_path, data_root, tmp_path / "pip-cache")
    dev = clone / ".device"
    folders = sorted(dev.glob("data*"), key=lambda d: int(d.name[4:]))
    assert [d.name for d in folders] == [f"data{k}" for k in range(1, len(folders) + 1)]
    assert size(folders[0]) + size(dev / "whl") + tree <= 63 * 2**20
    assert all(size(d) + tree <= 63 * 2**20 for d in folders[1:])
    staged = {str(f.relative_to(d)): f for d in folders for f in d.rglob("*") if f.is_file()}
    office = [f"office_caltech10/{d}.npz" for d in ("caltech", "amazon", "webcam", "dslr")]
    digits = ["usps_train", "usps_test", "svhn_train_first1083", "mnist_train", "mnist_test", "syn_test",
              "syn_train_part0", "syn_train_part1"]
    assert sorted(staged) == sorted(["SHA256SUMS", *office, *[f"digits/{d}.npz" for d in digits]])
    assert all(staged[f].read_bytes() == (data_root / f).read_bytes() for f in staged)
    assert all((folders[0] / f).exists() for f in office)
    wheels = [w.name.split("-")[:2] for w in (dev / "whl").iterdir()]
    assert wheels == [["finch_clust", metadata.version("finch-clust")]]
    calls = [line.strip() for line in res.stdout.splitlines() if "bash tools/gpu/on-device.sh stage" in line]
    assert calls == ['1. [".device/data1", ".device/whl"]   bash tools/gpu/on-device.sh stage',
                     *[f'+  [".device/{d.name}"]   bash tools/gpu/on-device.sh stage' for d in folders[1:]]]


@pytest.mark.skipif(not registry_reachable(), reason="needs the package registry (pypi.org): stage.sh fetches Ray's "
                                                     "wheels and finch-clust's")
@pytest.mark.slow
def test_stage_with_ray_packs_its_parts_beside_the_office_data(data_root, tmp_path, pip_cache):
    """`bash tools/gpu/stage.sh ray office` in a clone of this checkout: Office-Caltech, USPS and SVHN alone in
    data1 (the Office runs and the engine tests), Ray without its `default` extra (no dashboard wheels), in parts of
    at most half a call; the printed calls carry every folder once, data1 and the wheel in the first, each call at
    most 63 MiB beside the tree, no more calls than the bytes need plus one, and the last call holding a part of
    Ray's says it installs Ray; the parts joined are the wheels of REQUIRED.txt."""
    clone, res, tree = stage_in_clone(tmp_path, data_root, pip_cache, "ray", "office")
    dev = clone / ".device"
    assert sorted(str(f.relative_to(dev / "data1")) for f in (dev / "data1").rglob("*.npz")) == sorted(
        [f"office_caltech10/{d}.npz" for d in ("caltech", "amazon", "webcam", "dslr")]
        + [f"digits/{d}.npz" for d in ("usps_train", "usps_test", "svhn_train_first1083")])
    assert not (dev / "data2").exists()
    calls = [ln.strip() for ln in res.stdout.splitlines() if "bash tools/gpu/on-device.sh stage" in ln]
    carried = [json_list(ln) for ln in calls]
    folders = sorted(str(d.relative_to(clone)) for d in dev.iterdir())
    assert sorted(f for c in carried for f in c) == folders  # each once
    assert carried[0][:2] == [".device/data1", ".device/whl"]
    cap = 63 * 2**20 - tree
    assert all(sum(size(clone / f) for f in c) <= cap for c in carried)
    assert len(carried) <= -(-sum(size(clone / f) for f in folders) // cap) + 1
    parts = sorted((d for d in dev.glob("ray*")), key=lambda d: int(d.name[3:]))
    assert all(size(d) <= cap / 2 + 200 for d in parts)  # (the part and its sha256 line)
    with_ray = [k for k, c in enumerate(carried) if any(f.startswith(".device/ray") for f in c)]
    assert [k for k, ln in enumerate(calls) if "installs, checks Ray" in ln] == [with_ray[-1]]
    gathered = tmp_path / "parts"
    gathered.mkdir()
    for d in parts:
        for f in d.iterdir():
            shutil.copy(f, gathered / f.name)
    assert kit("join", str(gathered), str(tmp_path / "ray-wheels.tar"), cwd=tmp_path).returncode == 0
    with tarfile.open(tmp_path / "ray-wheels.tar") as t:
        names = {Path(n).name for n in t.getnames()}
        required = t.extractfile("./REQUIRED.txt").read().decode().split()
    wheels = {n.split("-")[0].lower().replace("_", "-") for n in names if n.endswith(".whl")}
    assert {r.split("==")[0] for r in required} == wheels and f"ray=={metadata.version('ray')}" in required
    assert not {"grpcio", "pydantic", "aiohttp-cors", "py-spy"} & wheels  # the default extra's


def stage_in_clone(tmp_path: Path, data_root: Path, pip_cache: Path, *args: str):
    """`bash tools/gpu/stage.sh ARGS` in a clone of this checkout (its tools/gpu as they are here): the clone, the
    finished process (checked) and the size of the tree that travels beside the staged folders."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(KIT.parent.parent.parent), str(clone)], check=True, timeout=300)
    shutil.copytree(KIT.parent, clone / "tools" / "gpu", dirs_exist_ok=True)
    res = subprocess.run(["bash", "tools/gpu/stage.sh", *args], cwd=clone, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHON": sys.executable, "BENCH_DATA_ROOT": str(data_root),
                              "PIP_CACHE_DIR": str(pip_cache)})
    assert res.returncode == 0, res.stdout + res.stderr
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=clone, capture_output=True,
                            text=True, check=True).stdout.split()
    return clone, res, sum((clone / f).stat().st_size for f in listed)


def size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def json_list(call: str) -> list[str]:
    """The carried folders of one printed call: `1. [".device/data1", ".device/whl"]   bash ...`."""
    import json

    return json.loads(call[call.index("["):call.index("]") + 1])
