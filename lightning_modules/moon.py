"""MOON: model-contrastive federated learning; FedAvg on the server (`FedAvgServer`).

Qinbin Li, Bingsheng He, Dawn Song. "Model-Contrastive Federated Learning." CVPR 2021,
pp. 10713-10722.

Client: CE + mu * model-contrastive loss on the 512-d features, the positive pair
(z, z_global), the negative (z, z_previous), cosine similarity over temperature. The
global model and the client's previous local model are frozen copies (no gradient); the
previous model is this client's state, kept across rounds. As in RethinkFL's `moon.py`
(the defaults; docs/deviations.md, 12):
- `frozen_mode=train`: the frozen models run in training mode, their BatchNorm on batch
  statistics (their running statistics, never aggregated, are not updated:
  `track_running_stats` off); `eval` runs them on running statistics.
- `initial_previous=own`: in round 0 the previous model is the client's own random
  initialisation (drawn from (seed, client id), the same on any executor), so the MOON
  term is active from round 0; `global` uses the round's starting model, which makes the
  round-0 term a constant.
- `double_forward=true`: BatchNorm running statistics move twice per step, as with the
  reference's two forward passes (`bn_updates_per_step`; docs/deviations.md, 18).
The global model is the same for every client of a round (`shared_state`: the fused
engine keeps one copy of it for all clients), the previous model is each client's own.
"""
from __future__ import annotations

import copy

import torch

from lightning_modules.base import ClientModule, bn_updates_per_step, own_initialisation  # noqa: F401 (re-export)
from lightning_modules.losses import moon_loss


class MOONClient(ClientModule):
    shared_state = ("global_net.",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.global_net = copy.deepcopy(self.net).requires_grad_(False)
        self.previous_net = copy.deepcopy(self.net).requires_grad_(False)
        for m in [*self.global_net.modules(), *self.previous_net.modules()]:
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.track_running_stats = False  # training mode: batch statistics, running ones untouched
        self.train(self.training)

    def initial_client_state(self, seed, client):
        if self.hparams["initial_previous"] != "own":
            return None
        return own_initialisation(type(self.net), self.num_classes, seed, client["id"])

    def start_round(self, round_idx, payload, global_state, client_state=None):
        super().start_round(round_idx, payload, global_state, client_state)
        bn_updates_per_step(self.net, 2 if self.hparams["double_forward"] else 1)
        self.global_net.load_state_dict(global_state)
        self.previous_net.load_state_dict(global_state if client_state is None else client_state)

    def train(self, mode: bool = True):
        # fit_local calls module.train(): the frozen models are submodules and follow `frozen_mode`
        super().train(mode)
        if self.hparams["frozen_mode"] == "eval":
            self.global_net.eval()
            self.previous_net.eval()
        return self

    def client_state(self):
        return {k: v.detach().clone() for k, v in self.net.state_dict().items()}

    def extra_loss(self, x, y, logits, z):
        with torch.no_grad():
            z_glob = self.global_net.features(x)
            z_prev = self.previous_net.features(x)
        return self.hparams["mu"] * moon_loss(z, z_glob, z_prev, self.hparams["temperature"])
