"""Clients' shares of their domains: a paper's split of each domain's training set over its clients.

FPL's (PROTOCOL.md section 1): each client in order takes a share of what remains of a seeded permutation of its
domain (`partition_domain`), Office-Caltech's clients filling a missing class by a swap (`fill_by_swap`); FedPLVM's
(section 2): one client per domain with the first k images of each class; FedProto's (section 4): the n-way k-shot
split of `benchmark.fewshot`. `plan_clients` gives every client of a run its training indices.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmark.data import DATASETS, DataError, archive_files, first_per_class, load_domain, office_split
from benchmark.fewshot import STDEV, nway_kshot_split


def partition_domain(
    labels: np.ndarray, num_clients: int, pct: float, seed: int, fraction: float = 1.0, fill_missing_classes: bool = False
) -> list[np.ndarray]:
    """Clients in order each take int(pct * N) indices from a seeded permutation of what remains.

    `fraction` scales every client's count (small settings for tests). With
    `fill_missing_classes` (Office-Caltech) a client missing a class swaps, as
    RethinkFL's `partition_office_domain_skew_loaders_new` does, one of its
    samples for one of that class: see `fill_by_swap`.
    """
    n = len(labels)
    per_client = int(pct * n)
    if per_client < 1:
        raise DataError(
            f"the split asks for more samples than the domain has: a client takes int({pct} x {n}) = 0 of its "
            f"{n} training images; use a data root with the full domain, or leave the domain out with --domains."
        )
    if fraction != 1.0:
        per_client = max(1, int(fraction * per_client))
    if num_clients * per_client > n:
        raise DataError(
            f"impossible split: {num_clients} clients x {per_client} samples = {num_clients * per_client} "
            f"> {n} training samples in the domain; use fewer clients or a smaller share."
        )
    rng = np.random.default_rng(seed)
    remaining = np.arange(n)
    shards = []
    for _ in range(num_clients):
        perm = rng.permutation(remaining)
        shard = perm[:per_client]
        if fill_missing_classes:
            shard = fill_by_swap(shard, labels, rng)
        shards.append(np.sort(shard))
        remaining = perm[~np.isin(perm, shard)]  # what the client gave back returns to the pool
    return shards


def fill_by_swap(shard: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For each class the shard lacks (ascending): add one sample of it drawn from the whole training
    set of the domain, and remove one sample of a class the shard holds at least twice (class drawn,
    then sample drawn), so the client keeps its size. When no class is held twice (tiny settings
    only), the sample is added without a removal."""
    shard = list(shard)
    for k in np.setdiff1d(np.unique(labels), labels[shard]):
        add = rng.choice(np.flatnonzero(labels == k))
        held, counts = np.unique(labels[shard], return_counts=True)
        if (counts >= 2).any():
            drop_class = rng.choice(held[counts >= 2])
            of_class = [i for i, s in enumerate(shard) if labels[s] == drop_class]
            del shard[rng.choice(of_class)]
        shard.append(add)
    return np.asarray(shard, dtype=np.int64)



def plan_clients(root: Path, dataset: str, clients_per_domain: dict[str, int], pct: float | None, seed: int,
                 fraction: float = 1.0, per_class: tuple[int, int] | None = None, ways: int | None = None,
                 stdev: int = STDEV) -> list[dict]:
    """Every client's id, domain and training indices, domains and clients in order.

    Each domain's pool is partitioned with its own seeded stream (seed, domain
    position), so the same seed gives the same partition on any machine and
    dropping a domain leaves the others' partitions unchanged. With `per_class`
    (FedPLVM) a domain has one client, which takes the first k_train of each class
    (k_train scaled by `fraction`, at least 1); its indices are into
    `load_domain(..., per_class=per_class)`'s training set. With `ways` (FedProto) the
    domain's clients get FedProto's n-way k-shot split (`benchmark.fewshot`, its n and k drawn with `stdev`):
    each also its `classes` and `test_indices` into the domain's test set.
    """
    order = list(DATASETS[dataset])
    clients = []
    for d, n_clients in clients_per_domain.items():
        if ways is not None:
            dom = load_domain(root, dataset, d)
            try:
                split = nway_kshot_split(dom.train_y, dom.test_y, n_clients, ways, [seed, order.index(d)],
                                         stdev=stdev, fraction=fraction)
            except ValueError as e:
                raise DataError(f"{dataset}/{d}: {e}") from None
            clients += [{"id": len(clients) + i, "domain": d, **c, "num_samples": len(c["indices"])} for i, c in enumerate(split)]
            continue
        if per_class is not None:
            if n_clients != 1:
                raise DataError(f"{dataset}/{d}: this protocol has one client per domain (got {n_clients}).")
            labels = load_domain(root, dataset, d, need_test=False, per_class=per_class).train_y
            shard = first_per_class(labels, max(1, int(fraction * per_class[0])))
            clients.append({"id": len(clients), "domain": d, "indices": shard.tolist(), "num_samples": len(shard)})
            continue
        train_stem, test_stem = DATASETS[dataset][d]
        office = test_stem is None
        labels = np.concatenate([np.load(root / f, allow_pickle=False)["y"] for f in archive_files(root, train_stem)])
        if office:
            labels = labels[office_split(len(labels))[0]]
        try:
            shards = partition_domain(labels, n_clients, pct, [seed, order.index(d)], fraction, fill_missing_classes=office)
        except DataError as e:
            raise DataError(f"{dataset}/{d}: {e}") from None
        for shard in shards:
            clients.append({"id": len(clients), "domain": d, "indices": shard.tolist(), "num_samples": len(shard)})
    return clients
