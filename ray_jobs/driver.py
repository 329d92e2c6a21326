"""The driver: runs the rounds. Broadcast, local training in the client groups,
aggregation, prototype clustering, evaluation of the global model on every domain.

Under a rule that averages no weights (FedProto as published, Local) the driver holds no
global model: only the payload travels. Under a per-client rule (FeSEM) the global state is a dict client id ->
the state_dict that client starts its next round from (its cluster's centre). Protocols with per-client test sets
(FedProto's n-way k-shot split) are evaluated in the client groups, each client with the model it ends
the round with; the accuracy is the mean over clients of their accuracies. Without a global
model on a protocol of domain test sets (FedProto as published in `make table-all`) each client
tests its own model on its domain's test set in its group; a domain's accuracy is the mean over
its clients.

`Driver` is a plain class: the Ray executor runs it as an actor and holds the
client groups in Ray actors; the local executor runs both in this process (`ray_jobs.executors`). The
round code is the same.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from benchmark import communication
from benchmark.data import domain_test_set, load_domain
from benchmark.models import build_model
from benchmark.provenance import describe_process, peak_memory, reset_peak_memory
from lightning_modules.base import eval_batch, own_initialisation, precision_context
from lightning_modules.clients import aggregation_weight, cpu_threads, resolve_device, use_cudnn_benchmark
from lightning_modules.privacy import model_options
from lightning_modules.prototypes import held_prototypes, per_class_count
from lightning_modules.registry import METHODS
from lightning_modules.server import State, accumulate, cast_like, weighted_mean
from ray_jobs.config import RunConfig
from ray_jobs.executors import LocalExecutor, RayExecutor, assign_groups, ray_placement


def client_accuracies(per_client: dict[int, dict]) -> dict[str, dict[str, float]]:
    """Per client (id as a string), the accuracy (percent) of each inference rule from its counts."""
    return {str(c): {rule: 100.0 * v / r["n"] for rule, v in r.items() if rule != "n"}
            for c, r in sorted(per_client.items())}


def client_mean_accuracy(per_client: dict[int, dict]) -> dict[str, float]:
    """The mean over clients of their accuracies (not the accuracy of all test samples pooled), per inference
    rule (`classifier`; `prototype` when there are global prototypes); AVG is the prototype rule's when there is
    one (FedProto's inference), else the classifier's."""
    per = client_accuracies(per_client)
    rules = [rule for rule in ("classifier", "prototype") if all(rule in a for a in per.values())]
    acc = {rule: float(np.mean([a[rule] for a in per.values()])) for rule in rules}
    return {**acc, "AVG": acc.get("prototype", acc["classifier"])}


def domain_mean_accuracy(per_client: dict[int, dict], domain_of: dict[int, str],
                         domains: list[str]) -> dict[str, float]:
    """Clients tested on their domain's test set with their own models: per domain the mean over its clients,
    AVG the mean over domains (unweighted, as for a global model), by the rule `client_mean_accuracy` reports
    (the nearest global prototype when there are global prototypes, FedProto's inference, else the classifier)."""
    per = client_accuracies(per_client)
    rule = "prototype" if all("prototype" in a for a in per.values()) else "classifier"
    acc = {d: float(np.mean([a[rule] for c, a in per.items() if domain_of[int(c)] == d])) for d in domains}
    return {**acc, "AVG": float(np.mean([acc[d] for d in domains]))}


class Driver:
    def __init__(self, cfg: RunConfig, clients: list[dict], data_root: str):
        self.cfg = cfg
        self.device = resolve_device(cfg.device, cfg.driver_gpus if cfg.executor == "ray" else None)
        use_cudnn_benchmark(self.device, cfg.cudnn_benchmark)
        reset_peak_memory(self.device)
        spec = cfg.dataset_spec
        torch.manual_seed(cfg.seed)  # one initialisation for every client
        self.model_options = model_options(cfg.hparams)  # (GroupNorm under DP-SGD)
        model = build_model(spec.model, spec.num_classes, **self.model_options)
        self.rule = METHODS[cfg.method].server(
            cfg.hparams, num_classes=spec.num_classes, feature_dim=model.feature_dim, rounds=cfg.rounds,
            param_keys=[k for k, _ in model.named_parameters()],
        )
        # None: no global model (a rule that averages no weights; each client keeps its own in its group); under a
        # per-client rule every client's entry, at first the one initialisation
        init = {k: v.clone() for k, v in model.state_dict().items()}
        self.global_state = (None if not self.rule.averages_weights
                             else {c["id"]: init for c in clients} if self.rule.per_client else init)
        self.model = model.to(self.device)
        self.payload = None  # round 0: no prototypes yet
        self.last_protos = None  # the prototypes the clients uploaded in the last round, when prototypes travel
        self.client_test_sizes = {c["id"]: len(c["test_indices"]) for c in clients if "test_indices" in c}
        # clients with models of their own on a protocol of domain test sets: each on its domain's (in its group)
        self.domain_of = ({} if not self.rule.personal_models or self.client_test_sizes
                          else {c["id"]: c["domain"] for c in clients})
        self.test_sets, self.domain_test_sizes = {}, {}  # the global model's test sets; their sizes
        for d in ([] if self.client_test_sizes else cfg.domains):
            x, y = domain_test_set(load_domain(Path(data_root), cfg.dataset, d, need_train=False,
                                               per_class=cfg.domain_per_class(d)), spec, cfg.eval_max)
            self.domain_test_sizes[d] = len(y)
            if not self.domain_of:  # (else the client groups hold them)
                self.test_sets[d] = (x.to(self.device), y.to(self.device))
        mean_size = float(np.mean([c["num_samples"] for c in clients]))  # data_share: n_k / mean n (FedDyn's alpha_k)
        self.clients = clients = [{**c, "data_share": c["num_samples"] / mean_size} for c in clients]
        executor = RayExecutor if cfg.executor == "ray" else LocalExecutor
        self.executor = executor(cfg, assign_groups(clients, cfg.num_actors), data_root)
        # the driver's CPU threads (aggregation, clustering, evaluation): its actor's share under Ray; in process set
        # after the groups, which set theirs (`ClientGroup`) and train in threads of their own (`LocalExecutor`)
        torch.set_num_threads(cpu_threads(cfg.driver_cpus))

    def start_state(self, r: int, drawn: list[int] | None = None) -> State:
        """The weights the clients started round r from, as the rule averages them (what FedOpt's pseudo-gradient
        and FedDyn's drift step from): the global ones, but in round 0 under `client_init="own"` the mean of the
        own initialisations of the clients that trained (`drawn`; None: every client), weighted as their trained
        weights are (`aggregation_weight`)."""
        if not self.cfg.starts_apart(r):
            return self.global_state
        acc, total = None, 0.0
        for c in (c for c in self.clients if drawn is None or c["id"] in drawn):
            w = aggregation_weight(self.cfg, self.rule, c["num_samples"])
            acc = accumulate(acc, own_initialisation(type(self.model), self.model.num_classes, self.cfg.seed, c["id"],
                                                     **self.model_options), w)
            total += w
        return cast_like({k: v / total for k, v in acc.items()}, self.global_state)

    def checkpoint(self) -> dict:
        """What the next round reads: global model, server rule state, payload, every client's state."""
        ex = self.executor
        ex.collect_states()
        return {"global_state": self.global_state, "rule_state": self.rule.state_dict(), "payload": self.payload,
                "client_states": dict(ex.client_states), "states_round": ex.states_round}  # (read from disk if there)

    def restore(self, ck: dict) -> None:
        """Continue from a checkpoint (`checkpoint()`'s content): the client groups get their clients' states."""
        self.global_state = ck["global_state"]
        self.rule.load_state_dict(ck["rule_state"])
        self.payload = ck["payload"]
        ex = self.executor
        ex.client_states.update(ck["client_states"])
        ex.states_round = ck["states_round"]
        ex.map("set_client_states", ex.put(dict(ex.client_states)), ex.states_round)  # one copy for every actor

    def final_state(self) -> dict[str, torch.Tensor] | None:
        """The model to keep in the run folder, the one evaluated (`evaluated_state`): floating tensors in
        float16 (half the size), on the CPU. None when there is no global model (none, or one per client)."""
        if self.global_state is None or self.rule.per_client:
            return None
        state = self.rule.evaluated_state(self.global_state)
        return {k: (v.half() if v.is_floating_point() else v).cpu() for k, v in state.items()}

    def final_features(self) -> dict[str, np.ndarray] | None:
        """Under a protocol of per-client test samples (FedProto's), what its Figure 2 draws (`FEATURES_FILE`):
        every client's test features with the model it ends the run with (`z`, float16), their labels `y` and
        clients `client`; when prototypes travel, the last round's local ones (`local_z`, `local_y`,
        `local_client`) and the global ones the clients are tested with (`global_z`, `global_y`). None under
        domain test sets (model.pt holds the global model)."""
        if not self.client_test_sizes:
            return None
        state = None if self.global_state is None else self.rule.evaluated_state(self.global_state)
        per = {cid: f for part in self.executor.map("test_features", self.executor.put(state))
               for cid, f in part.items()}
        ids = sorted(per)
        out = {"z": np.concatenate([per[c][0] for c in ids]), "y": np.concatenate([per[c][1] for c in ids]),
               "client": np.concatenate([np.full(len(per[c][1]), c) for c in ids])}
        if self.last_protos:
            rows = [(cid, k, v.float().reshape(-1, v.shape[-1])) for cid in sorted(self.last_protos)
                    for k, v in sorted(self.last_protos[cid].items())]
            out |= {"local_z": torch.cat([v for _, _, v in rows]).half().numpy(),
                    "local_y": np.concatenate([np.full(len(v), k) for _, k, v in rows]),
                    "local_client": np.concatenate([np.full(len(v), cid) for cid, _, v in rows])}
        glob = getattr(self.payload, "global_protos", None)
        if torch.is_tensor(glob) and glob.shape[0] == self.rule.num_classes:  # NaN rows: classes no client holds
            held, classes = held_prototypes(glob.float().cpu())
            out |= {"global_z": held.half().numpy(), "global_y": classes.numpy()}
        return out

    def describe(self) -> dict:
        """Provenance: the executor, the driver's process and every client actor's (machine, device, engine)."""
        driver = describe_process(self.device)
        if self.cfg.executor == "ray":
            driver |= ray_placement()
        return {"executor": self.cfg.executor, "driver": driver,
                "actors": self.executor.map("describe")}

    def peak_memory(self) -> dict:
        """The driver's and every client actor's peak memory so far (`benchmark.provenance.peak_memory`); under the
        local executor they are one process."""
        return {"driver": peak_memory(self.device), "actors": self.executor.map("peak_memory")}

    def test_sizes(self) -> dict[str, int]:
        if self.client_test_sizes:
            return {f"client{c}": n for c, n in sorted(self.client_test_sizes.items())}
        return dict(self.domain_test_sizes)

    def run_round(self, r: int) -> dict:
        t0 = time.perf_counter()
        sent_state, sent_payload = self.global_state, self.payload
        state_ref = self.executor.put(sent_state)
        payload_ref = self.executor.put(sent_payload)
        # prototype vectors each client gets (FedPLVM's Table 4)
        received = getattr(sent_payload, "num_prototypes", None)
        # the round's participants (`--participation`; every client at 1): only they train, upload and count
        drawn = self.cfg.participants(r, [c["id"] for c in self.clients])
        results = self.executor.map("train", state_ref, payload_ref, r,
                                    None if len(drawn) == len(self.clients) else drawn)
        t1 = time.perf_counter()

        if self.rule.per_client:  # a client not drawn keeps its entry (`aggregate_clients` returns none for it)
            self.global_state = {**self.global_state, **self.rule.aggregate_clients(
                {cid: u for res in results for cid, u in res["uploads"].items()},
                {cid: w for res in results for cid, w in res["client_weights"].items()}, r)}
        elif self.rule.averages_weights:
            mean64 = weighted_mean([res["sum"] for res in results], [res["weight"] for res in results])
            self.global_state = self.rule.aggregate(self.start_state(r, drawn), mean64, r,
                                                    len(drawn) / len(self.clients))
        t2 = time.perf_counter()

        protos = {cid: p for res in results for cid, p in res["protos"].items()}
        self.payload = self.rule.payload(protos, r)
        self.last_protos = protos if self.payload is not None else None
        t3 = time.perf_counter()

        # the clients' states after this round before the evaluation: a client group restarted during it gets
        # its clients' own models of this round back
        self.executor.client_states.update({cid: st for res in results for cid, st in res["states"].items()})
        self.executor.states_round = r
        acc = per_client = None  # a round the schedule does not evaluate (`RunConfig.evaluates`) records none
        if self.cfg.evaluates(r):
            per_client = self.evaluate_clients() if self.client_test_sizes or self.domain_of else None
            if per_client is None:
                acc = self.evaluate()
            elif self.domain_of:
                acc = domain_mean_accuracy(per_client, self.domain_of, self.cfg.domains)
            else:
                acc = client_mean_accuracy(per_client)
        t4 = time.perf_counter()
        losses = {cid: l for res in results for cid, l in res["losses"].items()}
        train_s = (max if self.executor.parallel else sum)(res["train_s"] for res in results)
        notes, self.executor.notes[:] = list(self.executor.notes), []
        sent_weights = {cid: n for res in results for cid, n in res["sent_weights"].items()}
        comm = {str(c): communication.client_round(
            # prototypes travel when the rule uses them
            sent_weights[c], protos[c] if self.payload is not None else None,
            self.received_weights(sent_state, c, r), sent_payload) for c in sorted(sent_weights)}
        return {
            "notes": notes,  # printed by the entry point, not recorded in metrics.jsonl
            "round": r,
            "trained_clients": drawn,
            **({} if received is None else {"prototypes_received": received}),
            # prototypes a client uploads per class it holds, when prototypes travel (FedPLVM's Figure 9)
            **({} if self.payload is None else
               {"local_prototypes_per_class": {str(c): per_class_count(protos[c]) for c in sorted(protos)}}),
            "evaluated": acc is not None,
            **({} if acc is None else {"accuracy": acc}),
            **({} if per_client is None else {"client_accuracy": client_accuracies(per_client)}),
            **self.rule.round_record(self.global_state),
            "train_loss": float(np.mean([losses[c] for c in sorted(losses)])),
            "client_loss": {str(c): losses[c] for c in sorted(losses)},
            "communication": {"per_client": comm, "mean_per_client": communication.mean_per_client(comm)},
            "time_s": {
                "local_training": train_s,
                "transfer_and_scheduling": (t1 - t0) - train_s,
                "aggregation": t2 - t1,
                "clustering": t3 - t2,
                "evaluation": t4 - t3,
                "round": t4 - t0,
            },
        }

    def received_weights(self, sent_state, client_id: int, r: int) -> State | None:
        """What client `client_id` received of the global state in round r: the part that travels (all of it, or
        FedPer's and FedRep's body), its own entry under a per-client rule (FeSEM's centre); nothing without a
        global model, nor in round 0 under client_init="own" (each starts from its own initialisation)."""
        if not self.rule.averages_weights or self.cfg.starts_apart(r):
            return None
        return self.rule.travelling(self.cfg.hparams, sent_state[client_id] if self.rule.per_client else sent_state)

    def evaluate_clients(self) -> dict[int, dict]:
        """Each client on its own test samples, in its group (`ClientGroup.evaluate`), with the model it ends
        the round with: its own under a rule that averages no weights, else the evaluated global model."""
        state = None if self.global_state is None else self.rule.evaluated_state(self.global_state)
        results = self.executor.map("evaluate", self.executor.put(state), self.executor.put(self.payload))
        return {cid: res for part in results for cid, res in part.items()}

    @torch.no_grad()
    def evaluate(self, batch_size: int | None = None) -> dict[str, float]:
        """Accuracy (percent) of the rule's evaluated model (the global model but for FedDyn), eval mode,
        on every domain's test set, `batch_size` images per forward pass (None: the device's `eval_batch`); AVG
        unweighted."""
        batch_size = batch_size or eval_batch(self.device)
        self.model.load_state_dict(self.rule.evaluated_state(self.global_state))
        self.model.eval()
        correct = {}  # counts stay on the device: one host sync for all test sets
        for d, (x, y) in self.test_sets.items():
            correct[d] = torch.zeros((), dtype=torch.long, device=y.device)
            for i in range(0, len(y), batch_size):
                with precision_context(self.cfg.precision, self.device):
                    logits, _ = self.model(self.cfg.dataset_spec.transform.eval(x[i : i + batch_size]))
                correct[d] += (logits.argmax(1) == y[i : i + batch_size]).sum()
        counts = torch.stack(list(correct.values())).tolist() if correct else []
        acc = {d: 100.0 * n / len(self.test_sets[d][1]) for d, n in zip(correct, counts)}
        acc["AVG"] = float(np.mean([acc[d] for d in self.test_sets]))
        return acc
