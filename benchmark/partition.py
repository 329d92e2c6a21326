"""Clients' shares of their domains: a paper's split of each domain's training set over its clients.

FPL's (PROTOCOL.md section 1): each client in order takes a share of what remains of a seeded permutation of its
domain (`partition_domain`), Office-Caltech's clients filling a missing class by a swap (`fill_by_swap`); FedPLVM's
(section 2): one client per domain with the first k images of each class (several clients of a domain: the next k
each, `class_blocks`); FedProto's (section 4): the n-way k-shot split of `benchmark.fewshot`; any of FPL's and
FedPLVM's with FedPLVM's Dirichlet label skew (`LabelSkew`, appendix D). `plan_clients` gives every client of a run
its training indices.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmark.data import DATASETS, NUM_CLASSES, DataError, archive_files, load_domain, office_split
from benchmark.fewshot import SHOTS, STDEV, nway_kshot_split


def partition_domain(
    labels: np.ndarray, num_clients: int, pct: float, seed: int, fraction: float = 1.0,
    fill_missing_classes: bool = False
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


@dataclass(frozen=True)
class LabelSkew:
    """FedPLVM's label non-iid split (its `utils/data_util.py` `prepare_data_digits_noniid` and
    `prepare_data_office_noniid`, paper appendix D): for each class k in order, proportions p ~ Dirichlet(alpha 1_M)
    over all M clients of the layout, drawn from numpy's legacy stream seeded with `seed` (its code seeds that stream
    with 0 in every run: `RunConfig.dirichlet_seed`); client c gets ceil(p_c * M * n) samples of class k (Digit-5's
    code; Office's truncates: `rounding="floor"`), n the mean count of a class per client (10 to train, 100 to test).
    The draw covers every client of the dataset's layout, so leaving a domain out of a run leaves the others' counts
    as they are."""

    alpha: float
    layout: dict[str, int]  # clients per domain of the whole layout (domains left out of a run included)
    rounding: str = "ceil"
    seed: int = 0

    def counts(self, per_client) -> dict[str, np.ndarray]:
        """Per domain of the layout, its clients' class counts (clients x classes). `per_client`: n, a number or one
        per domain (a domain without one gets 0s)."""
        rng = np.random.RandomState(self.seed)
        m = sum(self.layout.values())
        per = np.concatenate([np.repeat(per_client.get(d, 0) if isinstance(per_client, dict) else per_client, n)
                              for d, n in self.layout.items()])
        out = np.zeros((m, NUM_CLASSES), dtype=np.int64)
        for k in range(NUM_CLASSES):
            p = rng.dirichlet(np.repeat(self.alpha, m))
            raw = p / p.sum() * (m * per)
            out[:, k] = np.ceil(raw) if self.rounding == "ceil" else raw
        return dict(zip(self.layout, np.split(out, np.cumsum(list(self.layout.values()))[:-1])))


def class_blocks(labels: np.ndarray, counts: np.ndarray, rng: np.random.Generator | None = None) -> list[np.ndarray]:
    """One domain's clients' indices: of each class, client after client, the next counts[client, class] indices of
    that class, in archive order (or in a random order drawn from `rng`): no index on two clients; the last
    clients of a class that runs out get what is left. Each client's indices ascending."""
    shards = [[np.zeros(0, np.int64)] for _ in counts]
    for k in range(counts.shape[1]):
        pool = np.flatnonzero(labels == k)
        pool = pool if rng is None else rng.permutation(pool)
        start = 0
        for j, n in enumerate(counts[:, k]):
            shards[j].append(pool[start:start + n])
            start += n
    return [np.sort(np.concatenate(s)) for s in shards]


def per_class_plan(per_class: tuple[int, int], clients_per_domain: dict[str, int],
                   skew: LabelSkew | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A per-class protocol's (FedPLVM's) counts, per domain run: its clients' training class counts (clients x
    classes) and the class counts of its test set. Label iid: k_train of each class for each client, the first k_test
    of each class to test; under `skew` the drawn counts, the test set the sum of its clients' drawn test counts
    (one client per domain, as the paper: that client's)."""
    if skew is None:
        return {d: (np.full((n, NUM_CLASSES), per_class[0]), np.full(NUM_CLASSES, per_class[1]))
                for d, n in clients_per_domain.items()}
    train, test = skew.counts(per_class[0]), skew.counts(per_class[1])
    return {d: (train[d], test[d].sum(axis=0)) for d in clients_per_domain}


def domain_per_class(plan: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """What `load_domain` keeps of a domain for a per-class plan's clients (`per_class_plan`): the first of each class
    its clients take together, and its test counts."""
    return plan[0].sum(axis=0), plan[1]


def load_counts(per_class: tuple[int, int] | None, clients_per_domain: dict[str, int],
                skew: LabelSkew | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """Per domain run, the `per_class` argument of `load_domain` that every side of a run (plan, client groups,
    driver) passes for it: None outside a per-class protocol."""
    if per_class is None:
        return None
    return {d: domain_per_class(p) for d, p in per_class_plan(per_class, clients_per_domain, skew).items()}


def plan_clients(root: Path, dataset: str, clients_per_domain: dict[str, int], pct: float | None, seed: int,
                 fraction: float = 1.0, per_class: tuple[int, int] | None = None, ways: int | None = None,
                 skew: LabelSkew | None = None, stdev: int = STDEV, shots: int = SHOTS) -> list[dict]:
    """Every client's id, domain and training indices, domains and clients in order.

    Each domain's pool is partitioned with its own seeded stream (seed, domain
    position), so the same seed gives the same partition on any machine and
    dropping a domain leaves the others' partitions unchanged. With `per_class`
    (FedPLVM) a domain's clients take, one after another, the next k_train of each class
    (k_train scaled by `fraction`, at least 1; `per_class_plan`); their indices are into
    `load_domain(..., per_class=domain_per_class(...))`'s training set. With `ways` (FedProto) the
    domain's clients get FedProto's n-way k-shot split (`benchmark.fewshot`, n and k drawn about `ways` and
    `shots` with `stdev`): each also its `classes` and `test_indices` into the domain's test set. With `skew` (FedPLVM's
    Dirichlet label skew) the clients' class counts are drawn (`LabelSkew`): under a per-class
    protocol from the first of each class, under FPL's share protocol (each client about
    int(pct N) samples) from a seeded random order of each class; each client then also
    records its `class_counts` (and `test_class_counts` under a per-class protocol).
    """
    order = list(DATASETS[dataset])
    clients = []
    for d, n_clients in clients_per_domain.items():
        if ways is not None:
            dom = load_domain(root, dataset, d)
            try:
                split = nway_kshot_split(dom.train_y, dom.test_y, n_clients, ways, [seed, order.index(d)],
                                         shots=shots, stdev=stdev, fraction=fraction)
            except ValueError as e:
                raise DataError(f"{dataset}/{d}: {e}") from None
            clients += [{"id": len(clients) + i, "domain": d, **c, "num_samples": len(c["indices"])}
                        for i, c in enumerate(split)]
            continue
        extra = [{} for _ in range(n_clients)]
        if per_class is not None:
            plan = per_class_plan(per_class, clients_per_domain, skew)[d]
            dom = load_domain(root, dataset, d, need_test=skew is not None, per_class=domain_per_class(plan))
            labels = dom.train_y
            counts = (np.maximum(1, (fraction * plan[0]).astype(np.int64)) if skew is None
                      else (fraction * plan[0]).astype(np.int64))
            shards = class_blocks(labels, counts)
            if skew is not None:  # what each client got (a class with fewer images than drawn gives what it has)
                test = np.bincount(dom.test_y, minlength=NUM_CLASSES).tolist()
                extra = [{"class_counts": np.bincount(labels[s], minlength=NUM_CLASSES).tolist(),
                          "test_class_counts": test} for s in shards]
        else:
            train_stem, test_stem = DATASETS[dataset][d]
            office = test_stem is None
            labels = np.concatenate([np.load(root / f, allow_pickle=False)["y"]
                                     for f in archive_files(root, train_stem)])
            if office:
                labels = labels[office_split(len(labels))[0]]
            try:
                if skew is None:
                    shards = partition_domain(labels, n_clients, pct, [seed, order.index(d)], fraction,
                                              fill_missing_classes=office)
                else:  # about int(pct N) each (scaled by `fraction`), its classes drawn
                    per = max(1, int(fraction * int(pct * len(labels)))) / NUM_CLASSES
                    shards = class_blocks(labels, skew.counts({d: per})[d],
                                          np.random.default_rng([seed, order.index(d)]))
                    extra = [{"class_counts": np.bincount(labels[s], minlength=NUM_CLASSES).tolist()} for s in shards]
            except DataError as e:
                raise DataError(f"{dataset}/{d}: {e}") from None
        for shard, more in zip(shards, extra):
            if not len(shard):
                raise DataError(f"{dataset}/{d}: the split gives client {len(clients)} no sample"
                                + ("" if skew is None else f" (the Dirichlet draw of --dirichlet-seed {skew.seed}; "
                                   "use another --dirichlet-seed or a larger --dirichlet-alpha)") + ".")
            clients.append({"id": len(clients), "domain": d, "indices": shard.tolist(), "num_samples": len(shard),
                            **more})
    return clients
