"""FedProx: CE + (mu / 2) ||w - w_global||^2 over the parameters; FedAvg on the server
(`FedAvgServer`, registered in lightning_modules/registry.py).

Tian Li, Anit Kumar Sahu, Manzil Zaheer, Maziar Sanjabi, Ameet Talwalkar, Virginia Smith.
"Federated Optimization in Heterogeneous Networks." MLSys 2020 (arXiv:1812.06127).

mu = 0.01 as stated (docs/deviations.md, 8).
"""
from __future__ import annotations

import torch

from lightning_modules.base import ClientModule


class FedProxClient(ClientModule):
    def start_round(self, round_idx, payload, global_state, client_state=None):
        super().start_round(round_idx, payload, global_state, client_state)
        self.global_params = [p.detach().clone() for p in self.net.parameters()]

    def extra_loss(self, x, y, logits, z):
        sq = torch.stack([(p - g).pow(2).sum() for p, g in zip(self.net.parameters(), self.global_params)]).sum()
        return self.hparams["mu"] / 2 * sq

