"""Communication per round: what each client uploads and receives, counted from the tensors that travel.

A client uploads its trained state_dict (parameters and BatchNorm buffers) when the server
rule averages weights (`ServerRule.averages_weights`; a prototype-only method does not) and its
local prototypes when the rule builds the round's payload from them (a payload that is
not None; FedAvg's rule takes none). It receives the global state_dict (when the rule
averages weights) and the round's payload, as sent at the start of the round (round 0: none).
"Numbers" are tensor entries; bytes their storage (entries x element size: 4 for float32,
8 for the int64 `num_batches_tracked` and prototype labels). Plain numbers in a payload
(FedProc's weight a) are not counted.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

KEYS = ("up_weights", "up_prototypes", "up_bytes", "down_weights", "down_prototypes", "down_bytes")


def count(obj) -> tuple[int, int]:
    """(entries, bytes) of every tensor in `obj`: a tensor, a dict / list / tuple of them, a dataclass
    (a round payload: its tensor fields), or None."""
    if obj is None:
        return 0, 0
    if torch.is_tensor(obj):
        return obj.numel(), obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        parts = obj.values()
    elif isinstance(obj, (list, tuple)):
        parts = obj
    elif dataclasses.is_dataclass(obj):
        parts = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    else:
        return 0, 0
    counts = [count(p) for p in parts]
    return sum(n for n, _ in counts), sum(b for _, b in counts)


def client_round(up_weights: tuple[int, int], up_prototypes, down_weights, down_payload) -> dict:
    """One client's round: `up_weights` the (entries, bytes) of the state_dict it sent ((0, 0): none),
    `up_prototypes` what it sent of its prototypes (None: nothing), `down_weights` and `down_payload`
    what it received (None: nothing)."""
    (uw, uwb), (up, upb), (dw, dwb), (dp, dpb) = (up_weights, count(up_prototypes), count(down_weights),
                                                  count(down_payload))
    return {"up_weights": uw, "up_prototypes": up, "up_bytes": uwb + upb,
            "down_weights": dw, "down_prototypes": dp, "down_bytes": dwb + dpb}


def mean_per_client(per_client: dict[str, dict]) -> dict[str, float]:
    """The round's mean over its clients of every count."""
    return {k: float(np.mean([c[k] for c in per_client.values()])) for k in KEYS}


def run_total(rounds: list[dict]) -> dict:
    """summary.json's communication: the mean per client per round of every count, and the run's total
    bytes (every client, every round, both directions). Empty when the rounds carry no counts."""
    recs = [r["communication"] for r in rounds if "communication" in r]
    if not recs:
        return {}
    return {"per_client_per_round": {k: float(np.mean([r["mean_per_client"][k] for r in recs])) for k in KEYS},
            "total_bytes": int(sum(c["up_bytes"] + c["down_bytes"] for r in recs for c in r["per_client"].values()))}
