"""Per-round checkpoints of a run: `<run folder>/checkpoints/round_NNNN.pt`, the latest two kept.

A checkpoint holds everything the next round reads (the driver's `checkpoint()`: the
global model, the server rule's state, the payload, every client's persistent state),
the metrics so far, the round and the run's protocol. Written atomically (temp file,
fsync, rename, then the older ones removed), each file starts with a magic string and
the sha256 of the rest, so a truncated or corrupt file is detected and the previous
one used. Nothing random is saved: every random stream a round reads is derived from
(seed, round, client) (`lightning_modules.clients.client_generator`, MOON's own initialisation).
"""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

from benchmark.results import LATER_KEYS, atomic_write, in_memory, with_later_hparams, without_moot

MAGIC = b"FEDPROTO-BENCH-CKPT-1\n"
KEEP = 2
DIR = "checkpoints"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used (another protocol, or none readable); the message says why."""


def checkpoint_path(ckpt_dir: Path, round_idx: int) -> Path:
    return Path(ckpt_dir) / f"round_{round_idx:04d}.pt"


def save(ckpt_dir: Path, round_idx: int, obj: dict) -> Path:
    """Write obj (torch-picklable) as round_idx's checkpoint; keep the latest KEEP."""
    import torch

    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    body = in_memory(lambda f: torch.save(obj, f))
    path = checkpoint_path(ckpt_dir, round_idx)
    atomic_write(path, MAGIC, hashlib.sha256(body).digest(), body)  # a failed write leaves the folder as it was
    for old in listing(ckpt_dir)[KEEP:]:
        old.unlink(missing_ok=True)
    return path


def listing(ckpt_dir: Path) -> list[Path]:
    """The checkpoint files, newest first."""
    return sorted(Path(ckpt_dir).glob("round_*.pt"), reverse=True)


def newest_round(ckpt_dir: Path) -> int | None:
    """The round of the newest checkpoint file (by its name, unread), None without one."""
    files = listing(ckpt_dir)
    return int(files[0].stem.removeprefix("round_")) if files else None


def read(path: Path) -> dict:
    """The checkpoint's content; CheckpointError when the file is truncated or corrupt."""
    import torch

    try:
        blob = Path(path).read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path} cannot be read ({e.strerror or e})") from None
    head = len(MAGIC) + 32
    if len(blob) < head or not blob.startswith(MAGIC):
        raise CheckpointError(f"{path} is not a complete checkpoint (truncated or another format)")
    if hashlib.sha256(blob[head:]).digest() != blob[len(MAGIC):head]:
        raise CheckpointError(f"{path} is truncated or corrupt (its sha256 does not match its content)")
    return torch.load(io.BytesIO(blob[head:]), map_location="cpu", weights_only=False)


def protocol_difference(saved: dict, expected: dict, where: str = "in the checkpoint") -> list[str]:
    expected = json.loads(json.dumps(expected))
    # a checkpoint written before a protocol key existed ran with that key's value in LATER_KEYS
    saved = {**{k: v for k, v in LATER_KEYS.items() if k in expected}, **json.loads(json.dumps(saved))}
    saved = with_later_hparams(saved, expected)  # written before a hyperparameter existed
    saved = without_moot(saved, expected)  # an aggregation recorded for a method that averages no weights
    return [f"{k}: {saved.get(k)!r} {where}, {expected.get(k)!r} here"
            for k in sorted(set(saved) | set(expected)) if saved.get(k) != expected.get(k)]


def load_latest(ckpt_dir: Path, expected_protocol: dict, say=print) -> dict | None:
    """The newest readable checkpoint (an unreadable one is reported and the previous one used); None when
    there is none. CheckpointError when it was written by another protocol, or none is readable."""
    files = listing(ckpt_dir)
    problems = []
    for path in files:
        try:
            ck = read(path)
        except CheckpointError as e:
            problems.append(str(e))
            say(f"note: {e}; trying the previous checkpoint")
            continue
        diff = protocol_difference(ck["protocol"], expected_protocol)
        if diff:
            raise CheckpointError(
                f"the checkpoint {path} was written by another protocol ({'; '.join(diff)}); resume with the "
                f"same settings, or delete {ckpt_dir} (or name another folder with --out) to start this run afresh.")
        return ck
    if problems:
        raise CheckpointError(f"no readable checkpoint in {ckpt_dir} ({'; '.join(problems)}); delete {ckpt_dir} "
                              "to start this run afresh.")
    return None
