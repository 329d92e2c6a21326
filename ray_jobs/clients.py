"""A group of clients held by one process: their data shards as resident tensors, one module.

The same class runs in-process (`--executor local`) and as a Ray actor. Clients
of a group train one after another on one LightningModule whose weights are
reloaded from the round's global state for each client; what a client must keep
between rounds (MOON's previous model, FedDyn's h_k) is stored per client id
here, never in the shared module (a client seen for the first time gets the
module's `initial_client_state`). The group returns the sum of its clients'
weights, each weighted as the method's server rule asks (`client_weight`: the
sample count, or 1 for an unweighted mean), so weights leave an actor once per
round, not once per client.

Engines (`engine` in the config): `sequential` trains the clients one after
another with `fit_local`; `fused` trains the clients of equal size (equal step
counts) together as one batched computation with `fit_fused` (a client of a
size no other client of the group has trains alone, with `fit_local`). Both give
the same training; `auto` picks sequential on the CPU, fused on CUDA (README).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from benchmark.config import ENGINES, RunConfig
from benchmark.data import load_domain, to_tensor_images
from benchmark.methods import METHODS
from benchmark.provenance import describe_process
from benchmark.server import RoundPayload, State, accumulate
from lightning_modules.base import NonFiniteLoss, fit_local
from lightning_modules.fused import FusedNonFiniteLoss, fit_fused
from lightning_modules.resnet import build_model


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_engine(name: str, device: torch.device) -> str:
    """auto: the one-client-at-a-time loop on the CPU (grouped convolutions are slow in the CPU
    kernels, `make bench`), the fused engine on CUDA."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; choose one of: {', '.join(ENGINES)}.")
    if name == "auto":
        return "fused" if device.type == "cuda" else "sequential"
    return name


class StaleClientStates(RuntimeError):
    """A client group was asked to train a round without its clients' states of the round before (its
    process was restarted since): the driver gives them back and asks again."""


def to_cpu(obj):
    """A client state (tensors, possibly in dicts, lists, tuples) with every tensor on the CPU."""
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def client_generator(seed: int, round_idx: int, client_id: int) -> torch.Generator:
    """The client's shuffling and augmentation stream for one round: same on any executor."""
    state = np.random.SeedSequence([seed, round_idx, client_id]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


class ClientGroup:
    states_round = -1  # client_states are those after this round (-1: none yet, a fresh process)

    def __init__(self, cfg: RunConfig, clients: list[dict], data_root: str):
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        if self.device.type == "cpu":  # the actor's CPU share, in or out of Ray: same kernels, same numbers
            torch.set_num_threads(max(1, int(cfg.cpus_per_actor)))
        self.clients = clients
        spec = cfg.dataset_spec
        domains = sorted({c["domain"] for c in clients})
        raw = {d: load_domain(Path(data_root), cfg.dataset, d, need_test=False, per_class=spec.per_class) for d in domains}
        self.data = {}
        for c in clients:
            dom = raw[c["domain"]]
            idx = np.asarray(c["indices"])
            x = to_tensor_images(dom.train_x[idx], spec.image_size).to(self.device)
            y = torch.from_numpy(dom.train_y[idx]).to(self.device)
            self.data[c["id"]] = (x, y)
        net = build_model(spec.model, spec.num_classes)  # its weights are the round's global state before each fit
        self.module = METHODS[cfg.method].client(
            net, cfg.hparams, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        ).to(self.device)
        self.module.precision_mode = cfg.precision
        self.module.transform = spec.transform
        self.client_states: dict[int, object] = {}

    def describe(self) -> dict:
        """Provenance: this process's machine, the engine it trains with and its clients."""
        return {**describe_process(self.device), "engine": resolve_engine(self.cfg.engine, self.device),
                "clients": [c["id"] for c in self.clients]}

    def subgroups(self) -> list[list[dict]]:
        """Clients trained together: one by one (sequential), or those of equal size (fused)."""
        if resolve_engine(self.cfg.engine, self.device) == "sequential":
            return [[c] for c in self.clients]
        by_size: dict[int, list[dict]] = {}
        for c in self.clients:
            by_size.setdefault(len(self.data[c["id"]][1]), []).append(c)
        return list(by_size.values())

    def start_client(self, c: dict, global_state: State, payload: RoundPayload | None, round_idx: int) -> None:
        """Client c's starting state in the module: the global weights, its own state, the round's inputs."""
        state = (self.client_states[c["id"]] if c["id"] in self.client_states
                 else self.module.initial_client_state(self.cfg.seed, c))
        self.module.start_round(round_idx, payload, global_state, state)
        if self.cfg.test_faults.get("nan_loss") == [round_idx, c["id"]]:  # test-only: a non-finite loss
            with torch.no_grad():
                next(self.module.net.parameters()).fill_(float("nan"))

    def set_client_states(self, states: dict, after_round: int) -> None:
        """Take the persistent states of this group's clients after round `after_round` (a resumed run, or a
        restarted actor)."""
        mine = {c["id"] for c in self.clients}
        self.client_states.update({cid: s for cid, s in states.items() if cid in mine})
        self.states_round = after_round

    def train(self, global_state: State, payload: RoundPayload | None, round_idx: int) -> dict:
        """Train every client of the group from the global state and the payload of round round_idx;
        return the partial sum of the trained weights weighted by the rule's `client_weight`, its total
        weight, and per client its prototypes, loss and persistent state (`client_state()`, on the CPU: None
        for stateless methods, so only methods with a state send one)."""
        if self.states_round != round_idx - 1:  # a restarted process: it must not train from initial states
            raise StaleClientStates(f"this client group holds client states after round {self.states_round}, "
                                    f"round {round_idx} needs those after round {round_idx - 1}")
        cfg = self.cfg
        client_weight = METHODS[cfg.method].server.client_weight
        weight_sum, total, protos, losses, states = None, 0, {}, {}, {}
        start = time.perf_counter()
        for members in self.subgroups():
            gens = [client_generator(cfg.seed, round_idx, c["id"]) for c in members]
            data = [self.data[c["id"]] for c in members]
            try:
                if len(members) == 1:
                    self.start_client(members[0], global_state, payload, round_idx)
                    member_losses = [fit_local(self.module, *data[0], cfg.local_epochs, cfg.batch_size, gens[0],
                                               cfg.drop_last)]
                    load = lambda i: None  # noqa: E731  (the module holds the one client)
                else:
                    member_losses, load = fit_fused(
                        self.module, lambda i: self.start_client(members[i], global_state, payload, round_idx),
                        data, cfg.local_epochs, cfg.batch_size, gens, cfg.drop_last)
            except NonFiniteLoss as e:
                c = members[e.index if isinstance(e, FusedNonFiniteLoss) else 0]
                raise NonFiniteLoss(self.non_finite("loss", round_idx, c)) from None
            for i, c in enumerate(members):
                load(i)
                cid, n = c["id"], len(data[i][1])
                weights = self.module.net.state_dict()
                if not bool(torch.stack([torch.isfinite(v).all() for v in weights.values() if v.is_floating_point()]).all()):
                    raise NonFiniteLoss(self.non_finite("weights", round_idx, c))
                losses[cid] = member_losses[i]
                self.client_states[cid] = self.module.client_state()
                states[cid] = to_cpu(self.client_states[cid])
                w = client_weight(cfg.hparams, n)
                weight_sum = accumulate(weight_sum, weights, w)
                total += w
                protos[cid] = self.module.local_prototypes()
        self.states_round = round_idx
        return {"sum": {k: v.cpu() for k, v in weight_sum.items()}, "weight": total, "protos": protos, "losses": losses,
                "states": states, "train_s": time.perf_counter() - start}

    def non_finite(self, what: str, round_idx: int, c: dict) -> str:
        return (f"non-finite {what} in round {round_idx}, client {c['id']} ({c['domain']}), method {self.cfg.method}; "
                "its weights were discarded, nothing of the round was averaged and the run stopped. Lower the "
                "learning rate or raise tau.")
