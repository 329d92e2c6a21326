"""Per-client state on disk: a dict of client id -> state (tensors, possibly in dicts, lists, tuples) whose
values live in files, one per client, so that host memory holds none of them between a client's rounds.

A client group under `--client-memory disk` keeps its clients' persistent states (MOON's previous model,
FedDyn's h_k, FedPer's head, ...) and own models (FedProto as published, Local) here: at 425 clients a model
each is about 8 GB, more than a laptop's memory. A value is written when it is set and read back, on the CPU,
when it is asked for; nothing is cached. The folder is the group's own (a fresh temporary folder under
`tempfile.gettempdir()`, so `TMPDIR` chooses the disk) and is removed with the store.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator, MutableMapping
from pathlib import Path

import torch


class DiskStore(MutableMapping):
    """int -> state, each value a `torch.save` file `<key>.pt` in a temporary folder of its own."""

    def __init__(self, prefix: str = "bench-clients-"):
        self.folder = Path(tempfile.mkdtemp(prefix=prefix))
        self._keys: set[int] = set()
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.folder), True)

    def _path(self, key: int) -> Path:
        return self.folder / f"{int(key)}.pt"

    def __setitem__(self, key: int, value) -> None:
        tmp = self.folder / f"{int(key)}.pt.tmp"
        torch.save(value, tmp)
        os.replace(tmp, self._path(key))  # a value is whole or absent, never half written
        self._keys.add(int(key))

    def __getitem__(self, key: int):
        if key not in self._keys:
            raise KeyError(key)
        return torch.load(self._path(key), map_location="cpu", weights_only=True)

    def __delitem__(self, key: int) -> None:
        if key not in self._keys:
            raise KeyError(key)
        self._path(key).unlink()
        self._keys.discard(key)

    def __contains__(self, key) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._keys))

    def __len__(self) -> int:
        return len(self._keys)

    def __reduce__(self):
        raise TypeError("a DiskStore's values are files of this process's machine: send dict(store), not the store")

    def nbytes(self) -> int:
        """The bytes the values take on disk."""
        return sum(self._path(k).stat().st_size for k in self._keys)

    def close(self) -> None:
        """Remove the folder and every value in it (also done when the store is garbage collected)."""
        self._cleanup()
        self._keys.clear()
