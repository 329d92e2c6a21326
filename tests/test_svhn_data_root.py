"""tools/svhn_data_root.py: the SVHN domain it adds is the 1,083 shared SVHN images split 80/20 by class (each
class's share in the test part within one image of 20%), every image once, the other files the shared ones; the
root passes the checksum check and Digit-5 loads SVHN from it; a folder with files in it is refused."""
from __future__ import annotations

import numpy as np
import pytest
import tool_script

from benchmark.data import check_domains_present, load_domain

svhn_data_root = tool_script.load("svhn_data_root")


def test_the_svhn_root_splits_the_shared_images_by_class_and_loads(data_root, tmp_path):
    root = tmp_path / "root"
    assert svhn_data_root.make_root(data_root, root) == (866, 217)
    with np.load(data_root / "digits/svhn_train_first1083.npz") as z:
        x, y = z["x"], z["y"]
    with np.load(root / "digits/svhn_train.npz") as tr, np.load(root / "digits/svhn_test.npz") as te:
        parts = [(tr["x"], tr["y"]), (te["x"], te["y"])]
    # every image once: each part's images are source rows, disjoint, 1,083 in all
    rows = {img.tobytes(): i for i, img in enumerate(x)}
    got = [[rows[img.tobytes()] for img in px] for px, _ in parts]
    assert sorted(got[0] + got[1]) == list(range(len(y))) and all(got[k] == sorted(got[k]) for k in (0, 1))
    assert all(np.array_equal(py, y[g]) for (_, py), g in zip(parts, got))
    test_share = np.bincount(parts[1][1], minlength=10) - 0.2 * np.bincount(y, minlength=10)
    assert np.abs(test_share).max() <= 1
    assert (root / "digits/mnist_train.npz").resolve() == (data_root / "digits/mnist_train.npz").resolve()
    sums = check_domains_present(root, "digit5", ["svhn", "usps"])
    assert {"digits/svhn_train.npz", "digits/svhn_test.npz"} <= set(sums)
    dom = load_domain(root, "digit5", "svhn")
    assert len(dom.train_y) + len(dom.test_y) == 1083
    with pytest.raises(SystemExit, match="not empty"):
        svhn_data_root.make_root(data_root, root)
