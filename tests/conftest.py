"""Shared fixtures: real data from ../shared/data, one local Ray cluster per session (Ray's default
token authentication, its token in a session file), W&B offline under a temporary folder (nothing
written to $HOME)."""
from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmark.data import DataError, resolve_data_root
from benchmark.download import root_with_svhn
from benchmark.provenance import CPU_FLAGS_ENV

SHARED_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def write_token(path: Path) -> str:
    """A new Ray token (256 random bits, as `ray get-auth-token --generate` makes) in a file only we can read."""
    token = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return token


@pytest.fixture(scope="session", autouse=True)
def isolated_env(tmp_path_factory):
    """W&B, caches and the Ray token under a temp dir. Ray's authentication stays at its default (local
    instances: token auth on); the token is read from RAY_AUTH_TOKEN_PATH, so Ray never writes
    ~/.ray/auth_token, and a RAY_AUTH_MODE or RAY_AUTH_TOKEN from the caller's shell does not count."""
    tmp = tmp_path_factory.mktemp("env")
    token_path = tmp / "ray_auth_token"
    write_token(token_path)
    env = {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp / "wandb"),
        "WANDB_CACHE_DIR": str(tmp / "wandb_cache"),
        "WANDB_DATA_DIR": str(tmp / "wandb_data"),
        "WANDB_CONFIG_DIR": str(tmp / "wandb_config"),
        "WANDB_SILENT": "true",
        "RAY_AUTH_TOKEN_PATH": str(token_path),
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray refuses objects that spill to a disk more than 95% full (whatever its free bytes) and its raylet
        # prints a warning line; stop 35's CI failed so on a 252 GB disk with about 12 GB free. The tests spill
        # megabytes: the bound is 99% here (users keep Ray's default).
        "RAY_local_fs_capacity_threshold": "0.99",
        # the processor every process of the suite assumes (`benchmark.provenance.cpu_flags`; they all inherit it):
        # none of native bfloat16, so that `--precision auto` picks 32-true on any machine; a test that runs a path
        # under both kinds gives its own (`PROCESSORS`)
        CPU_FLAGS_ENV: "",
    }
    unset = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "BENCH_DATA_ROOT")
    for k in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"):
        Path(env[k]).mkdir(parents=True)
    old = {k: os.environ.get(k) for k in (*env, *unset)}
    os.environ.update(env)
    for k in unset:
        os.environ.pop(k, None)
    yield tmp
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# the CPU thread count each test's body starts with: this process's share of the machine's cores under
# pytest-xdist (`make test`: 2 workers), at least 1. Two workers each running torch's 2 OpenMP threads on the 2 cores
# took 298 s for 28 engine tests that take 11 s with 1 thread each, or alone with 2 (2026-11-29): a descheduled
# OpenMP thread keeps its team waiting at every parallel region
SUITE_THREADS = max(1, torch.get_num_threads() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
torch.set_num_threads(SUITE_THREADS)


@pytest.fixture(autouse=True)
def torch_threads():
    """Each test's body starts with the CPU thread count the suite began with, whatever an earlier test or a
    module's fixture left: an in-process run sets it to its client group's and driver's CPU shares (1 by
    default), and float32 rounding depends on it (a CI failure of 2026-11-26 came from the count an earlier test
    left)."""
    torch.set_num_threads(SUITE_THREADS)
    yield


# the two kinds of processor the suite must pass on, as `CPU_FLAGS_ENV` gives them to a process: AVX2 alone, and
# AVX512-BF16 (native bfloat16); a test parametrised over it runs its processes as on each
PROCESSORS = {"avx2": "avx avx2 fma", "native-bf16": "avx avx2 fma avx512f avx512_bf16"}


@pytest.fixture(scope="session")
def slow_setup():
    """Asked for by a fixture that makes runs for a minute or more (a smoke sweep, the bench, a cluster's runs):
    every test that uses it is marked slow (`pytest_collection_modifyitems`), as a test marked so by hand, and left
    to the full suite (`make test`), out of the quick tier (`make test-quick`: -m "not slow")."""


def pytest_collection_modifyitems(items):
    for item in items:
        if "slow_setup" in item.fixturenames:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The real datasets (../shared/data)."""
    try:
        return resolve_data_root(str(SHARED_DATA))
    except DataError as e:
        pytest.fail(f"the shared data is required for the tests: {e}")


def make_data_root(src: Path, dst: Path) -> Path:
    """A data root with every shared file (symlinked) plus a four-domain Digits SVHN made of
    disjoint parts of the 1,083 real SVHN training images: the first 800 train, the rest test."""
    return root_with_svhn(src, dst, np.arange(800), np.arange(800, 1083))


@pytest.fixture(scope="session")
def full_digits_root(data_root, tmp_path_factory) -> Path:
    """Data root whose Digits has all four domains (SVHN from the 1,083-image file, see make_data_root)."""
    return make_data_root(data_root, tmp_path_factory.mktemp("data_root"))


# a line Ray's driver prints by itself, from a thread, whenever its cluster has news: "(raylet) Warning: ... cannot be
# scheduled right now", "(autoscaler +3s) ...", an actor's "(ClientActor pid=123) ..." (colour codes around the prefix)
RAY_LINE = re.compile(r"^(?:\x1b\[[0-9;]*m)*\((?:raylet|autoscaler \+[^)\n]*|[^()\n]*pid=\d+[^()\n]*)\)"
                      r"(?:\x1b\[[0-9;]*m)* .*\n?", re.M)


class WithoutRayLines:
    """pytest's capsys, with the lines Ray's driver prints by itself left out of what `readouterr` returns: they
    land, asynchronously, in whichever test is running (a raylet warning once broke a test that reads one error
    line), and none is this project's output."""

    def __init__(self, capsys):
        self._capsys = capsys

    def readouterr(self):
        got = self._capsys.readouterr()
        return got._replace(out=RAY_LINE.sub("", got.out), err=RAY_LINE.sub("", got.err))

    def __getattr__(self, name):
        return getattr(self._capsys, name)


@pytest.fixture
def capsys(capsys):
    return WithoutRayLines(capsys)


@pytest.fixture(scope="session")
def ray_cluster(isolated_env):
    """One local Ray instance for the whole session, 4 logical CPUs, no GPUs, token authentication on (under
    `make test`'s pytest-xdist, one in each worker process that runs a test using Ray: two instances at most); its
    own (address "local"), whatever other Ray clusters run on the machine."""
    import ray

    ray.init(address="local", num_cpus=4, num_gpus=0, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()
