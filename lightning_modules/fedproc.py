"""FedProc: prototypical contrastive federated learning; loss a * L_con + (1 - a) * CE.

Xutong Mu, Yulong Shen, Ke Cheng, Xueli Geng, Jiaxuan Fu, Tao Zhang, Zhiwei Zhang.
"FedProc: Prototypical Contrastive Federated Learning on Non-IID Data."
arXiv:2109.12273, 2021 (Future Generation Computer Systems 143, 2023).

L_con is a cosine InfoNCE with temperature 1 between the feature and the global (mean)
prototypes of all classes, the sample's own class the positive; a = 1 - r / (R - 1) in
round r of R (0 when R = 1). Round 0 has no prototypes: CE alone (docs/deviations.md, 11;
the official code trains nothing there). The server averages the weights (FedAvg).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lightning_modules.base import ClientModule
from lightning_modules.fedavg import FedAvgServer
from lightning_modules.losses import prototype_infonce
from lightning_modules.prototypes import mean_prototypes
from lightning_modules.server import RoundPayload


@dataclass(frozen=True)
class FedProcRound(RoundPayload):
    global_protos: torch.Tensor  # K x d: per class the mean of the clients' prototypes; NaN row: no client holds it
    weight_a: float  # a of the round this payload is for: L_con's weight, CE's is 1 - a


class FedProcClient(ClientModule):
    payload: FedProcRound | None

    def ce_weight(self):
        return 1.0 if self.payload is None else 1 - self.payload.weight_a

    def extra_loss(self, x, y, logits, z):
        if self.payload is None:  # round 0: no prototypes yet, CE alone
            return None
        a = self.payload.weight_a
        return a * prototype_infonce(z, y, self.payload.global_protos, self.hparams["temperature"])


class FedProcServer(FedAvgServer):
    def payload(self, client_protos, round_idx):
        r, R = round_idx + 1, self.rounds  # the payload is for round r
        return FedProcRound(global_protos=mean_prototypes(client_protos, self.num_classes, self.feature_dim),
                            weight_a=1.0 - r / (R - 1) if R > 1 else 0.0)
