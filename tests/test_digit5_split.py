"""FedPLVM's Digit-5 data as FedBN's Digits files (docs/deviations.md, 19): each domain's official train and test
sets pooled (train first), one StratifiedShuffleSplit(n_splits=1, test_size=0.2, random_state=0), both parts in
shuffled order; the training set is the train part's first 7,438 (FedBN's ten partitions of 743.8, all read by
FedPLVM's --percent 1), a client's images the first 10 of each class of it, the test set the first 100 of each class
of the test part."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from sklearn.model_selection import StratifiedShuffleSplit

from benchmark.data import DATASETS, FEDBN_TRAIN_READ, load_domain, pooled_split
from benchmark.results import is_complete, protocol
from ray_jobs.config import RunConfig

DOMAINS = ["mnist", "usps", "syn", "mnistm"]  # the shared data has no full SVHN (its 1,083-image stand-in below)


def _archive(root, stem):
    """An archive read straight from its npz file(s), not through benchmark.data."""
    parts = sorted(root.glob(f"{stem}_part*.npz"), key=lambda p: int(p.stem.split("part")[-1]))
    files = sorted(root.glob(f"{stem}.npz")) + parts
    zs = [np.load(f) for f in files]
    return np.concatenate([z["x"] for z in zs]), np.concatenate([z["y"] for z in zs]).astype(np.int64)


def _pool(root, domain):
    (xa, ya), (xb, yb) = (_archive(root, stem) for stem in DATASETS["digit5"][domain])
    return np.concatenate([xa, xb]), np.concatenate([ya, yb]), len(ya)


def _fedplvm_picks(labels, k):
    """FedPLVM's utils/data_util.py, client 0 (int(0 / 5) = 0): for each class in turn, its first k positions."""
    return [i for c in range(10) for i in np.flatnonzero(labels == c)[0:k].tolist()]


# pooled size -> (train part, test part): FedBN's own counts where its data_preprocess.py states them (MNIST
# 60,000 + 10,000, USPS 7,291 + 2,007); SYN (FPL's stand-in) 10,000 + 2,000, MNIST-M our 25,000 + 9,001
SIZES = {"mnist": (70_000, 56_000, 14_000), "usps": (9_298, 7_438, 1_860), "syn": (12_000, 9_600, 2_400),
         "mnistm": (34_001, 27_200, 6_801)}


def test_the_read_is_fedbns_ten_partitions():
    assert FEDBN_TRAIN_READ == 7_438 == sum(int(743.8 * (p + 1)) - int(743.8 * p) for p in range(10))


@pytest.mark.parametrize("domain", DOMAINS)
def test_pooled_split_is_fedbns(data_root, domain):
    x, y, n_train_archive = _pool(data_root, domain)
    n, n_tr, n_te = SIZES[domain]
    assert len(y) == n and n_te == math.ceil(0.2 * n) and n_tr == n - n_te  # scikit-learn's rounding, by hand
    tr, te = pooled_split(y[:n_train_archive], y[n_train_archive:])
    assert (len(tr), len(te)) == (n_tr, n_te)
    # disjoint, and together the pool
    assert not set(tr.tolist()) & set(te.tolist()) and np.array_equal(np.sort(np.concatenate([tr, te])), np.arange(n))
    # stratified: each class's test count is 20% of its pooled count, rounded down or up
    for c in range(10):
        k = int((y == c).sum())
        assert math.floor(0.2 * k) - 1 <= int((y[te] == c).sum()) <= math.ceil(0.2 * k) + 1
    assert abs(np.bincount(y[te], minlength=10) / n_te - np.bincount(y, minlength=10) / n).max() < 1e-3
    # scikit-learn's split itself (its indices depend on the labels only), in its shuffled order
    ref_tr, ref_te = next(StratifiedShuffleSplit(n_splits=1, test_size=0.2, random_state=0).split(np.zeros((n, 1)), y))
    assert np.array_equal(tr, ref_tr) and np.array_equal(te, ref_te)
    assert not np.array_equal(np.sort(te), te)  # shuffled, not pool order
    # both archives feed the test part (the pool, not the official test set)
    assert 0 < int((te >= n_train_archive).sum()) < n_te
    # deterministic: another call, whatever numpy's global stream
    np.random.seed(123)
    tr2, te2 = pooled_split(y[:n_train_archive], y[n_train_archive:])
    assert np.array_equal(tr, tr2) and np.array_equal(te, te2)

    # the domain as a run loads it: the train part's first 7,438, the whole test part, images and labels
    dom = load_domain(data_root, "digit5", domain)
    read = tr[:FEDBN_TRAIN_READ]
    assert len(dom.train_y) == min(n_tr, 7_438) and len(dom.test_y) == n_te
    assert np.array_equal(dom.train_y, y[read]) and np.array_equal(dom.train_x, x[read])
    assert np.array_equal(dom.test_y, y[te]) and np.array_equal(dom.test_x, x[te])
    # FedPLVM's picks: the first 10 of each class of the training set (class by class), the first 100 of each class
    # of the test part; the 7,438 prefix holds far more than 10 of each class, so the picks are the train part's own
    picks = _fedplvm_picks(y[read], 10)
    assert picks == _fedplvm_picks(y[tr], 10) and len(picks) == 100
    test_picks = _fedplvm_picks(y[te], 100)
    sub = load_domain(data_root, "digit5", domain, per_class=(10, 100))
    assert np.array_equal(sub.train_x, x[read][sorted(picks)]) and np.array_equal(sub.train_y, y[read][sorted(picks)])
    assert np.array_equal(sub.test_x, x[te][sorted(test_picks)]) and np.bincount(sub.test_y).tolist() == [100] * 10


def test_usps_split_by_value(data_root):
    """Pinned (scikit-learn 1.9.1): positions in USPS's pool (official train 0-7,290, then test 7,291-9,297) of the
    first training image of each class and of the first training and test images under FedBN's split, and the test
    part's class counts; they change if the split, the pool's order or scikit-learn's draw changes."""
    x, y, n_tr = _pool(data_root, "usps")
    tr, te = pooled_split(y[:n_tr], y[n_tr:])
    assert [int(tr[np.flatnonzero(y[tr] == c)[0]]) for c in range(10)] == [2169, 7874, 7344, 1527, 8634, 3189, 2022,
                                                                          3383, 1702, 1103]
    assert tr[:5].tolist() == [2022, 1527, 7874, 5845, 2169] and te[:5].tolist() == [5278, 5112, 840, 4460, 7034]
    assert np.bincount(y[te]).tolist() == [311, 254, 186, 165, 170, 143, 167, 158, 142, 164]  # of 1553, 1269, ...


def test_svhn_pools_its_pair(full_digits_root):
    """SVHN's path: a train and a test archive in the data root (here the 1,083-image stand-in cut 800 / 283) are
    pooled and split as the others (a real SVHN: 73,257 + 26,032 -> 79,431 / 19,858, FedBN's counts)."""
    x, y, n_tr = _pool(full_digits_root, "svhn")
    assert (len(y), n_tr) == (1_083, 800)
    dom = load_domain(full_digits_root, "digit5", "svhn")
    tr, te = next(StratifiedShuffleSplit(n_splits=1, test_size=0.2, random_state=0).split(y, y))
    assert (len(dom.train_y), len(dom.test_y)) == (866, 217) == (len(tr), len(te))
    assert np.array_equal(dom.train_x, x[tr]) and np.array_equal(dom.test_x, x[te])
    assert (99_289 - math.ceil(0.2 * 99_289), math.ceil(0.2 * 99_289)) == (79_431, 19_858)


def test_other_datasets_keep_their_archives(data_root):
    """FPL's Digits and FedProto's MNIST read the official train and test sets as they are."""
    _, y_test = _archive(data_root, "digits/usps_test")
    assert np.array_equal(load_domain(data_root, "digits", "usps").test_y, y_test)
    assert len(load_domain(data_root, "mnist", "mnist", need_train=False).test_y) == 10_000


def test_runs_before_the_resplit_are_not_taken_for_new_ones(tmp_path):
    """data_split is a protocol key set from the dataset: a Digit-5 summary recorded without it (the archives' own
    split) is not complete for today's digit5 config; other datasets' old summaries still are."""
    for preset, split in (("fedplvm-digit5", "pooled"), ("fedplvm-office10", None), ("fpl-digits", None)):
        cfg = RunConfig.from_preset(preset, method="fedavg")
        assert cfg.data_split == split and protocol(cfg)["data_split"] == split
        old = {k: v for k, v in json.loads(json.dumps(protocol(cfg))).items() if k != "data_split"}
        (tmp_path / "summary.json").write_text(json.dumps({"complete": True, "protocol": old}))
        assert is_complete(tmp_path, protocol(cfg)) == (split is None)
        (tmp_path / "summary.json").write_text(json.dumps({"complete": True, "protocol": protocol(cfg)}))
        assert is_complete(tmp_path, protocol(cfg))
    with pytest.raises(TypeError):
        RunConfig(dataset="digit5", data_split=None)  # never given: it follows the dataset
