"""Shared fixtures: real data from ../shared/data, one local Ray cluster per session,
W&B offline under a temporary folder (nothing written to $HOME)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from benchmark.data import DataError, resolve_data_root

SHARED_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


@pytest.fixture(scope="session", autouse=True)
def isolated_env(tmp_path_factory):
    """W&B and caches under a temp dir; Ray auth set deliberately (local test clusters: none)."""
    tmp = tmp_path_factory.mktemp("env")
    env = {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp / "wandb"),
        "WANDB_CACHE_DIR": str(tmp / "wandb_cache"),
        "WANDB_DATA_DIR": str(tmp / "wandb_data"),
        "WANDB_CONFIG_DIR": str(tmp / "wandb_config"),
        "WANDB_SILENT": "true",
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    for k in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"):
        Path(env[k]).mkdir(parents=True)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    os.environ.pop("RAY_ADDRESS", None)
    os.environ.pop("BENCH_DATA_ROOT", None)
    yield tmp
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The real datasets (../shared/data)."""
    try:
        return resolve_data_root(str(SHARED_DATA))
    except DataError as e:
        pytest.fail(f"the shared data is required for the tests: {e}")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_data_root(src: Path, dst: Path) -> Path:
    """A data root with every shared file (symlinked) plus a four-domain Digits SVHN made of
    disjoint parts of the 1,083 real SVHN training images: the first 800 train, the rest test."""
    dst.mkdir(parents=True, exist_ok=True)
    sums = []
    for line in (src / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        (dst / name).symlink_to(src / name)
        sums.append(f"{digest}  {name}")
    with np.load(src / "digits/svhn_train_first1083.npz") as z:
        x, y = z["x"], z["y"]
    for name, sl in (("digits/svhn_train.npz", slice(0, 800)), ("digits/svhn_test.npz", slice(800, None))):
        np.savez(dst / name, x=x[sl], y=y[sl])
        sums.append(f"{_sha(dst / name)}  {name}")
    (dst / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    return dst


@pytest.fixture(scope="session")
def full_digits_root(data_root, tmp_path_factory) -> Path:
    """Data root whose Digits has all four domains (SVHN from the 1,083-image file, see make_data_root)."""
    return make_data_root(data_root, tmp_path_factory.mktemp("data_root"))


@pytest.fixture(scope="session")
def ray_cluster(isolated_env):
    """One local Ray instance for the whole session, 4 logical CPUs, no GPUs."""
    import ray

    ray.init(num_cpus=4, num_gpus=0, include_dashboard=False, logging_level="WARNING",
             runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled"}})
    yield ray
    ray.shutdown()
