"""A data root with an SVHN domain made from the 1,083 SVHN images we have, for probes of what an SVHN client
does (docs/gaps.md 3.2 and 3.6). The full SVHN is not offline, so `--domains` without svhn is the rule; this root
lets a probe run one anyway. It links every file of the shared data root and adds `digits/svhn_train.npz` and
`digits/svhn_test.npz` (`benchmark.download.root_with_svhn`): a stratified shuffled 80/20 split
(`benchmark.data.shuffled_split`) of `digits/svhn_train_first1083.npz`, each part in archive order, with their
checksums in its SHA256SUMS.
Digit-5 pools and splits both parts again, so only the pool matters there. Not the paper's SVHN: 1,083 images of
the official training set, so an SVHN test accuracy from this root is comparable to nothing.

    python tools/svhn_data_root.py /tmp/svhnroot            # from ../shared/data, or --source DIR
    python -m ray_jobs.run --preset fedplvm-digit5 --domains mnist,svhn,usps,syn,mnistm --data-root /tmp/svhnroot ...
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmark.data import resolve_data_root, shuffled_split  # noqa: E402
from benchmark.download import SVHN_FIRST_1083, root_with_svhn  # noqa: E402


def make_root(source: Path, out: Path) -> tuple[int, int]:
    """Builds the root at `out` (a new or empty folder); returns the sizes of the train and test parts."""
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty: give a new folder (this tool never overwrites one).")
    with np.load(source / SVHN_FIRST_1083) as z:
        train, test = shuffled_split(z["y"])
    root_with_svhn(source, out, np.sort(train), np.sort(test))
    return len(train), len(test)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the new data root (a new or empty folder)")
    p.add_argument("--source", default=None, help="the data root to link (default: ../shared/data, as resolved)")
    args = p.parse_args(argv)
    n_train, n_test = make_root(resolve_data_root(args.source), args.out)
    print(f"{args.out}: the shared files linked, SVHN {n_train} training and {n_test} test images")


if __name__ == "__main__":
    main()
