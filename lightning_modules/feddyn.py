"""FedDyn: dynamic regularisation, a per-client gradient correction and a server h-state.

Durmus Alp Emre Acar, Yue Zhao, Ramon Matas Navarro, Matthew Mattina, Paul N. Whatmough,
Venkatesh Saligrama. "Federated Learning Based on Dynamic Regularization." ICLR 2021.

Client: CE - <g_k, w> + (alpha / 2) ||w - w_global||^2, where g_k is the client's
gradient correction (its client state, kept across rounds; 0 at first), updated after
local training: g_k <- g_k - alpha (w_k - w_global).
Server: h <- h - alpha * mean(w_k - w_global); w <- mean(w_k) - h / alpha on the
parameters; BatchNorm buffers take the mean (README deviation 9).
The correction is held in buffers `correction_<i>` (one per parameter) so that the fused
engine gives every client its own.
"""
from __future__ import annotations

import torch

from benchmark.server import State, cast_like
from lightning_modules.base import ClientModule
from lightning_modules.fedavg import FedAvgServer


class FedDynClient(ClientModule):
    def corrections(self) -> list[torch.Tensor]:
        return [getattr(self, f"correction_{i}") for i in range(len(self.global_params))]

    def start_round(self, round_idx, payload, global_state, client_state=None):
        super().start_round(round_idx, payload, global_state, client_state)
        self.global_params = [p.detach().clone() for p in self.net.parameters()]
        for i, p in enumerate(self.global_params):
            g = client_state[i] if client_state is not None else torch.zeros_like(p)
            self.register_buffer(f"correction_{i}", g.detach().to(p).clone())

    def extra_loss(self, x, y, logits, z):
        params = list(self.net.parameters())
        linear = torch.stack([(g * p).sum() for g, p in zip(self.corrections(), params)]).sum()
        prox = torch.stack([(p - w).pow(2).sum() for p, w in zip(params, self.global_params)]).sum()
        return -linear + self.hparams["alpha"] / 2 * prox

    def client_state(self):
        alpha = self.hparams["alpha"]
        return [g - alpha * (p.detach() - w) for g, p, w in zip(self.corrections(), self.net.parameters(), self.global_params)]


class FedDynServer(FedAvgServer):
    """The mean over clients is the sample-weighted mean (every client takes part each round)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h: State = {}

    def aggregate(self, global_state, mean64, round_idx):
        alpha = self.hparams["alpha"]
        new = dict(mean64)
        for k in self.param_keys:
            g = global_state[k].to(torch.float64)
            self.h[k] = self.h.get(k, torch.zeros_like(g)) - alpha * (mean64[k] - g)
            new[k] = mean64[k] - self.h[k] / alpha
        return cast_like(new, global_state)
