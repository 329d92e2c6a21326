"""benchmark.download, without a network: --copy-from, the conversions of torchvision's datasets
(on fake objects and on torchvision's own classes reading raw files written here from real
images), the whole download path through `main`, and failures (exit 2, nothing half-written).

Real images from ../shared/data throughout (fixture `data_root`).
"""
from __future__ import annotations

import bz2
import hashlib
import re
import shutil
import struct
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from urllib.error import URLError

import numpy as np
import pytest
import torch
import torchvision.datasets as tvd

from benchmark import download as DL
from benchmark.data import PROJECT_ROOT, check_domains_present, load_archive, load_domain, resolve_data_root

LINE = re.compile(r"^[0-9a-f]{64}  \S+$")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BENCH_DATA_ROOT", raising=False)

    def no_network(*a, **k):
        raise AssertionError("the test tried to reach the network")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sums(root: Path) -> dict[str, str]:
    """SHA256SUMS parsed by the test itself, every line checked for the `<digest>  <path>` format."""
    out = {}
    for line in (root / "SHA256SUMS").read_text().splitlines():
        assert LINE.match(line), line
        digest, rel = line.split("  ")
        out[rel] = digest
    return out


def _files(root: Path) -> set[str]:
    """Every file under root outside .downloads (temporary files included, so leftovers show)."""
    if not root.exists():
        return set()
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and ".downloads" not in p.relative_to(root).parts}


def _npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return z["x"], z["y"]


def _assert_root_consistent(root: Path) -> None:
    """SHA256SUMS lists exactly the npz files of root, each with the digest hashlib computes."""
    sums = _sums(root)
    npz = {f for f in _files(root) if f.endswith(".npz")}
    assert set(sums) == npz
    for rel in npz:
        assert sums[rel] == _sha(root / rel), rel


# --------------------------------------------------------------------------- (a) --copy-from

def test_copy_from_shared_gives_a_working_root(tmp_path, data_root, capsys):
    root = tmp_path / "root"
    assert DL.main(["--root", str(root), "--copy-from", str(data_root), "--only", "usps,dslr"]) == 0
    wanted = {"digits/usps_train.npz", "digits/usps_test.npz", "office_caltech10/dslr.npz"}
    assert _files(root) == wanted | {"SHA256SUMS"}

    shared_sums = _sums(data_root)
    sums = _sums(root)
    assert set(sums) == wanted
    for rel in wanted:
        path = root / rel
        assert path.is_file() and not path.is_symlink()  # a copy, not a link
        assert sums[rel] == hashlib.sha256(path.read_bytes()).hexdigest() == shared_sums[rel]

    assert resolve_data_root(str(root)) == root.resolve()
    check_domains_present(root, "digits", ["usps"])
    check_domains_present(root, "office_caltech", ["dslr"])
    for stem in ("digits/usps_train", "digits/usps_test", "office_caltech10/dslr"):
        x, y = load_archive(root, stem)
        x0, y0 = _npz(data_root / f"{stem}.npz")
        np.testing.assert_array_equal(x, x0)
        np.testing.assert_array_equal(y, y0)
    dom = load_domain(root, "office_caltech", "dslr")
    assert len(dom.train_y) + len(dom.test_y) == 157
    assert "copied digits/usps_train.npz" in capsys.readouterr().out

    # a second run copies nothing and leaves every file as it was
    before = {rel: (root / rel).stat().st_mtime_ns for rel in _files(root)}
    assert DL.main(["--root", str(root), "--copy-from", str(data_root), "--only", "usps,dslr"]) == 0
    assert {rel: (root / rel).stat().st_mtime_ns for rel in _files(root)} == before
    assert "copied" not in capsys.readouterr().out


def test_copy_keeps_existing_entries_and_lists_unlisted_files(tmp_path, data_root):
    root = tmp_path / "root"
    (root / "digits").mkdir(parents=True)
    (root / "extra").mkdir()
    shutil.copyfile(data_root / "digits/usps_test.npz", root / "digits/usps_test.npz")
    own = _sha(data_root / "digits/usps_test.npz")
    (root / "SHA256SUMS").write_text(f"{own}  digits/usps_test.npz\n")
    x, y = _npz(data_root / "digits/usps_test.npz")
    np.savez(root / "extra/mine.npz", x=x[:5], y=y[:5])  # in the root but not listed

    assert DL.main(["--root", str(root), "--copy-from", str(data_root), "--only", "usps"]) == 0
    sums = _sums(root)
    assert sums["digits/usps_test.npz"] == own
    assert sums["digits/usps_train.npz"] == _sha(data_root / "digits/usps_train.npz")
    assert sums["extra/mine.npz"] == _sha(root / "extra/mine.npz")
    _assert_root_consistent(root)


def test_copy_refuses_a_file_whose_sha256_does_not_match(tmp_path, data_root, capsys):
    src = tmp_path / "src"
    (src / "digits").mkdir(parents=True)
    shutil.copyfile(data_root / "digits/usps_test.npz", src / "digits/usps_test.npz")
    (src / "SHA256SUMS").write_text(f"{'0' * 64}  digits/usps_test.npz\n")
    root = tmp_path / "root"
    assert DL.main(["--root", str(root), "--copy-from", str(src), "--only", "usps"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "usps_test.npz" in err and "sha256" in err
    assert _files(root) == set()  # no copy, no temporary file, no SHA256SUMS


def test_copy_from_needs_a_sha256sums(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    assert DL.main(["--root", str(tmp_path / "root"), "--copy-from", str(tmp_path / "src")]) == 2
    assert "SHA256SUMS" in capsys.readouterr().err
    assert not (tmp_path / "root").exists()


def test_missing_syn_and_office_say_where_they_come_from(tmp_path, capsys):
    root = tmp_path / "root"
    assert DL.main(["--root", str(root), "--only", "syn,office"]) == 0
    out = capsys.readouterr().out
    assert "Roy et al. 2018" in out and "syn/val" in out
    assert "Gong et al. 2012" in out and "caltech, amazon, webcam, dslr" in out
    assert "--copy-from" in out
    assert _files(root) == set()


# --------------------------------------------------------------------------- (b) conversions

def test_convert_mnist_fake_object(data_root):
    x, y = _npz(data_root / "digits/mnist_test.npz")
    x, y = x[:2000], y[:2000]
    # what torchvision's MNIST holds: .data uint8 tensor N x 28 x 28, .targets int64 tensor
    fake = SimpleNamespace(data=torch.from_numpy(x[..., 0].copy()), targets=torch.from_numpy(y.copy()))
    cx, cy = DL.convert_mnist(fake)
    assert cx.dtype == np.uint8 and cx.shape == (2000, 28, 28, 1) and cy.dtype == np.int64
    np.testing.assert_array_equal(cx, x)
    np.testing.assert_array_equal(cy, y)


def test_convert_usps_fake_object(data_root):
    x, y = _npz(data_root / "digits/usps_train.npz")
    # what torchvision's USPS holds: .data uint8 numpy N x 16 x 16, .targets a list of ints
    fake = SimpleNamespace(data=x[..., 0].copy(), targets=[int(v) for v in y])
    cx, cy = DL.convert_usps(fake)
    assert cx.dtype == np.uint8 and cx.shape == (7291, 16, 16, 1) and cy.dtype == np.int64
    np.testing.assert_array_equal(cx, x)
    np.testing.assert_array_equal(cy, y)
    # whole-valued floats convert exactly; anything that would need rounding is refused
    fake_f = SimpleNamespace(data=x[:50, ..., 0].astype(np.float32), targets=y[:50].tolist())
    np.testing.assert_array_equal(DL.convert_usps(fake_f)[0], x[:50])
    fake_f.data = fake_f.data + 0.5
    with pytest.raises(ValueError, match="whole numbers"):
        DL.convert_usps(fake_f)


def test_convert_svhn_fake_object(data_root):
    x, y = _npz(data_root / "digits/svhn_train_first1083.npz")
    # what torchvision's SVHN holds: .data uint8 numpy N x 3 x 32 x 32, .labels int64 0..9
    fake = SimpleNamespace(data=np.ascontiguousarray(x.transpose(0, 3, 1, 2)), labels=y.copy())
    cx, cy = DL.convert_svhn(fake)
    assert cx.dtype == np.uint8 and cx.shape == (1083, 32, 32, 3) and cy.dtype == np.int64
    np.testing.assert_array_equal(cx, x)
    np.testing.assert_array_equal(cy, y)
    fake.labels = np.where(y == 0, 10, y)  # SVHN's own 1..10 labels map the same way
    np.testing.assert_array_equal(DL.convert_svhn(fake)[1], y)


def test_conversions_refuse_bad_labels_and_shapes():
    with pytest.raises(ValueError, match="0..9"):
        DL.convert_mnist(SimpleNamespace(data=torch.zeros(3, 28, 28, dtype=torch.uint8),
                                         targets=torch.tensor([0, 1, 12])))
    with pytest.raises(ValueError, match=r"expected \(16, 16, 1\)"):
        DL.convert_usps(SimpleNamespace(data=np.zeros((3, 28, 28), np.uint8), targets=[0, 1, 2]))
    with pytest.raises(ValueError, match="3 x 32 x 32"):
        DL.convert_svhn(SimpleNamespace(data=np.zeros((3, 32, 32, 3), np.uint8), labels=np.zeros(3, np.int64)))


# raw files in torchvision's own formats, written from the real images

def _write_mnist_raw(raw: Path, x: np.ndarray, y: np.ndarray, prefix: str) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    n = len(y)
    (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, 28, 28) + x.tobytes())
    (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + y.astype(np.uint8).tobytes())


def _usps_raw(x: np.ndarray, y: np.ndarray) -> bytes:
    """libsvm format, labels 1..10, values in [-1, 1] that torchvision's (v + 1) / 2 * 255 -> uint8 maps back to x."""
    value = [f"{(2 * p + 1) / 255 - 1:.5f}" for p in range(256)]  # decodes to p + 0.5, truncated to p
    tokens = [[f"{i + 1}:{value[p]}" for p in range(256)] for i in range(256)]
    flat = x.reshape(len(x), 256)
    lines = [f"{lab + 1} " + " ".join(tokens[i][p] for i, p in enumerate(row)) + "\n"
             for lab, row in zip(y.tolist(), flat.tolist())]
    return bz2.compress("".join(lines).encode(), 1)


@pytest.fixture(scope="module")
def usps_test_raw(data_root) -> bytes:
    """The real USPS test set as torchvision's raw usps.t.bz2 (made once: about a second)."""
    return _usps_raw(*_npz(data_root / "digits/usps_test.npz"))


def _place(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def _write_svhn_raw(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    import scipy.io

    path.parent.mkdir(parents=True, exist_ok=True)
    # the official layout: X is H x W x C x N uint8, y is N x 1 with the digit 0 labelled 10
    scipy.io.savemat(path, {"X": np.ascontiguousarray(x.transpose(1, 2, 3, 0)),
                            "y": np.where(y == 0, 10, y).astype(np.uint8)[:, None]})


def test_torchvision_classes_on_real_raw_files(tmp_path, data_root, monkeypatch, usps_test_raw):
    """torchvision's MNIST, USPS and SVHN read raw files made from the shared images; converting gives them back."""
    x, y = _npz(data_root / "digits/mnist_test.npz")
    raw = tmp_path / "tv" / "MNIST" / "raw"
    _write_mnist_raw(raw, x, y, "t10k")
    _write_mnist_raw(raw, x[:10], y[:10], "train")  # torchvision wants all four files present
    ds = tvd.MNIST(str(tmp_path / "tv"), train=False, download=False)
    assert ds.data.dtype == torch.uint8 and tuple(ds.data.shape) == (10000, 28, 28)
    cx, cy = DL.convert_mnist(ds)
    np.testing.assert_array_equal(cx, x)
    np.testing.assert_array_equal(cy, y)

    x, y = _npz(data_root / "digits/usps_test.npz")
    _place(tmp_path / "tv" / "USPS" / "usps.t.bz2", usps_test_raw)
    ds = tvd.USPS(str(tmp_path / "tv" / "USPS"), train=False, download=False)
    assert ds.data.dtype == np.uint8 and ds.data.shape == (2007, 16, 16) and isinstance(ds.targets, list)
    cx, cy = DL.convert_usps(ds)
    np.testing.assert_array_equal(cx, x)
    np.testing.assert_array_equal(cy, y)

    x, y = _npz(data_root / "digits/svhn_train_first1083.npz")
    _write_svhn_raw(tmp_path / "tv" / "SVHN" / "train_32x32.mat", x, y)
    monkeypatch.setattr(tvd.SVHN, "_check_integrity", lambda self: True)  # md5 of the official file
    ds = tvd.SVHN(str(tmp_path / "tv" / "SVHN"), split="train", download=False)
    assert ds.data.dtype == np.uint8 and ds.data.shape == (1083, 3, 32, 32) and ds.labels.dtype == np.int64
    cx, cy = DL.convert_svhn(ds)
    np.testing.assert_array_equal(cx, x)
    np.testing.assert_array_equal(cy, y)


def test_main_downloads_through_torchvision_from_its_cache(tmp_path, data_root, monkeypatch, usps_test_raw):
    """The whole path of `make data` with torchvision's raw files already in <root>/.downloads
    (torchvision then skips the download): archives written, listed, loadable, equal to the originals."""
    root = tmp_path / "root"
    cache = root / ".downloads"
    mx, my = _npz(data_root / "digits/mnist_test.npz")
    _write_mnist_raw(cache / "MNIST" / "raw", mx, my, "t10k")
    _write_mnist_raw(cache / "MNIST" / "raw", mx[:10], my[:10], "train")
    (root / "digits").mkdir(parents=True)
    for rel in ("digits/mnist_train.npz", "digits/usps_train.npz"):  # present: left alone
        shutil.copyfile(data_root / rel, root / rel)
    tx, ty = _npz(data_root / "digits/usps_test.npz")
    _place(cache / "USPS" / "usps.t.bz2", usps_test_raw)
    sx, sy = _npz(data_root / "digits/svhn_train_first1083.npz")
    _write_svhn_raw(cache / "SVHN" / "train_32x32.mat", sx[:800], sy[:800])
    _write_svhn_raw(cache / "SVHN" / "test_32x32.mat", sx[800:], sy[800:])
    monkeypatch.setattr(tvd.SVHN, "_check_integrity", lambda self: True)
    monkeypatch.setattr(tvd.SVHN, "download", lambda self: None)
    monkeypatch.setitem(DL.EXPECTED_COUNTS, "digits/svhn_train", 800)
    monkeypatch.setitem(DL.EXPECTED_COUNTS, "digits/svhn_test", 283)

    assert DL.main(["--root", str(root), "--only", "mnist,usps,svhn"]) == 0
    _assert_root_consistent(root)
    assert set(_sums(root)) == {f"digits/{d}_{s}.npz" for d in ("mnist", "usps", "svhn") for s in ("train", "test")}
    for rel in ("digits/mnist_train.npz", "digits/usps_train.npz"):
        assert _sha(root / rel) == _sha(data_root / rel)
    for stem, (x, y) in {"digits/mnist_test": (mx, my), "digits/usps_test": (tx, ty),
                         "digits/svhn_train": (sx[:800], sy[:800]), "digits/svhn_test": (sx[800:], sy[800:])}.items():
        lx, ly = load_archive(root, stem)
        np.testing.assert_array_equal(lx, x)
        np.testing.assert_array_equal(ly, y)
        assert lx.dtype == np.uint8 and ly.dtype == np.int64
    assert resolve_data_root(str(root)) == root.resolve()
    check_domains_present(root, "digits", ["mnist", "usps", "svhn"])


# --------------------------------------------------------------------------- (c) failures

def _raise(exc):
    class Failing:
        def __init__(self, *a, **k):
            raise exc
    return Failing


def test_download_failure_exits_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tvd, "MNIST", _raise(URLError("[Errno -3] Temporary failure in name resolution")))
    root = tmp_path / "root"
    assert DL.main(["--root", str(root), "--only", "mnist"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: downloading MNIST (train split) with torchvision failed")
    assert "name resolution" in err and "internet" in err and "--copy-from ../shared/data" in err
    assert _files(root) == set()


def test_failure_leaves_an_existing_root_untouched(tmp_path, data_root, monkeypatch, capsys):
    root = tmp_path / "root"
    assert DL.main(["--root", str(root), "--copy-from", str(data_root), "--only", "usps"]) == 0
    before = {rel: (root / rel).read_bytes() for rel in _files(root)}
    monkeypatch.setattr(tvd, "SVHN", _raise(OSError(28, "No space left on device")))
    assert DL.main(["--root", str(root), "--only", "usps,svhn"]) == 2
    err = capsys.readouterr().err
    assert "SVHN" in err and "No space left" in err and "leave svhn out with --only usps" in err
    assert {rel: (root / rel).read_bytes() for rel in _files(root)} == before


def test_partial_failure_keeps_finished_archives_listed(tmp_path, data_root, monkeypatch, capsys):
    x, y = _npz(data_root / "digits/mnist_test.npz")
    monkeypatch.setattr(tvd, "MNIST", lambda root, train, download: SimpleNamespace(
        data=torch.from_numpy(x[:300, ..., 0].copy()), targets=torch.from_numpy(y[:300].copy())))
    monkeypatch.setitem(DL.EXPECTED_COUNTS, "digits/mnist_train", 300)
    monkeypatch.setitem(DL.EXPECTED_COUNTS, "digits/mnist_test", 300)
    monkeypatch.setattr(tvd, "USPS", _raise(RuntimeError("File not found or corrupted.")))
    root = tmp_path / "root"
    assert DL.main(["--root", str(root), "--only", "mnist,usps"]) == 2
    assert "USPS" in capsys.readouterr().err
    assert _files(root) == {"SHA256SUMS", "digits/mnist_train.npz", "digits/mnist_test.npz"}
    _assert_root_consistent(root)
    np.testing.assert_array_equal(load_archive(root, "digits/mnist_test")[0], x[:300])


def test_wrong_size_or_bad_pixels_are_refused(tmp_path, data_root, monkeypatch, capsys):
    x, y = _npz(data_root / "digits/mnist_test.npz")
    monkeypatch.setattr(tvd, "MNIST", lambda root, train, download: SimpleNamespace(
        data=torch.from_numpy(x[:300, ..., 0].copy()), targets=torch.from_numpy(y[:300].copy())))
    root = tmp_path / "root"
    assert DL.main(["--root", str(root), "--only", "mnist"]) == 2  # 300 images, not 60,000
    assert "60000" in capsys.readouterr().err
    monkeypatch.setattr(tvd, "MNIST", lambda root, train, download: SimpleNamespace(
        data=torch.full((3, 28, 28), 0.5), targets=torch.zeros(3, dtype=torch.int64)))
    assert DL.main(["--root", str(root), "--only", "mnist"]) == 2
    assert "converting torchvision's MNIST" in capsys.readouterr().err
    assert _files(root) == set()


def test_interrupted_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "digits" / "a.npz"
    x, y = np.zeros((2, 4, 4, 1), np.uint8), np.zeros(2, np.int64)
    digest = DL.write_npz_atomic(path, x, y)
    assert digest == _sha(path)
    old = path.read_bytes()

    def half_then_fail(f, **arrays):
        f.write(b"PK\x03\x04 half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(DL.np, "savez_compressed", half_then_fail)
    with pytest.raises(OSError):
        DL.write_npz_atomic(path, x + 1, y)
    assert path.read_bytes() == old
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.npz"]


@pytest.mark.slow
def test_cli_entry_point_bad_option(tmp_path):
    r = subprocess.run([sys.executable, "-m", "benchmark.download", "--root", str(tmp_path / "r"), "--only", "cifar10"],
                       cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.startswith("error: --only: unknown dataset 'cifar10'")
    assert not (tmp_path / "r").exists()
