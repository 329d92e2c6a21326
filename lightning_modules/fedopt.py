"""FedOpt (server SGD with momentum): clients train CE only (`FedAvgClient`).

Sashank J. Reddi, Zachary Charles, Manzil Zaheer, Zachary Garrett, Keith Rush, Jakub Konečný,
Sanjiv Kumar, H. Brendan McMahan. "Adaptive Federated Optimization." ICLR 2021.

Server: SGD with momentum on the pseudo-gradient w_global - mean(w_clients) of the
parameters; BatchNorm buffers take the mean (docs/deviations.md, 10). Where the step starts (`step_from`):
Reddi et al.'s steps from the global model, w_global - lr * m (`global`); RethinkFL's code, behind FPL's
Table 2, steps from the clients' mean, mean - lr * m (`mean`): its ResNet's duplicated `state_dict()` keys load
the mean over the parameters before its optimiser steps. The mean is
unweighted over clients like RethinkFL's and MarsFL's `mean(dim=0)` (`weighting=uniform`,
the default), or sample-weighted (`weighting=samples`).
"""
from __future__ import annotations

import torch

from lightning_modules.fedavg import FedAvgServer
from lightning_modules.server import State, cast_like


class FedOptServer(FedAvgServer):
    state_attrs = ("momentum_buf",)

    @staticmethod
    def client_weight(hparams, num_samples):
        return 1.0 if hparams["weighting"] == "uniform" else float(num_samples)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.momentum_buf: State = {}

    def aggregate(self, global_state, mean64, round_idx, share=1.0):
        new = dict(mean64)
        for k in self.param_keys:
            grad = global_state[k].to(torch.float64) - mean64[k]
            buf = self.momentum_buf.get(k)
            buf = grad if buf is None else self.hparams["server_momentum"] * buf + grad
            self.momentum_buf[k] = buf
            base = mean64[k] if self.hparams["step_from"] == "mean" else global_state[k].to(torch.float64)
            new[k] = base - self.hparams["server_lr"] * buf
        return cast_like(new, global_state)
