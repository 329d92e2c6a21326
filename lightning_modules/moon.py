"""MOON: model-contrastive federated learning; FedAvg on the server (`FedAvgServer`).

Qinbin Li, Bingsheng He, Dawn Song. "Model-Contrastive Federated Learning." CVPR 2021,
pp. 10713-10722.

Client: CE + mu * model-contrastive loss on the 512-d features, the positive pair
(z, z_global), the negative (z, z_previous), cosine similarity over temperature. The
global model and the client's previous local model are frozen copies, in eval mode
(README deviation 12); the previous model is this client's state, kept across rounds;
in round 0 it is the client's starting model.
The global model is the same for every client of a round (`shared_state`: the fused
engine keeps one copy of it for all clients), the previous model is each client's own.
"""
from __future__ import annotations

import copy

import torch

from lightning_modules.base import ClientModule
from lightning_modules.losses import moon_loss


class MOONClient(ClientModule):
    shared_state = ("global_net.",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.global_net = copy.deepcopy(self.net).requires_grad_(False).eval()
        self.previous_net = copy.deepcopy(self.net).requires_grad_(False).eval()

    def start_round(self, round_idx, payload, global_state, client_state=None):
        super().start_round(round_idx, payload, global_state, client_state)
        self.global_net.load_state_dict(global_state)
        self.previous_net.load_state_dict(global_state if client_state is None else client_state)

    def train(self, mode: bool = True):
        # fit_local calls module.train(): the frozen models are submodules, keep them in eval mode
        super().train(mode)
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
