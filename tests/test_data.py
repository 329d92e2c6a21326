"""Data layer: partitions of the paper's presets, data root resolution, checksums, resize, Office split.

Real data from ../shared/data throughout (fixtures `data_root`, `full_digits_root`).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF

from benchmark import data as D
from benchmark.data import DataError, office_split, resolve_data_root, to_tensor_images
from benchmark.partition import fill_by_swap, partition_domain, plan_clients
from benchmark.protocols import DATASET_SPECS, SPLITS, reference_random_split
from ray_jobs.config import RunConfig

# hand-known training set sizes (README of the shared data; Office by the i % 10 <= 7 rule)
DIGITS_TRAIN = {"mnist": 60_000, "usps": 7_291, "syn": 10_000, "svhn": 73_257}
OFFICE_ALL = {"caltech": 1_123, "amazon": 958, "webcam": 295, "dslr": 157}
OFFICE_TRAIN = {"caltech": 899, "amazon": 768, "webcam": 237, "dslr": 127}  # 8 of every 10, plus min(rest, 8)
# int(pct * train): 1% of digits, 20% of Office's train split
DIGITS_PER_CLIENT = {"mnist": 600, "usps": 72, "syn": 100, "svhn": 732}
OFFICE_PER_CLIENT = {"caltech": 179, "amazon": 153, "webcam": 47, "dslr": 25}


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BENCH_DATA_ROOT", raising=False)


def _labels(root: Path, *rels: str) -> np.ndarray:
    return np.concatenate([np.load(root / r, allow_pickle=False)["y"] for r in rels])


def _office_train_labels(root: Path, domain: str) -> np.ndarray:
    y = _labels(root, f"office_caltech10/{domain}.npz")
    return y[np.arange(len(y)) % 10 <= 7]


def _by_domain(clients):
    out = {}
    for c in clients:
        out.setdefault(c["domain"], []).append(c)
    return out


# --------------------------------------------------------------------------- partitions

def test_hand_computed_sizes_match_the_files(data_root):
    assert len(_labels(data_root, "digits/mnist_train.npz")) == DIGITS_TRAIN["mnist"]
    assert len(_labels(data_root, "digits/usps_train.npz")) == DIGITS_TRAIN["usps"]
    assert len(_labels(data_root, "digits/syn_train_part0.npz", "digits/syn_train_part1.npz")) == DIGITS_TRAIN["syn"]
    for d in OFFICE_ALL:
        assert len(_labels(data_root, f"office_caltech10/{d}.npz")) == OFFICE_ALL[d]
        assert len(_office_train_labels(data_root, d)) == OFFICE_TRAIN[d]


@pytest.mark.parametrize("preset", ["code", "paper"])
def test_digits_partition_counts(data_root, preset):
    split = SPLITS["digits"][preset]
    expected_split = {"code": {"mnist": 6, "usps": 4, "svhn": 3, "syn": 7},
                      "paper": {"mnist": 3, "usps": 7, "svhn": 6, "syn": 4}}[preset]
    assert split == expected_split
    assert DATASET_SPECS["digits"].client_pct == 0.01
    domains = {d: split[d] for d in ("mnist", "usps", "syn")}  # no full SVHN in the shared data
    clients = plan_clients(data_root, "digits", domains, DATASET_SPECS["digits"].client_pct, seed=0)
    assert [c["id"] for c in clients] == list(range(sum(domains.values())))
    assert [c["domain"] for c in clients] == [d for d, n in domains.items() for _ in range(n)]
    for d, cs in _by_domain(clients).items():
        assert len(cs) == split[d]
        assert all(c["num_samples"] == len(c["indices"]) == DIGITS_PER_CLIENT[d] for c in cs)
        pooled = np.concatenate([c["indices"] for c in cs])
        assert len(np.unique(pooled)) == len(pooled)  # no sample shared by two clients
        assert pooled.min() >= 0 and pooled.max() < DIGITS_TRAIN[d]
    # SVHN at its real training size (73,257): 732 per client
    shards = partition_domain(np.zeros(DIGITS_TRAIN["svhn"], dtype=np.int64), split["svhn"], 0.01, [0, 2])
    assert [len(s) for s in shards] == [732] * split["svhn"]
    pooled = np.concatenate(shards)
    assert len(np.unique(pooled)) == len(pooled) and pooled.max() < DIGITS_TRAIN["svhn"]


def rethinkfl_draw(dataset: str, seed: int) -> dict[str, int]:
    """RethinkFL's utils/training.py with --rand_dataset, re-implemented on numpy's global stream as there:
    np.random.seed(seed), then np.random.choice over the domain names, redrawn while a domain has > 10."""
    from collections import Counter

    domains = {"digits": ["mnist", "usps", "svhn", "syn"],
               "office_caltech": ["caltech", "amazon", "webcam", "dslr"]}[dataset]
    saved = np.random.get_state()
    try:
        np.random.seed(seed)
        while True:
            if dataset == "office_caltech":  # parti_num 10: 6 drawn, plus one of each domain
                chosen = list(np.random.choice(domains, size=10 - 4, replace=True, p=None)) + domains
            else:  # parti_num 20
                chosen = np.random.choice(domains, size=20, replace=True, p=None)
            result = dict(Counter(chosen))
            if all(v <= 10 for v in result.values()):
                return {d: int(result.get(d, 0)) for d in domains}
    finally:
        np.random.set_state(saved)


@pytest.mark.parametrize("dataset", ["digits", "office_caltech"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_split_draws_as_rethinkfl(dataset, seed):
    cfg = RunConfig(method="fedavg", dataset=dataset, split="random", seed=seed)
    assert cfg.clients_per_domain == rethinkfl_draw(dataset, seed)
    assert cfg.run_name == f"fedavg-{dataset}-random-seed{seed}"
    if seed == 0:  # seed 0 draws the fixed preset of the code
        assert cfg.clients_per_domain == SPLITS[dataset][{"digits": "code", "office_caltech": "default"}[dataset]]
    else:  # and other seeds other splits
        assert cfg.clients_per_domain != rethinkfl_draw(dataset, 0)
    assert sum(cfg.clients_per_domain.values()) == {"digits": 20, "office_caltech": 10}[dataset]


def test_random_split_values_seeds_1_2():
    assert reference_random_split("digits", 1) == {"mnist": 7, "usps": 6, "svhn": 2, "syn": 5}
    assert reference_random_split("digits", 2) == {"mnist": 4, "usps": 3, "svhn": 4, "syn": 9}
    assert reference_random_split("office_caltech", 1) == {"caltech": 3, "amazon": 3, "webcam": 1, "dslr": 3}
    assert reference_random_split("office_caltech", 2) == {"caltech": 3, "amazon": 2, "webcam": 2, "dslr": 3}
    # the default stays the fixed preset whatever the seed; --domains keeps the drawn counts of the others
    assert RunConfig(dataset="digits", seed=2).clients_per_domain == SPLITS["digits"]["code"]
    assert RunConfig(dataset="digits", split="random", seed=2, domains=["usps", "syn"]).clients_per_domain == {
        "usps": 3, "syn": 9}


def test_digits_four_domains_with_small_svhn(full_digits_root):
    # full_digits_root's SVHN train holds 800 images: int(0.01 * 800) = 8 per client
    clients = plan_clients(full_digits_root, "digits", SPLITS["digits"]["code"], 0.01, seed=3)
    counts = {d: [c["num_samples"] for c in cs] for d, cs in _by_domain(clients).items()}
    assert counts == {"mnist": [600] * 6, "usps": [72] * 4, "svhn": [8] * 3, "syn": [100] * 7}


def test_client_fraction_scales_counts(data_root):
    clients = plan_clients(data_root, "digits", {"mnist": 2, "usps": 2}, 0.01, seed=0, fraction=0.05)
    # int(0.05 * 600) = 30, int(0.05 * 72) = 3
    assert [c["num_samples"] for c in clients] == [30, 30, 3, 3]


def test_office_partition_counts_and_fill(data_root):
    """Every Office client keeps int(0.2 N) samples and holds all 10 classes (RethinkFL's swap)."""
    split = SPLITS["office_caltech"]["default"]
    assert split == {"caltech": 3, "amazon": 2, "webcam": 1, "dslr": 4}
    assert DATASET_SPECS["office_caltech"].client_pct == 0.2
    swapped = 0
    for seed in (0, 1):
        clients = plan_clients(data_root, "office_caltech", split, 0.2, seed=seed)
        order = list(D.DATASETS["office_caltech"])
        for d, cs in _by_domain(clients).items():
            assert len(cs) == split[d]
            labels = _office_train_labels(data_root, d)
            for c in cs:
                idx = np.asarray(c["indices"])
                assert c["num_samples"] == len(idx) == len(np.unique(idx)) == OFFICE_PER_CLIENT[d]
                assert set(labels[idx].tolist()) == set(range(10))  # every class present
                assert idx.min() >= 0 and idx.max() < OFFICE_TRAIN[d]
            # the first client's draw before the fill: the same partition without it
            drawn = partition_domain(labels, split[d], 0.2, [seed, order.index(d)])[0]
            first = np.asarray(cs[0]["indices"])
            missing = set(range(10)) - set(labels[drawn].tolist())
            added, removed = np.setdiff1d(first, drawn), np.setdiff1d(drawn, first)
            assert len(added) == len(removed) == len(missing)  # one swap per missing class
            assert sorted(labels[added].tolist()) == sorted(missing)
            swapped += len(missing)
    assert swapped  # the dslr clients (25 images, 10 classes) do miss classes


def test_fill_by_swap_constructed_case():
    """Classes 0 x3, 1 x1 held, 2 and 3 missing: each missing class comes in for a sample of class 0
    (the only class held twice), so the client keeps 4 samples, one of each class."""
    labels = np.array([0, 0, 0, 1, 1, 2, 3])
    for seed in range(5):
        out = fill_by_swap(np.array([0, 1, 2, 3]), labels, np.random.default_rng(seed))
        assert len(out) == 4
        assert np.bincount(labels[out], minlength=4).tolist() == [1, 1, 1, 1]
        assert {3, 5, 6} <= set(out.tolist()) and len(set(out.tolist()) & {0, 1, 2}) == 1
    # no class held twice (tiny settings only): the missing classes are added without a removal
    out = fill_by_swap(np.array([0, 3]), labels, np.random.default_rng(0))
    assert sorted(out.tolist()) == [0, 3, 5, 6]


def test_swapped_out_sample_returns_to_the_pool():
    """20 samples, 2 clients of 10; the one class-2 sample (19) is filled into both clients. A client that
    swaps gives its removed sample back, so the second client still finds 10 samples in the pool (with
    the removed sample lost it would find 9)."""
    labels = np.array([0] * 10 + [1] * 9 + [2])
    for seed in range(10):
        a, b = partition_domain(labels, 2, 0.5, seed, fill_missing_classes=True)
        assert len(a) == len(b) == 10
        for shard in (a, b):
            assert 19 in shard and np.bincount(labels[shard], minlength=3)[2] == 1
        assert set(b.tolist()) - {19} <= set(range(20)) - set(a.tolist())
        assert len(set(a.tolist()) | set(b.tolist())) == 19  # all but the second client's removed sample


def test_partition_is_seeded(data_root):
    dom = {"usps": 4, "syn": 2}
    a = plan_clients(data_root, "digits", dom, 0.01, seed=5)
    b = plan_clients(data_root, "digits", dom, 0.01, seed=5)
    c = plan_clients(data_root, "digits", dom, 0.01, seed=6)
    assert [x["indices"] for x in a] == [x["indices"] for x in b]
    assert all(x["indices"] != y["indices"] for x, y in zip(a, c))
    # a domain's partition does not depend on which other domains are planned
    only_syn = plan_clients(data_root, "digits", {"syn": 2}, 0.01, seed=5)
    assert [x["indices"] for x in only_syn] == [x["indices"] for x in a[4:]]


def test_partition_domain_direct():
    labels = np.arange(1000) % 10
    shards = partition_domain(labels, 4, 0.1, seed=1)
    assert [len(s) for s in shards] == [100] * 4
    pooled = np.concatenate(shards)
    assert len(np.unique(pooled)) == 400
    assert all(np.all(np.diff(s) > 0) for s in shards)
    again = partition_domain(labels, 4, 0.1, seed=1)
    assert all(np.array_equal(s, t) for s, t in zip(shards, again))
    other = partition_domain(labels, 4, 0.1, seed=2)
    assert not all(np.array_equal(s, t) for s, t in zip(shards, other))


def test_impossible_split_raises(data_root):
    with pytest.raises(DataError, match="impossible split"):
        partition_domain(np.zeros(100, dtype=np.int64), 11, 0.1, seed=0)  # 11 x 10 > 100
    partition_domain(np.zeros(100, dtype=np.int64), 10, 0.1, seed=0)  # 10 x 10 = 100 is possible
    with pytest.raises(DataError, match="impossible split") as e:
        plan_clients(data_root, "digits", {"usps": 102}, 0.01, seed=0)  # 102 x 72 > 7,291
    assert "usps" in str(e.value)
    plan_clients(data_root, "digits", {"usps": 101}, 0.01, seed=0)  # 101 x 72 = 7,272 fits
    with pytest.raises(DataError):
        partition_domain(np.zeros(50, dtype=np.int64), 1, 0.01, seed=0)  # int(0.5) = 0 samples


# --------------------------------------------------------------------------- data root

def _fake_root(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "SHA256SUMS").write_text("")
    return path


def test_resolve_cli_beats_env(tmp_path, monkeypatch):
    a, b = _fake_root(tmp_path / "a"), _fake_root(tmp_path / "b")
    monkeypatch.setenv("BENCH_DATA_ROOT", str(a))
    assert resolve_data_root(str(b)) == b.resolve()
    assert resolve_data_root(None) == a.resolve()


def test_resolve_env_beats_local_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = _fake_root(tmp_path / "data")
    env = _fake_root(tmp_path / "env")
    monkeypatch.setenv("BENCH_DATA_ROOT", str(env))
    assert resolve_data_root() == env.resolve()
    monkeypatch.delenv("BENCH_DATA_ROOT")
    assert resolve_data_root() == local.resolve()


def test_resolve_falls_back_to_shared(tmp_path, monkeypatch, data_root):
    monkeypatch.chdir(tmp_path)  # no ./data here
    assert resolve_data_root() == data_root.resolve()
    assert resolve_data_root() == (D.PROJECT_ROOT.parent / "shared" / "data").resolve()


def test_resolve_bad_cli_root_raises(tmp_path, monkeypatch, data_root):
    monkeypatch.setenv("BENCH_DATA_ROOT", str(data_root))
    with pytest.raises(DataError, match="SHA256SUMS") as e:
        resolve_data_root(str(tmp_path / "nowhere"))
    assert "nowhere" in str(e.value)


# --------------------------------------------------------------------------- missing / corrupt files

def test_missing_file_names_it_and_how_to_get_it(data_root):
    with pytest.raises(DataError) as e:
        D.load_domain(data_root, "digits", "svhn")
    msg = str(e.value)
    assert "digits/svhn_train" in msg and "missing" in msg and "make data" in msg
    with pytest.raises(DataError, match="svhn"):
        D.check_domains_present(data_root, "digits", ["mnist", "svhn"])


def _usps_root(src: Path, dst: Path) -> Path:
    (dst / "digits").mkdir(parents=True)
    lines = []
    sums = dict(reversed(line.split()) for line in (src / "SHA256SUMS").read_text().splitlines() if line.strip())
    for name in ("digits/usps_train.npz", "digits/usps_test.npz"):
        shutil.copyfile(src / name, dst / name)
        lines.append(f"{sums[name]}  {name}")
    (dst / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    return dst


def test_missing_office_file(tmp_path, data_root):
    root = _usps_root(data_root, tmp_path / "root")
    with pytest.raises(DataError) as e:
        D.load_domain(root, "office_caltech", "dslr")
    assert "office_caltech10/dslr" in str(e.value) and "shared/data" in str(e.value)


def test_good_copy_loads_and_is_cached(tmp_path, data_root, monkeypatch):
    root = _usps_root(data_root, tmp_path / "root")
    dom = D.load_domain(root, "digits", "usps")
    with np.load(data_root / "digits/usps_train.npz") as z:
        assert np.array_equal(dom.train_x, z["x"]) and np.array_equal(dom.train_y, z["y"])
    assert len(dom.test_y) == 2_007
    files = ["digits/usps_train.npz", "digits/usps_test.npz"]
    sums = D.read_sums(root / "SHA256SUMS")
    stamps = {str((root / f).resolve()): [(root / f).stat().st_size, (root / f).stat().st_mtime_ns, sums[f]]
              for f in files}
    assert json.loads((tmp_path / "cache" / "verified_files.json").read_text()) == stamps
    assert all(D.sha256_file(root / f) == sums[f] for f in files)

    def no_hashing(path):
        raise AssertionError(f"{path} hashed again: the cache was not read")

    monkeypatch.setattr(D, "sha256_file", no_hashing)
    D.verify_files(root, files)  # size, mtime and digest as cached: no file read


def test_flipped_byte_is_corrupt(tmp_path, data_root):
    root = _usps_root(data_root, tmp_path / "root")
    D.load_domain(root, "digits", "usps")  # verified and cached first
    path = root / "digits/usps_train.npz"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="corrupt") as e:
        D.load_domain(root, "digits", "usps")
    assert "usps_train.npz" in str(e.value)


def test_wrong_digest_is_corrupt(tmp_path, data_root):
    root = _usps_root(data_root, tmp_path / "root")
    lines = (root / "SHA256SUMS").read_text().splitlines()
    assert lines[1].endswith("digits/usps_test.npz")
    lines[1] = "0" * 64 + "  digits/usps_test.npz"
    (root / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match="corrupt") as e:
        D.load_domain(root, "digits", "usps")
    assert "usps_test.npz" in str(e.value)
    # the train set alone is still fine
    D.load_domain(root, "digits", "usps", need_test=False)


# --------------------------------------------------------------------------- images

def _tv_resize(x: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(x).permute(0, 3, 1, 2)
    return TF.resize(t, [32, 32], antialias=True)


@pytest.mark.parametrize("rel,hw", [("digits/mnist_test.npz", 28), ("digits/usps_test.npz", 16)])
def test_grey_images(data_root, rel, hw):
    with np.load(data_root / rel) as z:
        x = z["x"][:64]
    assert x.shape == (64, hw, hw, 1)
    t = to_tensor_images(x)
    assert t.shape == (64, 3, 32, 32) and t.dtype == torch.uint8
    assert torch.equal(t[:, 0], t[:, 1]) and torch.equal(t[:, 0], t[:, 2])
    ref = _tv_resize(x)[:, 0]
    assert (t[:, 0].int() - ref.int()).abs().max() <= 1
    assert t.float().mean() > 10  # not blank


def test_colour_images(data_root):
    with np.load(data_root / "digits/syn_test.npz") as z:
        x = z["x"][:32]
    t = to_tensor_images(x)
    assert t.dtype == torch.uint8 and torch.equal(t, torch.from_numpy(x).permute(0, 3, 1, 2))
    with np.load(data_root / "office_caltech10/webcam.npz") as z:
        x = z["x"][::30]
    assert x.shape[1:] == (64, 64, 3)
    t = to_tensor_images(x)
    assert t.shape == (len(x), 3, 32, 32)
    assert (t.int() - _tv_resize(x).int()).abs().max() <= 1


def test_load_domain_office_split(data_root):
    dom = D.load_domain(data_root, "office_caltech", "webcam")
    with np.load(data_root / "office_caltech10/webcam.npz") as z:
        x, y = z["x"], z["y"]
    tr = [i for i in range(len(y)) if i % 10 <= 7]
    te = [i for i in range(len(y)) if i % 10 > 7]
    assert np.array_equal(dom.train_x, x[tr]) and np.array_equal(dom.train_y, y[tr])
    assert np.array_equal(dom.test_x, x[te]) and np.array_equal(dom.test_y, y[te])
    assert len(dom.train_y) == 237 and len(dom.test_y) == 58


def test_office_split():
    tr, te = office_split(23)
    assert tr.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17, 20, 21, 22]
    assert te.tolist() == [8, 9, 18, 19]
    for n, n_train in OFFICE_ALL.items():
        assert len(office_split(n_train)[0]) == OFFICE_TRAIN[n]


def test_an_archive_is_decoded_once_a_process_and_each_caller_gets_arrays_of_its_own(data_root, tmp_path):
    """`load_archive` twice: the same values (those `np.load` reads), the file inflated once (`read_npz`'s cache),
    the two results separate writable arrays; the file rewritten with other values is read again."""
    root = tmp_path / "root"
    (root / "office_caltech10").mkdir(parents=True)
    src = data_root / "office_caltech10" / "dslr.npz"
    shutil.copy(src, root / "office_caltech10" / "dslr.npz")
    shutil.copy(data_root / "SHA256SUMS", root / "SHA256SUMS")
    D.read_npz.cache_clear()
    a, b = D.load_archive(root, "office_caltech10/dslr"), D.load_archive(root, "office_caltech10/dslr")
    with np.load(src) as z:
        np.testing.assert_array_equal(a[0], z["x"])
        np.testing.assert_array_equal(b[1], z["y"])
    assert D.read_npz.cache_info().misses == 1 and D.read_npz.cache_info().hits == 1
    assert a[0].flags.writeable and not np.shares_memory(a[0], b[0])
    a[0][0] = 0  # a caller's change reaches no other caller
    with np.load(src) as z:
        np.testing.assert_array_equal(D.load_archive(root, "office_caltech10/dslr")[0], z["x"])
    # rewritten (its checksum too): read again, the new values
    x, y = D.load_archive(root, "office_caltech10/dslr")
    np.savez(root / "office_caltech10" / "dslr.npz", x=x[:5], y=y[:5])
    sums = [line for line in (root / "SHA256SUMS").read_text().splitlines() if "dslr.npz" not in line]
    digest = D.sha256_file(root / "office_caltech10" / "dslr.npz")
    (root / "SHA256SUMS").write_text("\n".join([*sums, f"{digest}  office_caltech10/dslr.npz"]) + "\n")
    assert len(D.load_archive(root, "office_caltech10/dslr")[1]) == 5
