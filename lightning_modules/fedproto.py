"""FedProto with parameter averaging, as in FPL's Table 2: CE + mu * MSE(z, global prototype of y).

Yue Tan, Guodong Long, Lu Liu, Tianyi Zhou, Qinghua Lu, Jing Jiang, Chengqi Zhang.
"FedProto: Federated Prototype Learning across Heterogeneous Clients." AAAI 2022,
pp. 8432-8440.

The server averages the weights (FedAvg) and sends the global prototypes: per class,
the unweighted mean of the clients' local prototypes. The MSE to a class prototype is
the same term as FPL's UPCR, against these plain means instead of the unbiased ones.
`double_forward=true` (default): BatchNorm running statistics move twice per step, as
with the reference's two forward passes (`bn_updates_per_step`; docs/deviations.md, 18).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lightning_modules.base import ClientModule, bn_updates_per_step
from lightning_modules.fedavg import FedAvgServer
from lightning_modules.losses import upcr_loss
from lightning_modules.prototypes import mean_prototypes
from lightning_modules.server import RoundPayload


@dataclass(frozen=True)
class FedProtoRound(RoundPayload):
    global_protos: torch.Tensor  # K x d: per class the mean of the clients' prototypes; NaN row: no client holds it


class FedProtoClient(ClientModule):
    payload: FedProtoRound | None

    def start_round(self, round_idx, payload, global_state, client_state=None):
        super().start_round(round_idx, payload, global_state, client_state)
        bn_updates_per_step(self.net, 2 if self.hparams["double_forward"] else 1)

    def extra_loss(self, x, y, logits, z):
        if self.payload is None:  # round 0: no prototypes yet
            return None
        return self.hparams["mu"] * upcr_loss(z, y, self.payload.global_protos)


class FedProtoServer(FedAvgServer):
    def payload(self, client_protos, round_idx):
        return FedProtoRound(global_protos=mean_prototypes(client_protos, self.num_classes, self.feature_dim))
