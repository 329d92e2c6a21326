"""FedProto's n-way k-shot client split (PROTOCOL.md section 4; the official `mnist_noniid` /
`mnist_noniid_lt` of yuetan031/FedProto).

Each of the clients draws its number of classes n ~ randint(max(2, ways - stdev), min(classes,
ways + stdev + 1)) and its samples per class k ~ randint(shots - stdev + 1, shots + stdev - 1)
(upper bounds exclusive, as numpy's randint), then n classes at random; it takes k training
samples and `test_shots` test samples of each of its classes. No sample goes to two clients:
each class's samples are taken in a seeded random order, each client the next ones. (The
official code takes slot i of the label-sorted indices instead; same distribution, docs/fedproto.md.)
"""
from __future__ import annotations

import numpy as np

SHOTS, STDEV, TEST_SHOTS = 100, 2, 40  # the paper's MNIST setting


def draw_ways_shots(rng: np.random.Generator, num_clients: int, ways: int, num_classes: int,
                    shots: int = SHOTS, stdev: int = STDEV) -> tuple[np.ndarray, np.ndarray]:
    """Every client's number of classes n and samples per class k."""
    n = rng.integers(max(2, ways - stdev), min(num_classes, ways + stdev + 1), size=num_clients)
    k = rng.integers(shots - stdev + 1, shots + stdev - 1, size=num_clients)
    return n, k


def nway_kshot_split(train_labels: np.ndarray, test_labels: np.ndarray, num_clients: int, ways: int, seed,
                     num_classes: int = 10, shots: int = SHOTS, stdev: int = STDEV, test_shots: int = TEST_SHOTS,
                     fraction: float = 1.0) -> list[dict]:
    """Per client: `classes` (sorted), training `indices` and `test_indices` (sorted) into the two sets.

    `fraction` scales every k (small settings for tests; at least 1 sample per class). The same
    `seed` gives the same split. ValueError when a class has too few samples for the clients.
    """
    rng = np.random.default_rng(seed)
    n_list, k_list = draw_ways_shots(rng, num_clients, ways, num_classes, shots, stdev)
    if fraction != 1.0:
        k_list = np.maximum(1, (fraction * k_list).astype(int))
    orders = {"train": [rng.permutation(np.flatnonzero(train_labels == c)) for c in range(num_classes)],
              "test": [rng.permutation(np.flatnonzero(test_labels == c)) for c in range(num_classes)]}
    taken = {"train": np.zeros(num_classes, int), "test": np.zeros(num_classes, int)}
    clients = []
    for i, (n, k) in enumerate(zip(n_list, k_list)):
        classes = np.sort(rng.choice(num_classes, size=int(n), replace=False))
        picked = {"train": [], "test": []}
        for part, count in (("train", int(k)), ("test", test_shots)):
            for c in classes:
                start = taken[part][c]
                if start + count > len(orders[part][c]):
                    raise ValueError(f"n-way k-shot split: class {c} has {len(orders[part][c])} {part} samples, "
                                     f"too few for {num_clients} clients taking {count} each; use fewer clients or a "
                                     "smaller k.")
                picked[part].append(orders[part][c][start:start + count])
                taken[part][c] = start + count
        clients.append({"classes": classes.tolist(), "indices": np.sort(np.concatenate(picked["train"])).tolist(),
                        "test_indices": np.sort(np.concatenate(picked["test"])).tolist()})
    return clients
