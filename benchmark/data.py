"""Datasets as resident uint8 tensors: data root, checksums, loading, train/test splits, test sets.

Everything here follows PROTOCOL.md sections 1 and 2. Images are loaded once
from the npz archives of a data root, resized to the protocol's size (32x32 for
FPL, 64x64 for FedPLVM: the deterministic part of the reference transform), and
kept as uint8 tensors of shape N x 3 x S x S. The random part (crop, flip) and
the normalisation run on whole batches in `benchmark.transforms`.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmark.results import atomic_write

PROJECT_ROOT = Path(__file__).resolve().parent.parent

# domain -> (train archive stem, test archive stem); Office domains have one archive
DATASETS: dict[str, dict[str, tuple[str, str | None]]] = {
    "digits": {
        "mnist": ("digits/mnist_train", "digits/mnist_test"),
        "usps": ("digits/usps_train", "digits/usps_test"),
        "svhn": ("digits/svhn_train", "digits/svhn_test"),
        "syn": ("digits/syn_train", "digits/syn_test"),
    },
    "office_caltech": {
        "caltech": ("office_caltech10/caltech", None),
        "amazon": ("office_caltech10/amazon", None),
        "webcam": ("office_caltech10/webcam", None),
        "dslr": ("office_caltech10/dslr", None),
    },
    # FedPLVM's Digit-5 and Office-10 (PROTOCOL.md section 2): the same archives, its domain order (Digit-5's pooled
    # and split again as FedBN's files: TWO_ARCHIVE_SPLIT)
    "digit5": {
        "mnist": ("digits/mnist_train", "digits/mnist_test"),
        "svhn": ("digits/svhn_train", "digits/svhn_test"),
        "usps": ("digits/usps_train", "digits/usps_test"),
        "syn": ("digits/syn_train", "digits/syn_test"),
        "mnistm": ("digits/mnistm_train", "digits/mnistm_test"),
    },
    "mnist": {"mnist": ("digits/mnist_train", "digits/mnist_test")},  # FedProto's n-way k-shot MNIST (section 4)
    "office10": {
        "amazon": ("office_caltech10/amazon", None),
        "caltech": ("office_caltech10/caltech", None),
        "dslr": ("office_caltech10/dslr", None),
        "webcam": ("office_caltech10/webcam", None),
    },
}
# dataset -> domain -> what our archive is when it is not the paper's dataset (table reports print it)
STAND_INS: dict[str, dict[str, str]] = {
    "digit5": {"syn": "FPL's SYN (Roy et al. 2018, digits over natural-image backgrounds) stands in for FedPLVM's "
                      "SynthDigits (Ganin's SynNumbers, not available offline): not the paper's images "
                      "(docs/deviations.md, 19)"},
}
NUM_CLASSES = 10
IMAGE_SIZE = 32

HOW_TO_GET = {
    "digits/mnist": "run `make data` (torchvision download) or copy it from ../shared/data",
    "digits/usps": "run `make data` (torchvision download) or copy it from ../shared/data",
    "digits/svhn": (
        "run `make data` on a machine with internet (torchvision downloads the full SVHN), "
        "or leave svhn out with --domains"
    ),
    "digits/syn": "copy it from ../shared/data (SYN digits, Roy et al. 2018; see docs/running.md, Data)",
    "digits/mnistm": "copy it from ../shared/data (MNIST-M; see docs/running.md, Data)",
    "office_caltech10/": "copy it from ../shared/data (Office-Caltech-10; see docs/running.md, Data)",
}


class DataError(RuntimeError):
    """A data root, file or split is missing, corrupt or impossible. `domains_without`: for a missing domain, the
    run's other domains (empty when it has no other; None for other errors)."""

    def __init__(self, message: str, domains_without: list[str] | None = None):
        super().__init__(message)
        self.domains_without = domains_without


def _how_to_get(stem: str) -> str:
    for prefix, how in HOW_TO_GET.items():
        if stem.startswith(prefix):
            return how
    return "see docs/running.md, Data"


def resolve_data_root(cli_value: str | None = None) -> Path:
    """--data-root, then $BENCH_DATA_ROOT, then ./data, then ../shared/data."""
    candidates = []
    if cli_value:
        candidates.append(("--data-root", Path(cli_value)))
    elif os.environ.get("BENCH_DATA_ROOT"):
        candidates.append(("BENCH_DATA_ROOT", Path(os.environ["BENCH_DATA_ROOT"])))
    else:
        candidates += [("./data", Path("data")), ("../shared/data", PROJECT_ROOT.parent / "shared" / "data")]
    for origin, path in candidates:
        if (path / "SHA256SUMS").is_file():
            return path.resolve()
    tried = ", ".join(f"{p} ({o})" for o, p in candidates)
    raise DataError(
        f"no data root with a SHA256SUMS file found (tried {tried}). "
        "Pass --data-root DIR, set BENCH_DATA_ROOT, or run `make data` to fill ./data."
    )


# --------------------------------------------------------------------------- checksums

def _cache_file() -> Path:
    base = Path(os.environ.get("BENCH_CACHE_DIR", PROJECT_ROOT / ".cache"))
    return base / "verified_files.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_sums(path: Path) -> dict[str, str]:
    """A SHA256SUMS file as {relative path: hex digest}; empty when the file is absent."""
    sums = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                digest, name = line.split(maxsplit=1)
                sums[name.strip().lstrip("*")] = digest.lower()
    return sums


def verify_files(root: Path, relpaths: list[str]) -> None:
    """Check files against root/SHA256SUMS; verified files are cached by size and mtime."""
    sums = read_sums(root / "SHA256SUMS")
    cache_path = _cache_file()
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    changed = False
    for rel in relpaths:
        path = root / rel
        if rel not in sums:
            raise DataError(f"{path} is not listed in {root / 'SHA256SUMS'}; add its sha256 there "
                            "(`make data` writes it).")
        stat = path.stat()
        key = str(path.resolve())
        stamp = [stat.st_size, stat.st_mtime_ns, sums[rel]]
        if cache.get(key) == stamp:
            continue
        if sha256_file(path) != sums[rel]:
            raise DataError(
                f"{path} is corrupt: its sha256 does not match {root / 'SHA256SUMS'}. "
                f"Delete it and get it again: {_how_to_get(rel)}."
            )
        cache[key] = stamp
        changed = True
    if changed:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache_path, json.dumps(cache))


def archive_files(root: Path, stem: str) -> list[str]:
    """`stem.npz`, or `stem_part0.npz, stem_part1.npz, ...` in order; error if absent."""
    if (root / f"{stem}.npz").is_file():
        return [f"{stem}.npz"]
    parts, i = [], 0
    while (root / f"{stem}_part{i}.npz").is_file():
        parts.append(f"{stem}_part{i}.npz")
        i += 1
    if not parts:
        raise DataError(f"missing data file {root / stem}.npz (or {stem}_part0.npz ...): {_how_to_get(stem)}.")
    return parts


def load_archive(root: Path, stem: str) -> tuple[np.ndarray, np.ndarray]:
    """An archive's images and labels, arrays of the caller's own: each file decoded once per process while it is
    unchanged (`read_npz`)."""
    files = archive_files(root, stem)
    verify_files(root, files)
    parts = [read_npz(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
             for path, stat in ((root / rel, (root / rel).stat()) for rel in files)]
    return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts]).astype(np.int64)


@functools.lru_cache(maxsize=32)
def read_npz(path: str, size: int, mtime_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """One npz file's x and y, read-only, kept by path, size and modification time: a sweep's runs in one process
    (and a run's driver and client groups) read each file once instead of inflating it again for every run (0.2 to
    1 s a domain; 50 smoke runs of FedProto's table spent a third of their time so, 2026-12-02). At most 32 files: the
    shared data's 18 are 0.23 GB decoded."""
    with np.load(path, allow_pickle=False) as z:
        x, y = z["x"], z["y"]
    x.flags.writeable = y.flags.writeable = False
    return x, y


def to_tensor_images(x: np.ndarray, size: int = IMAGE_SIZE, channels: int = 3) -> torch.Tensor:
    """N x H x W x C uint8 -> N x channels x size x size uint8: grey repeated to 3 channels (kept as 1 with
    channels=1), Resize(size)."""
    t = torch.from_numpy(np.ascontiguousarray(x)).permute(0, 3, 1, 2)
    if t.shape[1] == 1 and channels == 3:
        t = t.expand(-1, 3, -1, -1)
    if t.shape[-2:] != (size, size):
        # bilinear with antialias: torchvision's tensor path of Resize, matching PIL's filter
        t = F.interpolate(t.float(), size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        t = t.round().clamp(0, 255).to(torch.uint8)
    return t.contiguous()


@dataclass
class Domain:
    """Raw train and test sets of one domain, labels as int64 numpy arrays."""

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray


def office_split(n: int) -> tuple[np.ndarray, np.ndarray]:
    """FPL's Office-Caltech split by ImageFolder position: train when i % 10 <= 7."""
    i = np.arange(n)
    return i[i % 10 <= 7], i[i % 10 > 7]


def shuffled_split(labels: np.ndarray, test_size: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A stratified shuffled train/test split, both in shuffled order (scikit-learn's StratifiedShuffleSplit, one
    fixed draw whatever the run's seed): FedPLVM's Office-10 reads FedBN's per-domain train and test files, an
    about 4:1 split that is not by file order; its clients then take the first 10 of each class of the train file,
    so of the shuffled order here (docs/deviations.md, 29). FedBN made its Digits files with this very call on each
    dataset's pooled labels (`pooled_split`, docs/deviations.md, 19)."""
    from sklearn.model_selection import StratifiedShuffleSplit

    return next(StratifiedShuffleSplit(n_splits=1, test_size=test_size, random_state=seed).split(labels, labels))


# how a dataset whose domains have one archive (Office) splits it into train and test
ONE_ARCHIVE_SPLIT = {"office_caltech": "position", "office10": "shuffled"}
# how a dataset whose domains have a train and a test archive makes its train and test sets when not as the archives
# are: "pooled" = FedBN's Digits files, which FedPLVM reads (its utils/dataset.py; docs/deviations.md, 19): the train
# archive then the test archive pooled, one `shuffled_split` of the pooled labels (FedBN's utils/data_preprocess.py,
# `stratified_split` in each `process_*`), the train part cut to the first `FEDBN_TRAIN_READ`. A run records it
# (`RunConfig.data_split`, a protocol key): runs made before it existed used the archives as they are.
TWO_ARCHIVE_SPLIT = {"digit5": "pooled"}
# FedBN's `split` cuts a train part into ten partitions of 743.8 images (`train_part{0..9}.pkl`, the first
# int(743.8 * 10) of its shuffled order) and FedPLVM's default `--percent 1` reads and concatenates all ten: a
# domain's training set is that prefix (the whole train part of USPS, the smallest domain)
FEDBN_TRAIN_READ = int(743.8 * 10)


def pooled_split(train_labels: np.ndarray, test_labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FedBN's Digits split as indices into the pool (the train archive, then the test archive): one fixed
    stratified shuffled 80/20 split of the pooled labels (`shuffled_split`), both parts in shuffled order; the
    training set FedPLVM reads is the train part's first `FEDBN_TRAIN_READ` (`load_domain`)."""
    return shuffled_split(np.concatenate([train_labels, test_labels]))


def first_per_class(labels: np.ndarray, k) -> np.ndarray:
    """Indices (ascending) of the first k samples of every class in archive order (all of a class with fewer); k a
    number, or one per class (indexed by the class)."""
    ks = np.asarray(k)
    return np.sort(np.concatenate([np.flatnonzero(labels == c)[:int(ks if ks.ndim == 0 else ks[c])]
                                   for c in np.unique(labels)] + [np.zeros(0, np.int64)]))


def load_domain(root: Path, dataset: str, domain: str, need_test: bool = True, need_train: bool = True,
                per_class: tuple | None = None) -> Domain:
    """A domain's train and test sets. A domain with one archive (Office) is split by position (`office_split`,
    FPL's) or by a stratified shuffle (`shuffled_split`, FedPLVM's), as `ONE_ARCHIVE_SPLIT` says; a domain with
    two is its archives, or their pool split again (`pooled_split`, FedPLVM's Digit-5) as `TWO_ARCHIVE_SPLIT` says,
    its test set then in shuffled order and its training set the first `FEDBN_TRAIN_READ` of the train part's
    shuffled order. `per_class` = (k_train, k_test) keeps the first k of each class of each set (FedPLVM's
    protocol); each k a number or one per class (a per-class protocol's several clients, or its Dirichlet label
    skew: `benchmark.partition.load_counts`)."""
    train_stem, test_stem = DATASETS[dataset][domain]
    if test_stem is None:  # one archive, split in two
        x, y = load_archive(root, train_stem)
        tr, te = office_split(len(y)) if ONE_ARCHIVE_SPLIT[dataset] == "position" else shuffled_split(y)
        dom = Domain(domain, x[tr], y[tr], x[te], y[te])
    elif TWO_ARCHIVE_SPLIT.get(dataset) == "pooled":  # both archives even for one set: the split reads every label
        (x_tr, y_tr), (x_te, y_te) = load_archive(root, train_stem), load_archive(root, test_stem)
        tr, te = pooled_split(y_tr, y_te)
        x, y = np.concatenate([x_tr, x_te]), np.concatenate([y_tr, y_te])
        tr = tr[:FEDBN_TRAIN_READ]
        dom = Domain(domain, x[tr], y[tr], x[te], y[te])
    else:
        empty = (np.zeros((0, IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8), np.zeros(0, np.int64))
        train = load_archive(root, train_stem) if need_train else empty
        test = load_archive(root, test_stem) if need_test else empty
        dom = Domain(domain, *train, *test)
    if per_class is not None:
        tr, te = first_per_class(dom.train_y, per_class[0]), first_per_class(dom.test_y, per_class[1])
        dom = Domain(domain, dom.train_x[tr], dom.train_y[tr], dom.test_x[te], dom.test_y[te])
    return dom


def check_domains_present(root: Path, dataset: str, domains: list[str]) -> dict[str, str]:
    """Fail before any training when a needed archive is absent or corrupt; returns the verified files'
    sha256 digests (relative path -> hex digest, from SHA256SUMS)."""
    files = []
    for d in domains:
        try:
            files += [f for stem in DATASETS[dataset][d] if stem is not None for f in archive_files(root, stem)]
        except DataError as e:
            others = [x for x in domains if x != d]
            raise DataError(f"{e} Without {d}: --domains {','.join(others)}." if others else str(e),
                            domains_without=others) from None  # a sweep's own hint names them
    verify_files(root, files)
    sums = read_sums(root / "SHA256SUMS")
    return {rel: sums[rel] for rel in files}


def eval_subset(n: int, cap: int | None) -> np.ndarray:
    """All test indices, or a fixed (seed 0) random subset of `cap` of them, in order."""
    if cap is None or cap >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(0).permutation(n)[:cap])


def domain_test_set(dom: Domain, spec, eval_max: int | None,
                    cap: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A domain's test images (uint8, at `spec`'s image size and channels) and labels as a run evaluates them:
    all, or the fixed subset `eval_subset` keeps under `eval_max`; `cap` keeps a further fixed subset of those."""
    keep = eval_subset(len(dom.test_y), eval_max)
    if cap is not None:
        keep = keep[eval_subset(len(keep), cap)]
    return to_tensor_images(dom.test_x[keep], spec.image_size, spec.channels), torch.from_numpy(dom.test_y[keep])
