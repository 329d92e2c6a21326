"""Executors: where a run's client groups live. `LocalExecutor` holds them as plain objects in this process, each
group's calls in a thread of its own (the groups train at the same time, each on its --cpus-per-actor threads);
`RayExecutor` holds each in a Ray actor (the group itself, `lightning_modules.clients.ClientGroup`, as the actor's
class: a thin shell that adds its Ray node to its provenance) with its CPU / GPU share, placed by Ray's default
scheduling or spread over the nodes (`--spread`), restarts a dead actor and rebuilds its clients from their states.
Both give the driver the same calls (`map`, `put`, the clients' persistent states).
"""
from __future__ import annotations

import time
from collections.abc import MutableMapping
from concurrent.futures import ThreadPoolExecutor, wait

import torch

from benchmark.spill import DiskStore
from lightning_modules.clients import (ClientGroup, StaleClientStates, cpu_threads, resolve_client_memory,
                                       trains_beside_others)
from ray_jobs.config import RunConfig


def assign_groups(clients: list[dict], num_groups: int) -> list[list[dict]]:
    """The clients over the groups with their samples balanced, since a round waits for its slowest group: the
    largest client first, each to the group with the fewest samples so far (the first of equals); each group's
    clients in id order. Which group trains a client does not change a run's numbers (docs/reliability.md).
    FPL's Office-Caltech clients over 2 groups: 505 and 485 samples, where dealing them out in turn gave 561 and
    429."""
    n = min(num_groups, len(clients))
    groups, totals = [[] for _ in range(n)], [0] * n
    for c in sorted(clients, key=lambda c: -c["num_samples"]):  # stable: equal sizes in id order
        g = totals.index(min(totals))
        groups[g].append(c)
        totals[g] += c["num_samples"]
    return [sorted(g, key=lambda c: c["id"]) for g in groups if g]


def threads_at_once(cfg: RunConfig) -> tuple[int, int, int]:
    """The CPU threads a run in one process on the CPU (`LocalExecutor`) keeps busy, as (client groups training at
    the same time, each one's threads, the driver's threads): the groups (one per --num-actors, at most one per
    client) all at once where they train beside each other (`trains_beside_others`), else one at a time, each on
    `cpu_threads(cpus_per_actor)`; the driver on `cpu_threads(driver_cpus)` between their calls (it waits on them,
    they wait on it). The run's threads at once: the larger of groups x each and the driver's."""
    groups = min(cfg.num_actors, sum(cfg.clients_per_domain.values())) if trains_beside_others(cfg) else 1
    return groups, cpu_threads(cfg.cpus_per_actor), cpu_threads(cfg.driver_cpus)


RESTART_TIMEOUT_S = 600  # a restarting client actor that is not back by then stops the run


def ray_placement() -> dict:
    """Where Ray placed this process: its node, the resources it holds (e.g. {"CPU": 1.0, "GPU": 0.05}) and the ids
    of the GPUs Ray gave it (several actors on one GPU share its id); empty outside Ray."""
    import ray

    if not ray.is_initialized():
        return {}
    context = ray.get_runtime_context()
    return {"ray_node": context.get_node_id(), "ray_resources": context.get_assigned_resources(),
            "ray_gpu_ids": [str(g) for g in ray.get_gpu_ids()]}


class RayClientGroup(ClientGroup):
    """A client group as a Ray actor: the group itself, its provenance with where Ray placed it (`ray_placement`)."""

    def describe(self) -> dict:
        return {**super().describe(), **ray_placement()}


class ActorFailed(RuntimeError):
    """A client actor died more often than the run allows (`actor_restarts`)."""


class Executor:
    """Client groups and what the driver knows of their clients' persistent states: `client_states` (client id
    -> `client_state()`, on the CPU) after round `states_round`, the states any group must start round
    `states_round + 1` from (a restarted or resumed group gets them with `set_client_states`). Ray actors that
    Ray may restart send them with every round's results (`RunConfig.states_every_round`); otherwise they are
    read only for a checkpoint (`collect_states`). Under `--client-memory disk` they are kept on disk too
    (`DiskStore`)."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        disk = resolve_client_memory(cfg.client_memory, cfg.participation) == "disk"
        self.client_states: MutableMapping[int, object] = DiskStore() if disk else {}
        self.states_round = -1
        self.notes: list[str] = []  # what happened (actor restarts), for the entry point to print

    def states_of(self, members: list[int]) -> dict:
        return {cid: self.client_states[cid] for cid in members if cid in self.client_states}

    def collect_states(self) -> None:
        """`client_states` as of `states_round`: read from the groups, unless they send them every round."""
        if not self.cfg.states_every_round:
            for states in self.map("persistent_states"):
                self.client_states.update(states)


class LocalExecutor(Executor):
    """Client groups as plain objects in this process. Their calls run in threads, each with the group's CPU threads
    (--cpus-per-actor, as a Ray actor's): the groups at the same time, one thread each, where every group gives the
    numbers it gives alone that way (`trains_beside_others`: on the CPU with the sequential engine,
    without dropout); otherwise one after another in one thread (on a GPU in the calling thread, as before). A
    group's kernels are then those of a Ray actor with the same share, so a run's numbers are the same either way,
    and as they were when the groups ran one after another in the driver's thread (tests/test_reliability.py). The
    driver's own work (aggregation, evaluation) stays in the calling thread, on its --driver-cpus threads."""

    concurrent = True  # False: one group after another whatever they are (the bench's comparison with before)

    def __init__(self, cfg: RunConfig, groups: list[list[dict]], data_root: str):
        super().__init__(cfg)
        self.groups = [ClientGroup(cfg, g, data_root) for g in groups]
        together = self.concurrent and trains_beside_others(cfg)
        self.parallel = together and len(self.groups) > 1  # a round's local training: the slowest group's, else the sum
        # on a GPU the groups stay in the calling thread, as before (untried there in threads)
        gpu = any(g.device.type == "cuda" for g in self.groups)
        self.threads = None if gpu else ThreadPoolExecutor(len(self.groups) if together else 1, "client-group",
                                                           initializer=torch.set_num_threads,
                                                           initargs=(cpu_threads(cfg.cpus_per_actor),))

    def put(self, obj):
        return obj

    def map(self, name: str, *args) -> list:
        """Every group's call, in group order; the first group's error, once every call has ended."""
        if self.threads is None:
            return [getattr(g, name)(*args) for g in self.groups]
        calls = [self.threads.submit(getattr(g, name), *args) for g in self.groups]
        wait(calls)
        return [c.result() for c in calls]


class RayExecutor(Executor):
    """Client groups in Ray actors with the configured CPU / GPU shares (fractions allowed).

    An actor that dies (process killed, out of memory) is restarted by Ray (`max_restarts`). A call that
    failed with it, or a `train` that finds its group restarted since the last round (`StaleClientStates`),
    is made again after the group got its clients' states as of the round's start: the clients are
    rebuilt from their data and those states, and the round completes with the same result. After
    `actor_restarts` restarts of one actor the run stops naming its clients."""

    parallel = True  # the groups train at the same time: a round's local training is the slowest group's

    def __init__(self, cfg: RunConfig, groups: list[list[dict]], data_root: str):
        import ray

        super().__init__(cfg)
        self.ray = ray
        actor = ray.remote(RayClientGroup).options(num_cpus=cfg.cpus_per_actor, num_gpus=cfg.gpus_per_actor,
                                                   max_restarts=cfg.actor_restarts, max_task_retries=0,
                                                   scheduling_strategy="SPREAD" if cfg.spread else "DEFAULT")
        self.groups = [actor.remote(cfg, g, data_root) for g in groups]
        self.members = [[c["id"] for c in g] for g in groups]
        self.failures = [0] * len(groups)
        self.limit = cfg.actor_restarts

    def put(self, obj):
        return self.ray.put(obj)  # once per round, shared by every actor

    def map(self, name: str, *args) -> list:
        refs = [getattr(g, name).remote(*args) for g in self.groups]
        out = []
        for i, ref in enumerate(refs):
            recovering = None  # since when actor i is being restarted (one death, however many calls fail)
            while True:
                try:
                    out.append(self.ray.get(ref))
                    break
                except (self.ray.exceptions.RayActorError, StaleClientStates) as e:
                    restarting = isinstance(e, (self.ray.exceptions.ActorUnavailableError, StaleClientStates))
                    if recovering is None or not restarting:  # a new death (ActorDiedError: Ray gave up on it)
                        self.count_failure(i, e, name)
                        recovering = time.monotonic()
                    elif time.monotonic() - recovering > RESTART_TIMEOUT_S:
                        raise ActorFailed(f"client actor {i} (clients {self.members[i]}) did not come back within "
                                          f"{RESTART_TIMEOUT_S} s of its restart ({e}); the run stopped.") from None
                    else:
                        time.sleep(0.2)
                    ref = self.resubmit(i, name, args)
        return out

    def count_failure(self, i: int, error: Exception, name: str) -> None:
        self.failures[i] += 1
        if isinstance(error, StaleClientStates):
            reason = "its process was restarted since the last round"
        else:
            reason = f"Ray: {type(error).__name__}"  # ActorDiedError, or ActorUnavailableError while restarting
        if self.failures[i] > self.limit:
            raise ActorFailed(
                f"client actor {i} (clients {self.members[i]}) died {self.failures[i]} times in this run, more than "
                f"--actor-restarts {self.limit} allows ({reason}); the run stopped without dropping its clients. "
                "Check the node's memory and logs, or raise --actor-restarts.") from None
        self.notes.append(f"client actor {i} (clients {self.members[i]}) died ({reason}); Ray restarted it, its "
                          "clients are rebuilt from their data and their states as of the round's start and the call "
                          f"{name} is repeated ({self.failures[i]} of {self.limit} restarts used)")

    def resubmit(self, i: int, name: str, args: tuple):
        """Actor i's clients' states as of the round's start, then the call again (one caller: in that order)."""
        group = self.groups[i]
        group.set_client_states.remote(self.states_of(self.members[i]), self.states_round)
        return getattr(group, name).remote(*args)
