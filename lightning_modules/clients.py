"""The client side of a round: a group of clients held by one process, their data shards as resident tensors,
one module, the engines that train them (`fit_local`, `fit_fused`).

The same class runs in-process (`--executor local`) and as a Ray actor (`ray_jobs.executors` wraps it, nothing
more). It takes the run's configuration (`ray_jobs.config.RunConfig`, or any object with its fields; it reads the
method, its hyperparameters, the protocol's training values, the engine, device and precision) without importing
it: the layer that runs things stands on this one, not the other way. Clients
of a group train one after another on one LightningModule whose weights are
reloaded from the round's global state for each client; what a client must keep
between rounds (MOON's previous model, FedDyn's h_k) is stored per client id
here, never in the shared module (a client seen for the first time gets the
module's `initial_client_state`). The group returns the sum of its clients'
weights, each weighted as the method's server rule asks (`client_weight`: the
sample count, or 1 for an unweighted mean), so weights leave an actor once per
round, not once per client.

Under a rule that averages no weights (`averages_weights` false: FedProto as published, Local)
each client keeps its own model here from round to round, beside its client state, starting from
its own seeded initialisation; the group then returns no weight sum. Under a rule that keeps a part of
the model on the clients (FedPer, FedRep: `ServerRule.travelling`) only the rest is summed and counted;
under a per-client rule (FeSEM: `ServerRule.per_client`) the group also returns each client's trained
weights, and each client starts from its own entry of the global state (a dict client id -> state_dict).
A method may give clients models of other architectures (`Method.client_model`, FedProto-mh): the group
holds one module per architecture. Protocols with per-client test sets (clients with `test_indices`) are evaluated here
(`evaluate`), each client on its own test samples with its own model (or the global one); so are
clients with a model of their own (`ServerRule.personal_models`) on a protocol of domain test sets, each on
its domain's.

Engines (`engine` in the config): `sequential` trains the clients one after
another with `fit_local`; `fused` trains the group's clients of one architecture
(all of them, but FedProto-mh's) together as one batched computation with
`fit_fused`, whatever their sizes (a client alone with its architecture trains
with `fit_local`). Both give the same training; `auto` picks sequential on the
CPU, fused on CUDA (docs/speed.md).
"""
from __future__ import annotations

import time
from collections.abc import MutableMapping
from pathlib import Path

import numpy as np
import torch

from benchmark.communication import count
from benchmark.data import domain_test_set, load_domain, to_tensor_images
from benchmark.models import MODELS, build_model
from benchmark.protocols import unknown_name
from benchmark.provenance import describe_process, peak_memory, reset_peak_memory
from benchmark.spill import DiskStore
from lightning_modules.base import (GLOBAL_STREAM, ClientModule, NonFiniteLoss, eval_batch, fit_local,
                                    own_initialisation, precision_context)
from lightning_modules.fused import FusedNonFiniteLoss, fit_fused
from lightning_modules.privacy import model_options, private
from lightning_modules.prototypes import nearest_prototype
from lightning_modules.registry import METHODS
from lightning_modules.server import RoundPayload, State, accumulate

ENGINES = ("auto", "sequential", "fused")  # how a group trains its clients (`resolve_engine`)
# where a group keeps its clients between their rounds (`resolve_client_memory`)
CLIENT_MEMORY = ("auto", "device", "host", "disk")


def aggregation_weight(cfg, rule, n: int) -> float:
    """A client's weight in the average of round weights, from its n training samples: the rule's `client_weight`
    of n, or of 1 when the protocol averages each client alike (`aggregation="uniform"`)."""
    return rule.client_weight(cfg.hparams, n if cfg.aggregation == "samples" else 1)


def resolve_device(name: str, gpu_share: float | None = None) -> torch.device:
    """`--device` in this process. auto: cuda when the process sees a GPU and, in a Ray actor (`gpu_share`: the
    GPUs Ray reserved for it), only with a share: recent Ray (2.60 here) no longer hides the GPUs from an actor that
    reserved none, and such an actor would crowd onto GPU 0 unseen by Ray's scheduler."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() and (gpu_share is None or gpu_share > 0) else "cpu")
    return torch.device(name)


def cpu_threads(cpus: float) -> int:
    """torch's CPU threads for a process's (or, under the local executor, a thread's) share of `cpus` CPUs
    (`--cpus-per-actor`, `--driver-cpus`): its whole CPUs, at least 1."""
    return max(1, int(cpus))


def use_cudnn_benchmark(device: torch.device, on: bool) -> None:
    """`--cudnn-benchmark` in this process (a client group's or the driver's): on CUDA, cuDNN times each
    convolution shape's algorithms once and keeps the fastest; the fused engine's vmapped convolutions are grouped
    ones, for which cuDNN's default choice may be slow (`make bench` (4) measures both on a GPU). No effect on the
    CPU, which has no cuDNN."""
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = on


def resolve_engine(name: str, device: torch.device, hparams=None) -> str:
    """auto: the one-client-at-a-time loop on the CPU (grouped convolutions are slow in the CPU
    kernels, `make bench`), the fused engine on CUDA; the sequential one under DP-SGD (`hparams`' dp_sgd), which
    the fused engine cannot run."""
    if name not in ENGINES:
        raise ValueError(unknown_name("engine", name, ENGINES))
    if name == "auto":
        return "fused" if device.type == "cuda" and not private(hparams or {}) else "sequential"
    return name


def resolve_client_memory(name: str, participation: float) -> str:
    """auto: host memory when a round trains a share of the clients (`--participation` below 1), the device
    otherwise (every client trains every round: nothing to gain from moving them)."""
    if name == "auto":
        return "host" if participation < 1 else "device"
    return name


def trains_beside_others(cfg) -> bool:
    """Whether a run's client groups in one process (the local executor's) give the numbers each gives alone when
    they train in threads beside each other: on the CPU, where each thread's kernels run on its own CPU threads, with
    the sequential engine (the fused engine's vmap and torch.compile are not tried in threads), and without a model
    that draws from torch's global random stream while training (FedProto's CNN's dropout), which the threads would
    share. (Every client's model is of the dataset's class: `ClientGroup.make_module`.)"""
    device = resolve_device(cfg.device)
    return (device.type == "cpu" and resolve_engine(cfg.engine, device, cfg.hparams) == "sequential"
            and not getattr(MODELS[cfg.dataset_spec.model], "global_stream", False))


class StaleClientStates(RuntimeError):
    """A client group was asked to train a round without its clients' states of the round before (its
    process was restarted since): the driver gives them back and asks again."""


def to_device(obj, device: torch.device | str):
    """A client state (tensors, possibly in dicts, lists, tuples) with every tensor on `device`."""
    if torch.is_tensor(obj):
        return obj.detach().to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def to_cpu(obj):
    """A client state with every tensor on the CPU."""
    return to_device(obj, "cpu")


def client_generator(seed: int, round_idx: int, client_id: int) -> torch.Generator:
    """The client's shuffling and augmentation stream for one round: same on any executor."""
    state = np.random.SeedSequence([seed, round_idx, client_id]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


class ClientGroup:
    states_round = -1  # client_states are those after this round (-1: none yet, a fresh process)
    host_resident = False  # (`__init__` sets it from the config)

    def __init__(self, cfg, clients: list[dict], data_root: str):
        self.cfg = cfg
        self.device = resolve_device(cfg.device, cfg.gpus_per_actor if cfg.executor == "ray" else None)
        use_cudnn_benchmark(self.device, cfg.cudnn_benchmark)
        if cfg.executor == "ray":  # its own process; in-process groups count from the driver's reset, the run's start
            reset_peak_memory(self.device)
        if self.device.type == "cpu":  # the actor's CPU share, in or out of Ray: same kernels, same numbers
            torch.set_num_threads(cpu_threads(cfg.cpus_per_actor))
        self.clients = clients
        # host: the clients' images, own test samples, persistent states and own models live in host memory
        # (pinned on CUDA) and only the clients training or tested now are on the device (`on_device`, bookkept:
        # `peak_on_device` is the most clients' tensors the device held at once); device: all of them, always
        # disk: as host, and the persistent states and own models in files between a client's rounds (`DiskStore`)
        memory = resolve_client_memory(cfg.client_memory, cfg.participation)
        self.host_resident = memory in ("host", "disk")
        self.on_device: set[int] = set() if self.host_resident else {c["id"] for c in clients}
        self.peak_on_device = len(self.on_device)
        spec = cfg.dataset_spec
        domains = sorted({c["domain"] for c in clients})
        # clients tested in the group: those with their own test samples, and under a rule that gives each client a
        # model of its own every client, on its domain's test set (as capped by eval_max)
        personal = METHODS[cfg.method].server.personal_models
        whole = {c["domain"] for c in clients if "test_indices" not in c and personal}
        tested = whole | {c["domain"] for c in clients if "test_indices" in c}
        raw = {d: load_domain(Path(data_root), cfg.dataset, d, need_test=d in tested, per_class=cfg.domain_per_class(d))
               for d in domains}
        domain_tests = {}  # one copy of a domain's test set for its clients here
        for d in whole:
            x, y = domain_test_set(raw[d], spec, cfg.eval_max)
            domain_tests[d] = (x.to(self.device), y.to(self.device), list(range(spec.num_classes)))
        self.data, self.test_data = {}, {}
        for c in clients:
            dom = raw[c["domain"]]
            idx = np.asarray(c["indices"])
            x = to_tensor_images(dom.train_x[idx], spec.image_size, spec.channels)
            self.data[c["id"]] = (self.at_home(x), self.at_home(torch.from_numpy(dom.train_y[idx])))
            if "test_indices" in c:  # the client's own test samples and classes
                tidx = np.asarray(c["test_indices"])
                self.test_data[c["id"]] = (
                    self.at_home(to_tensor_images(dom.test_x[tidx], spec.image_size, spec.channels)),
                    self.at_home(torch.from_numpy(dom.test_y[tidx])), c["classes"])
            elif personal:
                self.test_data[c["id"]] = domain_tests[c["domain"]]
        # one module per architecture (its weights are a client's starting state before each fit)
        self.module = self.make_module(self.model_kwargs(clients[0]))
        self.arch_modules = {self.arch(c): self.make_module(self.model_kwargs(c)) for c in clients
                             if self.arch(c) != self.arch(clients[0])}
        self.client_states: MutableMapping[int, object] = DiskStore() if memory == "disk" else {}
        # rules that average no weights: each client's own model
        self.own_models: MutableMapping[int, State] = DiskStore() if memory == "disk" else {}

    def at_home(self, t: torch.Tensor) -> torch.Tensor:
        """A client's tensor where the group keeps it between rounds: on the device, or in host memory (pinned when
        the device is a GPU, so that its copy there is fast)."""
        if not self.host_resident:
            return t.to(self.device)
        return t.pin_memory() if self.device.type == "cuda" else t

    def fetch(self, cids: list[int], what: dict) -> list:
        """Clients' entries of `what` (self.data or self.test_data) on the device, the clients now counted as held
        there until `release`."""
        if not self.host_resident:  # all of them are there
            return [what[cid] for cid in cids]
        self.on_device.update(cids)
        self.peak_on_device = max(self.peak_on_device, len(self.on_device))
        return [tuple(v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v for v in what[cid])
                for cid in cids]

    def release(self, cids: list[int]) -> None:
        """The clients' tensors leave the device (host residency; the group dropped its references to them)."""
        if self.host_resident:
            self.on_device.difference_update(cids)

    def keep(self, obj):
        """A client's persistent state or own model as the group keeps it: on the CPU under host residency."""
        return to_cpu(obj) if self.host_resident else obj

    def make_module(self, model_kwargs: dict) -> ClientModule:
        cfg, spec = self.cfg, self.cfg.dataset_spec
        module = METHODS[cfg.method].client(build_model(spec.model, spec.num_classes, **model_kwargs), cfg.hparams,
                                            lr=cfg.lr, momentum=cfg.momentum,
                                            weight_decay=cfg.weight_decay).to(self.device)
        module.precision_mode = cfg.precision
        module.transform = cfg.transform
        module.run_rounds = cfg.rounds
        return module

    def model_kwargs(self, c: dict) -> dict:
        """Client c's model options: those its training needs (`privacy.model_options`: GroupNorm under DP-SGD) and
        its own (`Method.client_model`); none: the dataset's model as it is."""
        f = METHODS[self.cfg.method].client_model
        return {**model_options(self.cfg.hparams), **({} if f is None else f(c["id"]))}

    def arch(self, c: dict) -> tuple:
        return tuple(sorted(self.model_kwargs(c).items()))

    def module_for(self, c: dict) -> ClientModule:
        """The module of client c's architecture."""
        if METHODS[self.cfg.method].client_model is None or self.arch(c) not in self.arch_modules:
            return self.module
        return self.arch_modules[self.arch(c)]

    def own_model(self, c: dict) -> State:
        """Client c's own model: its last trained weights, before its first round its own initialisation."""
        if c["id"] not in self.own_models:
            net = self.module_for(c).net
            self.own_models[c["id"]] = own_initialisation(type(net), net.num_classes, self.cfg.seed, c["id"],
                                                          **self.model_kwargs(c))
        return self.own_models[c["id"]]

    @property
    def engine(self) -> str:
        """The engine the group trains with (`auto` resolved for its device)."""
        return resolve_engine(self.cfg.engine, self.device, self.cfg.hparams)

    def describe(self) -> dict:
        """Provenance: this process's machine, the engine it trains with and its clients."""
        return {**describe_process(self.device), "engine": self.engine,
                "clients": [c["id"] for c in self.clients]}

    def peak_memory(self) -> dict:
        """This process's peak memory so far (`benchmark.provenance.peak_memory`)."""
        return peak_memory(self.device)

    def subgroups(self, round_idx: int = 1, drawn: list[int] | None = None) -> list[list[dict]]:
        """The group's clients that train in round `round_idx` (those in `drawn`; None: every one), as they train
        together: one by one (sequential), or those of one architecture (fused: all of them, but under
        FedProto-mh's per-client models). In round 0 under `client_init="own"` one by one whatever the engine:
        every client starts from its own weights, and what a module takes from its start weights outside its
        tensors (FedProx's anchor, FedDyn's sent model, MOON's global model) would be the last client's for the
        whole subgroup."""
        clients = self.clients if drawn is None else [c for c in self.clients if c["id"] in drawn]
        if self.engine == "sequential" or self.cfg.starts_apart(round_idx):
            return [[c] for c in clients]
        by_arch: dict[tuple, list[dict]] = {}
        for c in clients:
            by_arch.setdefault(self.arch(c), []).append(c)
        return list(by_arch.values())

    def start_weights(self, c: dict, global_state: State | None, round_idx: int | None = None) -> State:
        """Client c's weights before its fit of round `round_idx` (None: at the round's end, to test it): the
        global ones; its own under a rule that averages none; its own entry of the global state under a per-client
        rule; under the protocol's `client_init="own"` its own initialisation in round 0 (seeded from (seed, client
        id), FedPLVM's one model per client)."""
        rule = METHODS[self.cfg.method].server
        if not rule.averages_weights:
            return self.own_model(c)
        if round_idx is not None and self.cfg.starts_apart(round_idx):
            net = self.module_for(c).net
            return own_initialisation(type(net), net.num_classes, self.cfg.seed, c["id"], **self.model_kwargs(c))
        return global_state[c["id"]] if rule.per_client else global_state

    def start_client(self, c: dict, global_state: State | None, payload: RoundPayload | None, round_idx: int) -> None:
        """Client c's starting state in its module: its starting weights, its own state, the round's inputs."""
        module = self.module_for(c)
        state = (to_device(self.client_states[c["id"]], self.device) if c["id"] in self.client_states
                 else module.initial_client_state(self.cfg.seed, c))
        module.start_round(round_idx, payload, self.start_weights(c, global_state, round_idx), state)
        if self.cfg.test_faults.get("nan_loss") == [round_idx, c["id"]]:  # test-only: a non-finite loss
            with torch.no_grad():
                next(module.net.parameters()).fill_(float("nan"))

    def persistent_state(self, cid: int):
        """What client cid keeps to its next round, on the CPU: its `client_state()`, and under a rule that
        averages no weights also its own model (so checkpoints and restarted actors keep it)."""
        state = to_cpu(self.client_states[cid])
        if METHODS[self.cfg.method].server.averages_weights:
            return state
        return {"own_model": to_cpu(self.own_models[cid]), "client_state": state}

    def persistent_states(self) -> dict:
        """Every client's `persistent_state` (of those that trained): the driver reads them for a checkpoint."""
        return {c["id"]: self.persistent_state(c["id"]) for c in self.clients if c["id"] in self.client_states}

    def set_client_states(self, states: dict, after_round: int) -> None:
        """Take the persistent states (`persistent_state`) of this group's clients after round `after_round` (a
        resumed run, or a restarted actor)."""
        mine = {c["id"] for c in self.clients}
        own = not METHODS[self.cfg.method].server.averages_weights
        for cid, s in states.items():
            if cid in mine:
                if own:
                    self.own_models[cid], s = s["own_model"], s["client_state"]
                self.client_states[cid] = s
        self.states_round = after_round

    def train(self, global_state: State, payload: RoundPayload | None, round_idx: int,
              drawn: list[int] | None = None) -> dict:
        """Train the group's clients drawn for round round_idx (`drawn`: the round's participants, None: every
        client) from the global state and the payload of the round; the others keep their state as it is;
        return the partial sum of the trained weights weighted by the rule's `client_weight`, its total
        weight, and per client its prototypes, loss and, when `cfg.states_every_round` (a Ray actor that may be
        restarted), persistent state (`persistent_state`, on the CPU: None for stateless methods that average
        weights, so only methods with a state send one; the driver needs it every round to rebuild a restarted
        actor, otherwise it reads `persistent_states` only when it writes a checkpoint). Under a rule
        that averages no weights each client trains its own model and keeps it here; the sum is then None.
        Also per client the (entries, bytes) of the weights it uploads (none under such a rule, the travelling part
        under one that keeps a part on the clients), and under a per-client rule its uploaded weights (on the CPU)
        and its weight in the rule's means (`uploads`, `client_weights`)."""
        if self.states_round != round_idx - 1:  # a restarted process: it must not train from initial states
            raise StaleClientStates(f"this client group holds client states after round {self.states_round}, "
                                    f"round {round_idx} needs those after round {round_idx - 1}")
        cfg = self.cfg
        rule = METHODS[cfg.method].server
        weight_sum, total, protos, losses, states, sent, uploads, client_weights = None, 0, {}, {}, {}, {}, {}, {}
        start = time.perf_counter()
        for members in self.subgroups(round_idx, drawn):
            module = self.module_for(members[0])
            gens = [client_generator(cfg.seed, round_idx, c["id"]) for c in members]
            # torch's global stream (dropout, in FedProto's CNN) from (seed, round, first client): the same draws
            # on any executor and after a resume
            with GLOBAL_STREAM:
                torch.manual_seed(int(torch.randint(2**62, (),
                                                    generator=client_generator(cfg.seed, round_idx, members[0]["id"]))))
            data = self.fetch([c["id"] for c in members], self.data)
            try:
                if len(members) == 1:
                    self.start_client(members[0], global_state, payload, round_idx)
                    member_losses = [fit_local(module, *data[0], cfg.local_epochs, cfg.batch_size, gens[0],
                                               cfg.drop_last)]
                    load = lambda i: None  # noqa: E731  (the module holds the one client)
                else:
                    member_losses, load = fit_fused(
                        module, lambda i: self.start_client(members[i], global_state, payload, round_idx),
                        data, cfg.local_epochs, cfg.batch_size, gens, cfg.drop_last, cfg.compile)
            except NonFiniteLoss as e:
                c = members[e.index if isinstance(e, FusedNonFiniteLoss) else 0]
                raise NonFiniteLoss(self.non_finite("loss", round_idx, c)) from None
            for i, c in enumerate(members):
                load(i)
                cid, n = c["id"], len(data[i][1])
                weights = module.net.state_dict()
                if not bool(torch.stack([torch.isfinite(v).all() for v in weights.values()
                                         if v.is_floating_point()]).all()):
                    raise NonFiniteLoss(self.non_finite("weights", round_idx, c))
                losses[cid] = member_losses[i]
                self.client_states[cid] = self.keep(module.client_state())
                shared = rule.travelling(cfg.hparams, weights)  # what the client uploads
                if rule.averages_weights:
                    w = aggregation_weight(cfg, rule, n)
                    weight_sum = accumulate(weight_sum, shared, w)
                    total += w
                    if rule.per_client:
                        uploads[cid] = {k: v.detach().cpu().clone() for k, v in shared.items()}
                        client_weights[cid] = w
                else:
                    self.own_models[cid] = {k: self.keep(v.detach().clone()) for k, v in weights.items()}
                if cfg.states_every_round:
                    states[cid] = self.persistent_state(cid)
                sent[cid] = count(shared) if rule.averages_weights else (0, 0)  # (entries, bytes) uploaded
                protos[cid] = module.local_prototypes(*data[i], gens[i])
            del data
            self.release([c["id"] for c in members])
        self.states_round = round_idx
        return {"sum": None if weight_sum is None else {k: v.cpu() for k, v in weight_sum.items()}, "weight": total,
                "protos": protos, "losses": losses, "states": states, "sent_weights": sent, "uploads": uploads,
                "client_weights": client_weights, "train_s": time.perf_counter() - start}

    def non_finite(self, what: str, round_idx: int, c: dict) -> str:
        return (f"non-finite {what} in round {round_idx}, client {c['id']} ({c['domain']}), method {self.cfg.method}; "
                "its weights were discarded, nothing of the round was averaged and the run stopped. Lower the "
                "learning rate" + (" or raise tau" if "tau" in METHODS[self.cfg.method].defaults else "") + ".")

    def own_model_states(self) -> dict[int, State]:
        """Every client's own model (on the CPU), under a rule that averages no weights."""
        return {cid: {k: v.cpu() for k, v in state.items()} for cid, state in self.own_models.items()}

    def tested_module(self, c: dict, global_state: State | None) -> ClientModule:
        """Client c's module holding the model it is tested with (its own, its entry of a per-client global state,
        or the global one, with the part it keeps put back: `personalise`), in eval mode."""
        module = self.module_for(c)
        module.net.load_state_dict(module.personalise(self.start_weights(c, global_state),
                                                      self.client_states.get(c["id"])))
        module.eval()
        return module

    @torch.no_grad()
    def test_features(self, global_state: State | None) -> dict[int, tuple]:
        """Every client's features of its own test samples with the model it is tested with (`evaluate`'s), as
        float16 numpy, and their labels (FedProto's Figure 2)."""
        out, batch_size = {}, eval_batch(self.device)
        for c in self.clients:
            if c["id"] not in self.test_data:
                continue
            x, y, _ = self.fetch([c["id"]], self.test_data)[0]
            module = self.tested_module(c, global_state)
            z = []
            for i in range(0, len(y), batch_size):
                with precision_context(self.cfg.precision, self.device):
                    z.append(module.net(module.transform.eval(x[i:i + batch_size]))[1].float().cpu())
            out[c["id"]] = (torch.cat(z).half().numpy(), y.cpu().numpy())
            self.release([c["id"]])
        return out

    @torch.no_grad()
    def evaluate(self, global_state: State | None, payload: RoundPayload | None, batch_size: int | None = None) -> dict:
        """Every client with its own test samples, tested with the model it ends the round with (its own, its entry
        of a per-client global state, or the global one, with the part it keeps put back: `personalise`), in eval
        mode: per client its number of test samples and of correct predictions by the classifier's argmax, and,
        when the payload has prototypes to test with (`RoundPayload.test_prototypes`: FedProto's global ones,
        FedPCL's client's own), by the nearest of them (L2) among the client's own classes."""
        by_prototype = payload is not None and payload.test_prototypes(self.clients[0]["id"]) is not None
        rules = ("classifier", "prototype") if by_prototype else ("classifier",)
        batch_size = batch_size or eval_batch(self.device)
        correct = {}  # per client its counts by rule, on the device: one host sync for every client
        for c in self.clients:
            if c["id"] not in self.test_data:
                continue
            x, y, classes = self.fetch([c["id"]], self.test_data)[0]
            module = self.tested_module(c, global_state)
            counts = torch.zeros(len(rules), dtype=torch.long, device=y.device)
            protos = payload.test_prototypes(c["id"]) if by_prototype else None
            if protos is not None:  # on the device once per client, not per batch
                protos_here, classes_here = protos.to(y.device), torch.as_tensor(classes, device=y.device)
            for i in range(0, len(y), batch_size):
                with precision_context(self.cfg.precision, self.device):
                    logits, z = module.net(module.transform.eval(x[i:i + batch_size]))
                yb = y[i:i + batch_size]
                counts[0] += (logits.argmax(1) == yb).sum()
                if protos is not None:
                    pred = nearest_prototype(z.float(), protos_here, classes_here)
                    counts[1] += (pred == yb).sum()
            correct[c["id"]] = counts
            del x, y
            self.release([c["id"]])
        if not correct:
            return {}
        counts = torch.stack(list(correct.values())).tolist()
        return {cid: {"n": len(self.test_data[cid][1]), **dict(zip(rules, n))} for cid, n in zip(correct, counts)}
