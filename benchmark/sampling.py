"""Client sampling: which clients train in a round (`--participation F`).

Each round draws max(1, round(F * N)) of the run's N clients without replacement, as RethinkFL draws its online
clients (`online_ratio`, there np.ceil; here the nearest count, at least one). The draw is a pure function of
(seed, round): the same for every method, engine and executor, and the same after a resume from a checkpoint
(no random state is carried from round to round). F = 1 draws nothing: every client, in order, every round.
"""
from __future__ import annotations

import numpy as np

SAMPLING_STREAM = 2  # spawn key of the draw's stream (own_initialisation uses 1): no other seeded stream repeats it


def participant_count(num_clients: int, participation: float) -> int:
    """How many clients train in a round: max(1, round(participation * num_clients))."""
    return max(1, int(round(participation * num_clients)))


def participants(client_ids: list[int], participation: float, seed: int, round_idx: int) -> list[int]:
    """The clients that train in round `round_idx`, in ascending order: all of them at participation 1, else
    `participant_count` of them drawn from (seed, round)."""
    ids = sorted(client_ids)
    k = participant_count(len(ids), participation)
    if k >= len(ids):
        return ids
    rng = np.random.default_rng(np.random.SeedSequence([seed, round_idx], spawn_key=(SAMPLING_STREAM,)))
    return sorted(int(ids[i]) for i in rng.choice(len(ids), size=k, replace=False))
