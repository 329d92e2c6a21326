"""Server-side rules: how the global model and the method's payload are made each round.

A rule gets the sample-weighted mean of the client state_dicts (computed in
float64 from the partial sums of the client actors) and the clients' local
prototypes, and returns the next global state_dict and the payload sent to the
clients with it.
"""
from __future__ import annotations

import torch

from benchmark.prototypes import cluster_prototypes, mean_prototypes

State = dict[str, torch.Tensor]


def accumulate(acc: State | None, state: State, weight: float) -> State:
    """acc + weight * state over every key (BatchNorm buffers included), in float64 on the state's device."""
    if acc is None:
        acc = {k: torch.zeros(v.shape, dtype=torch.float64, device=v.device) for k, v in state.items()}
    for k, v in state.items():
        acc[k].add_(v.detach().to(torch.float64), alpha=float(weight))
    return acc


def weighted_sum(states: list[State], weights: list[float]) -> State:
    """sum_i w_i * state_i, in float64."""
    acc = None
    for state, w in zip(states, weights):
        acc = accumulate(acc, state, w)
    return acc


def add_sums(a: State | None, b: State) -> State:
    if a is None:
        return b
    return {k: a[k] + b[k] for k in a}


def cast_like(state64: State, like: State) -> State:
    """float64 state back to the dtypes of `like` (integer buffers rounded)."""
    out = {}
    for k, v in state64.items():
        dtype = like[k].dtype
        out[k] = (v.round() if not dtype.is_floating_point else v).to(dtype)
    return out


def fedavg(states: list[State], weights: list[float]) -> State:
    """Weighted FedAvg of whole state_dicts, BatchNorm buffers included."""
    total = float(sum(weights))
    mean = {k: v / total for k, v in weighted_sum(states, weights).items()}
    return cast_like(mean, states[0])


class ServerRule:
    """FedAvg: the global model is the sample-weighted mean; no payload."""

    def __init__(self, hp: dict, num_classes: int, dim: int, rounds: int, param_keys: list[str]):
        self.hp, self.num_classes, self.dim, self.rounds = hp, num_classes, dim, rounds
        self.param_keys = param_keys  # keys of trainable parameters (not buffers)

    def aggregate(self, global_state: State, mean64: State, round_idx: int) -> State:
        return cast_like(mean64, global_state)

    def payload(self, client_protos: dict, round_idx: int) -> dict:
        """What the clients get with the weights of round round_idx + 1."""
        return {}


class FedOptServer(ServerRule):
    """Server SGD with momentum on the pseudo-gradient w_global - mean(w_clients) (parameters);
    buffers take the mean."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.momentum_buf: State = {}

    def aggregate(self, global_state, mean64, round_idx):
        new = dict(mean64)
        for k in self.param_keys:
            grad = global_state[k].to(torch.float64) - mean64[k]
            buf = self.momentum_buf.get(k)
            buf = grad if buf is None else self.hp["server_momentum"] * buf + grad
            self.momentum_buf[k] = buf
            new[k] = global_state[k].to(torch.float64) - self.hp["server_lr"] * buf
        return cast_like(new, global_state)


class FedDynServer(ServerRule):
    """FedDyn (Acar et al. 2021): h <- h - alpha * mean(w_k - w_global); w <- mean(w_k) - h / alpha.

    The mean over clients is the sample-weighted mean (every client takes part each round)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h: State = {}

    def aggregate(self, global_state, mean64, round_idx):
        alpha = self.hp["alpha"]
        new = dict(mean64)
        for k in self.param_keys:
            g = global_state[k].to(torch.float64)
            self.h[k] = self.h.get(k, torch.zeros_like(g)) - alpha * (mean64[k] - g)
            new[k] = mean64[k] - self.h[k] / alpha
        return cast_like(new, global_state)


class MeanPrototypeServer(ServerRule):
    """FedProto / FedProc: the global prototype of a class is the mean of the clients' prototypes."""

    def payload(self, client_protos, round_idx):
        return {"global_protos": mean_prototypes(client_protos, self.num_classes, self.dim)}


class FPLServer(ServerRule):
    """FPL: FINCH cluster prototypes and unbiased prototypes per class (plus the plain means
    for the ablations that use global prototypes)."""

    def payload(self, client_protos, round_idx):
        protos, labels, unbiased = cluster_prototypes(client_protos, self.num_classes, self.dim)
        return {
            "cluster_protos": protos,
            "cluster_labels": labels,
            "unbiased_protos": unbiased,
            "global_protos": mean_prototypes(client_protos, self.num_classes, self.dim),
        }


class FedProcServer(MeanPrototypeServer):
    """FedProc: mean global prototypes plus the contrastive weight a = 1 - r / (R - 1) of the next round."""

    def payload(self, client_protos, round_idx):
        r, R = round_idx + 1, self.rounds
        return {**super().payload(client_protos, round_idx), "weight_a": 1.0 - r / (R - 1) if R > 1 else 0.0}
