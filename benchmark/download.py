"""Fill a data root: MNIST, USPS and SVHN through torchvision's downloaders, the rest copied.

    python -m benchmark.download --root data                  # `make data`; needs internet
    python -m benchmark.download --root data --copy-from ../shared/data
    python -m benchmark.download --root data --only mnist,usps

A data root holds npz archives with `x` (uint8, N x H x W x C) and `y` (int64,
labels 0..9), each listed with its sha256 in `<root>/SHA256SUMS`
(`<hex digest>  <relative path>` per line); `benchmark.data` reads it.

* MNIST, USPS and SVHN are downloaded by torchvision into `<root>/.downloads`
  (its raw files, reused on the next run) and converted: MNIST N x 28 x 28 x 1,
  USPS N x 16 x 16 x 1, SVHN N x 32 x 32 x 3, all in the official order.
* SYN and Office-Caltech-10 cannot be downloaded by torchvision. For each one
  missing from the root the script says where it comes from; `--copy-from DIR`
  copies them (and any other archive the benchmark uses that the root lacks)
  from another data root such as ../shared/data, checking each file's sha256
  against DIR/SHA256SUMS.

Archives already in the root are left alone (delete one to fetch it again).
Every npz and SHA256SUMS is written to a temporary file and renamed into
place, so an interrupted or failed run leaves no half-written file. Any
failure prints one `error:` line saying what failed and what to do, and exits
with status 2.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
from pathlib import Path

import numpy as np

from benchmark.data import DATASETS, PROJECT_ROOT, DataError, archive_files, read_sums, sha256_file
from benchmark.protocols import unknown_name
from benchmark.results import atomic_write

SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"
CACHE_DIRNAME = ".downloads"

# every domain of the benchmark -> its archive stems (train, test; Office: one)
DOMAIN_STEMS: dict[str, list[str]] = {
    domain: [s for s in stems if s is not None]
    for group in DATASETS.values()
    for domain, stems in group.items()
}
DOWNLOADABLE = ("mnist", "usps", "svhn")
ALIASES = {
    "digits": list(DATASETS["digits"]),
    "office": list(DATASETS["office_caltech"]),
    "office_caltech": list(DATASETS["office_caltech"]),
    "office_caltech10": list(DATASETS["office_caltech"]),
}
# official sizes; a download that converts to another size is refused
EXPECTED_COUNTS = {
    "digits/mnist_train": 60_000,
    "digits/mnist_test": 10_000,
    "digits/usps_train": 7_291,
    "digits/usps_test": 2_007,
    "digits/svhn_train": 73_257,
    "digits/svhn_test": 26_032,
}
IMAGE_SHAPES = {"mnist": (28, 28, 1), "usps": (16, 16, 1), "svhn": (32, 32, 3)}

WHERE_FROM = {
    "syn": (
        "SYN is the synthetic digits of Roy et al. 2018 that FPL, FCCL and FedHEAL use as `syn/train` "
        "(-> digits/syn_train) and `syn/val` (-> digits/syn_test); get them by the data instructions of "
        "FPL's code (github.com/WenkeHuang/RethinkFL) and store them resized to 32x32 as x uint8 "
        "N x 32 x 32 x 3, y int64"
    ),
    "office": (
        "Office-Caltech-10 is the 10 classes shared by Office-31 (amazon, webcam, dslr) and Caltech-256 "
        "(caltech), as assembled by Gong et al. 2012; store one archive per domain, "
        "office_caltech10/<domain>.npz, images in ImageFolder order (class folders sorted, files sorted)"
    ),
}


class DownloadError(RuntimeError):
    """Something could not be fetched, converted, copied or written; the message says what to do."""


# --------------------------------------------------------------------------- conversion

def _numpy(a) -> np.ndarray:
    """A torch tensor, numpy array or list as a numpy array (no copy where possible)."""
    if hasattr(a, "detach"):  # torch.Tensor
        return a.detach().cpu().numpy()
    return np.asarray(a)


def _labels(targets, what: str) -> np.ndarray:
    y = _numpy(targets)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"{what}: labels should be a 1-d integer array, got shape {y.shape} dtype {y.dtype}")
    y = y.astype(np.int64)
    if len(y) and (y.min() < 0 or y.max() > 9):
        raise ValueError(f"{what}: labels should lie in 0..9, got {y.min()}..{y.max()}")
    return y


def _uint8_exact(a: np.ndarray, what: str) -> np.ndarray:
    """uint8 as is; other dtypes only if every value is an integer in 0..255 (no rounding, no truncation)."""
    if a.dtype == np.uint8:
        return a
    if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise ValueError(f"{what}: pixels of dtype {a.dtype} cannot be converted to uint8")
    if a.size and (not np.all(np.isfinite(a)) or a.min() < 0 or a.max() > 255 or not np.array_equal(a, np.round(a))):
        raise ValueError(f"{what}: pixels of dtype {a.dtype} are not whole numbers in 0..255; refusing to round them")
    return a.astype(np.uint8)


def _check(x: np.ndarray, y: np.ndarray, shape: tuple[int, int, int], what: str) -> tuple[np.ndarray, np.ndarray]:
    if x.shape[1:] != shape:
        raise ValueError(f"{what}: images converted to shape {x.shape[1:]}, expected {shape}")
    if len(x) != len(y):
        raise ValueError(f"{what}: {len(x)} images but {len(y)} labels")
    return np.ascontiguousarray(x), y


def convert_mnist(dataset) -> tuple[np.ndarray, np.ndarray]:
    """torchvision MNIST (`.data` uint8 tensor N x 28 x 28, `.targets` int64 tensor) -> (N x 28 x 28 x 1, N)."""
    x = _uint8_exact(_numpy(dataset.data), "MNIST")
    if x.ndim != 3:
        raise ValueError(f"MNIST: expected .data of shape N x 28 x 28, got {x.shape}")
    return _check(x[..., None], _labels(dataset.targets, "MNIST"), IMAGE_SHAPES["mnist"], "MNIST")


def convert_usps(dataset) -> tuple[np.ndarray, np.ndarray]:
    """torchvision USPS (`.data` numpy N x 16 x 16, `.targets` list of ints 0..9) -> (N x 16 x 16 x 1, N).

    torchvision (0.19 to 0.29) already stores `.data` as uint8: it maps the
    libsvm values v in [-1, 1] to `((v + 1) / 2 * 255).astype(uint8)` itself and
    builds the PIL 'L' image from that array at __getitem__. Those bytes are
    kept exactly; a float array is accepted only if its values are whole
    numbers in 0..255.
    """
    x = _numpy(dataset.data)
    if x.ndim == 2 and x.shape[1] == 256:
        x = x.reshape(-1, 16, 16)
    if x.ndim != 3:
        raise ValueError(f"USPS: expected .data of shape N x 16 x 16, got {x.shape}")
    x = _uint8_exact(x, "USPS")
    return _check(x[..., None], _labels(dataset.targets, "USPS"), IMAGE_SHAPES["usps"], "USPS")


def convert_svhn(dataset) -> tuple[np.ndarray, np.ndarray]:
    """torchvision SVHN (`.data` uint8 numpy N x 3 x 32 x 32, `.labels` int64 0..9) -> (N x 32 x 32 x 3, N).

    torchvision maps SVHN's label 10 (the digit 0) to 0 already; labels still in
    1..10 (an older or other loader) are mapped the same way here.
    """
    x = _numpy(dataset.data)
    if x.ndim != 4 or x.shape[1] != 3:
        raise ValueError(f"SVHN: expected .data of shape N x 3 x 32 x 32, got {x.shape}")
    x = _uint8_exact(x, "SVHN").transpose(0, 2, 3, 1)
    y = _numpy(dataset.labels).reshape(-1)
    if len(y) and np.issubdtype(y.dtype, np.integer) and y.min() >= 1 and y.max() == 10:
        y = np.where(y == 10, 0, y)
    return _check(x, _labels(y, "SVHN"), IMAGE_SHAPES["svhn"], "SVHN")


CONVERTERS = {"mnist": convert_mnist, "usps": convert_usps, "svhn": convert_svhn}


# --------------------------------------------------------------------------- torchvision

def _one_line(e: BaseException, limit: int = 240) -> str:
    text = re.sub(r"\s+", " ", f"{type(e).__name__}: {e}").strip()
    return text if len(text) <= limit else text[: limit - 4] + " ..."


def _usps_raw_file(cache: Path, train: bool) -> tuple[Path, str]:
    from torchvision.datasets import USPS

    _, filename, md5 = USPS.split_list["train" if train else "test"]
    return cache / "USPS" / filename, md5


def fetch(domain: str, split: str, cache: Path):
    """The torchvision dataset object of one split ('train' or 'test'), downloaded into `cache` if needed."""
    import torchvision.datasets as tvd

    train = split == "train"
    if domain == "mnist":
        return tvd.MNIST(str(cache), train=train, download=True)  # raw files under cache/MNIST/raw
    if domain == "usps":
        try:
            return tvd.USPS(str(cache / "USPS"), train=train, download=True)
        except Exception:
            # torchvision's USPS skips the download whenever the file exists, so a partial
            # download would fail forever: drop it if its md5 is wrong, then try once more
            from torchvision.datasets.utils import check_integrity

            path, md5 = _usps_raw_file(cache, train)
            if not path.is_file() or check_integrity(str(path), md5):
                raise
            path.unlink()
            return tvd.USPS(str(cache / "USPS"), train=train, download=True)
    if domain == "svhn":
        return tvd.SVHN(str(cache / "SVHN"), split=split, download=True)
    raise ValueError(f"{domain} cannot be downloaded by torchvision")


# --------------------------------------------------------------------------- files

def _tmp_path(path: Path) -> Path:
    # not ending in .npz, so a leftover from a killed run is never taken for an archive
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def _replace_from(tmp: Path, path: Path) -> None:
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_npz_atomic(path: Path, x: np.ndarray, y: np.ndarray) -> str:
    """Write x, y to `path` through a temporary file and a rename; return the file's sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(path)
    try:
        with open(tmp, "wb") as f:  # a file object: numpy adds no .npz suffix
            np.savez_compressed(f, x=x, y=y)
        digest = sha256_file(tmp)
        _replace_from(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return digest


def write_sums(root: Path, sums: dict[str, str]) -> None:
    """Write `<root>/SHA256SUMS` (sorted, `<digest>  <path>`) through a temporary file and a rename."""
    atomic_write(root / "SHA256SUMS", "".join(f"{sums[rel]}  {rel}\n" for rel in sorted(sums)))


SVHN_FIRST_1083 = "digits/svhn_train_first1083.npz"


def root_with_svhn(src: Path, dst: Path, train: np.ndarray, test: np.ndarray) -> Path:
    """A data root at `dst` with every file `src`'s SHA256SUMS lists (symlinked) and a Digits SVHN made of rows of
    the 1,083 SVHN training images `src` holds (`SVHN_FIRST_1083`): rows `train` as `digits/svhn_train.npz`, rows
    `test` as `digits/svhn_test.npz` (`np.savez`), listed in its SHA256SUMS. The full SVHN is not offline: the
    tests' four-domain Digits root and the probes' root (tools/svhn_data_root.py) are made this way."""
    dst.mkdir(parents=True, exist_ok=True)
    sums = read_sums(src / "SHA256SUMS")
    for rel in sums:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).symlink_to(src / rel)
    with np.load(src / SVHN_FIRST_1083) as z:
        x, y = z["x"], z["y"]
    for rel, rows in (("digits/svhn_train.npz", train), ("digits/svhn_test.npz", test)):
        np.savez(dst / rel, x=x[rows], y=y[rows])
        sums[rel] = sha256_file(dst / rel)
    write_sums(dst, sums)
    return dst


def npz_files(root: Path) -> list[str]:
    """Relative paths of every *.npz under root, hidden folders (.downloads) left out."""
    if not root.is_dir():
        return []
    out = []
    for p in root.rglob("*.npz"):
        rel = p.relative_to(root)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts):
            out.append(rel.as_posix())
    return sorted(out)


def present(root: Path, stem: str) -> bool:
    try:
        archive_files(root, stem)
        return True
    except DataError:
        return False


class Root:
    """A data root being filled; SHA256SUMS is rewritten after every archive written into it."""

    def __init__(self, path: Path):
        self.path = path
        self.sums = read_sums(path / "SHA256SUMS")
        self.written: list[str] = []
        self.copy_from: Path | None = None

    def record(self, rel: str, digest: str) -> None:
        self.sums[rel] = digest
        self.written.append(rel)
        write_sums(self.path, {r: d for r, d in self.sums.items() if (self.path / r).is_file()})

    def finish(self) -> list[str]:
        """List every *.npz under root (unlisted ones hashed now), drop entries of absent files."""
        files = npz_files(self.path)
        new = {rel: self.sums[rel] if rel in self.sums else sha256_file(self.path / rel) for rel in files}
        added = sorted(set(files) - set(self.sums))
        sums_file = self.path / "SHA256SUMS"
        if new != read_sums(sums_file) and (new or sums_file.is_file()):
            write_sums(self.path, new)
        self.sums = new
        return added


# --------------------------------------------------------------------------- steps

def copy_archives(src: Path, root: Root, domains: list[str]) -> list[str]:
    """Copy (never link) the archives of `domains` that root lacks and src has, sha256-checked."""
    src_sums_path = src / "SHA256SUMS"
    if not src_sums_path.is_file():
        raise DownloadError(f"--copy-from {src}: no SHA256SUMS there, so its files cannot be verified; "
                            "pass a data root such as ../shared/data.")
    if src.resolve() == root.path.resolve():
        raise DownloadError(f"--copy-from {src} is the data root itself; pass another data root.")
    src_sums = read_sums(src_sums_path)
    copied = []
    for domain in domains:
        for stem in DOMAIN_STEMS[domain]:
            try:
                files = archive_files(src, stem)
            except DataError:
                continue  # src lacks it too; downloads and notes deal with it
            have = archive_files(root.path, stem) if present(root.path, stem) else []
            # present in root: leave it, unless root holds only the first parts of a split src has more of
            if have and not (set(have) < set(files) and all("_part" in r for r in have)):
                continue
            for rel in files:
                if (root.path / rel).is_file():
                    continue
                if rel not in src_sums:
                    raise DownloadError(f"cannot copy {src / rel}: it is not listed in {src_sums_path}, "
                                        "so it cannot be verified; fix that data root or copy from another.")
                dst = root.path / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                tmp = _tmp_path(dst)
                try:
                    h = hashlib.sha256()
                    with open(src / rel, "rb") as fin, open(tmp, "wb") as fout:
                        for chunk in iter(lambda: fin.read(1 << 20), b""):
                            h.update(chunk)
                            fout.write(chunk)
                    if h.hexdigest() != src_sums[rel]:
                        raise DownloadError(
                            f"cannot copy {src / rel}: its sha256 does not match {src_sums_path} (the source file is "
                            "corrupt or the list is stale); nothing was copied for it. Fix that data root or copy "
                            "from another.")
                    _replace_from(tmp, dst)
                finally:
                    tmp.unlink(missing_ok=True)
                root.record(rel, h.hexdigest())
                copied.append(rel)
                print(f"copied {rel} from {src} (sha256 checked)")
    return copied


def download_domain(domain: str, root: Root, selected: list[str]) -> list[str]:
    """Download and convert the missing splits of one torchvision domain; return what was written."""
    written = []
    for stem in DOMAIN_STEMS[domain]:
        if present(root.path, stem):
            print(f"{stem}.npz is already in {root.path}; left as it is (delete it to download it again)")
            continue
        split = "train" if stem.endswith("_train") else "test"
        name = {"mnist": "MNIST", "usps": "USPS", "svhn": "SVHN"}[domain]
        cache = root.path / CACHE_DIRNAME
        cache.mkdir(parents=True, exist_ok=True)
        print(f"downloading {name} {split} with torchvision into {cache} ...", flush=True)
        try:
            dataset = fetch(domain, split, cache)
        except ImportError as e:
            raise DownloadError(
                f"torchvision's {name} loader needs a module that is missing ({_one_line(e)}); "
                "install it into the venv (SVHN needs scipy: .venv/bin/pip install scipy) and run again.") from None
        except Exception as e:  # network, md5 mismatch, truncated file, ...
            rest = _only_text([d for d in selected if d != domain])
            leave_out = f"leave {domain} out" + (f" with --only {rest}" if rest else "")
            if root.copy_from is not None:
                offline = f"{root.copy_from} (--copy-from) does not hold {stem}.npz either; or {leave_out}"
            elif domain == "svhn":
                offline = f"there is no offline copy of the full SVHN (../shared/data lacks it), so offline {leave_out}"
            else:
                offline = (f"without internet, copy the archives from another data root instead: "
                           f"python -m benchmark.download --root {root.path} --copy-from ../shared/data")
            raise DownloadError(
                f"downloading {name} ({split} split) with torchvision failed ({_one_line(e)}). "
                f"It needs internet access: check the connection or proxy and run again (raw files already "
                f"downloaded are kept in {cache}); {offline}."
            ) from None
        try:
            x, y = CONVERTERS[domain](dataset)
        except ValueError as e:
            raise DownloadError(f"converting torchvision's {name} {split} failed: {e}. The torchvision version "
                                "may store it differently; use a torchvision within the project's pins.") from None
        expected = EXPECTED_COUNTS.get(stem)
        if expected is not None and len(y) != expected:
            raise DownloadError(f"torchvision's {name} {split} has {len(y)} images, the official split has {expected}; "
                                f"delete {cache} and run again.")
        rel = f"{stem}.npz"
        try:
            digest = write_npz_atomic(root.path / rel, x, y)
        except OSError as e:
            raise DownloadError(f"writing {root.path / rel} failed: {_one_line(e)}; free some space or fix the "
                                "folder's permissions and run again.") from None
        root.record(rel, digest)
        written.append(rel)
        print(f"wrote {rel}: x {x.shape} uint8, y {y.shape} int64")
    return written


def notes_for_missing(root: Path, domains: list[str], copy_from: Path | None) -> list[str]:
    """Where SYN and Office-Caltech-10 come from, for those selected and still missing from root."""
    notes = []
    syn_missing = "syn" in domains and not all(present(root, s) for s in DOMAIN_STEMS["syn"])
    office = [d for d in DATASETS["office_caltech"] if d in domains]
    office_missing = [d for d in office if not present(root, DOMAIN_STEMS[d][0])]
    shared = SHARED_DATA if SHARED_DATA.is_dir() else Path("../shared/data")
    if copy_from is not None:
        how = (f"--copy-from {copy_from} does not hold it either; copy it from a data root that does "
               f"(on these machines {shared})")
    else:
        how = (f"On these machines a verified copy is in {shared}: "
               f"python -m benchmark.download --root {root} --copy-from {shared}")
    if syn_missing:
        notes.append(f"SYN (digits/syn_train, digits/syn_test) is not in {root}; torchvision cannot download it. "
                     f"{WHERE_FROM['syn']}. {how}")
    if office_missing:
        notes.append(f"Office-Caltech-10 ({', '.join(office_missing)}) is not in {root}; torchvision cannot "
                     f"download it. {WHERE_FROM['office']}. {how}")
    return notes


# --------------------------------------------------------------------------- entry point

def _only_text(domains: list[str]) -> str:
    """Domains as an --only value, the four Office domains written as `office`."""
    office = list(DATASETS["office_caltech"])
    if all(d in domains for d in office):
        domains = [d for d in domains if d not in office] + ["office"]
    return ",".join(domains)


def parse_only(text: str | None) -> list[str]:
    if not text:
        return list(DOMAIN_STEMS)
    chosen: list[str] = []
    for name in (n.strip().lower() for n in text.split(",")):
        if not name:
            continue
        names = ALIASES.get(name, [name])
        for n in names:
            if n not in DOMAIN_STEMS:
                raise DownloadError(f"--only: {unknown_name('dataset', name, [*DOMAIN_STEMS, *ALIASES])}")
            if n not in chosen:
                chosen.append(n)
    if not chosen:
        raise DownloadError("--only names no dataset.")
    return chosen


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmark.download",
        description="Fill a data root: MNIST, USPS, SVHN by torchvision download (needs internet); SYN and "
                    "Office-Caltech-10 (and anything else missing) copied with --copy-from from another data root.",
    )
    p.add_argument("--root", default="data", help="data root to fill (default: data)")
    p.add_argument("--only", default=None, metavar="NAMES",
                   help="comma-separated subset: mnist, usps, svhn, syn, caltech, amazon, webcam, dslr, "
                        "or digits / office (default: all)")
    p.add_argument("--copy-from", default=None, metavar="DIR",
                   help="another data root (with SHA256SUMS), e.g. ../shared/data: copy the archives the root "
                        "lacks from it, sha256-checked, before downloading")
    return p


def run(args: argparse.Namespace) -> None:
    domains = parse_only(args.only)
    root = Root(Path(args.root))
    if root.path.exists() and not root.path.is_dir():
        raise DownloadError(f"--root {root.path} is not a folder.")
    copy_from = Path(args.copy_from) if args.copy_from else None
    if copy_from is not None:
        if not copy_from.is_dir():
            raise DownloadError(f"--copy-from {copy_from}: no such folder.")
        root.copy_from = copy_from
        copy_archives(copy_from, root, domains)
    for domain in DOWNLOADABLE:
        if domain in domains:
            download_domain(domain, root, domains)
    added = root.finish()
    for rel in added:
        print(f"listed {rel} in SHA256SUMS (it was in the root but not listed)")
    for note in notes_for_missing(root.path, domains, copy_from):
        print(f"note: {note}")
    if root.sums:
        print(f"{root.path}/SHA256SUMS lists {len(root.sums)} archives")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except (DownloadError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # disk full, permissions, ... while copying or writing
        print(f"error: {_one_line(e)}; nothing half-written was left behind. Fix the cause and run again.",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
