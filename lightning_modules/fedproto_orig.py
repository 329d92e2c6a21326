"""FedProto as published (AAAI 2022): only prototypes travel, every client keeps its own model.

Yue Tan, Guodong Long, Lu Liu, Tianyi Zhou, Qinghua Lu, Jing Jiang, Chengqi Zhang.
"FedProto: Federated Prototype Learning across Heterogeneous Clients." AAAI 2022,
pp. 8432-8440. PROTOCOL.md section 4; official code yuetan031/FedProto.

Client: the same module as FPL's FedProto baseline (`FedProtoClient`): CE (the reference's
NLL on log-softmax) + mu * MSE(z, global prototype of y), mu the paper's lambda (the code's
`ld`, 1 for MNIST); a class without a global prototype contributes 0, round 0 has none; the
local prototypes are the class means of the detached training features of the last local
epoch. Server (`FedProtoOrigServer`): per class the unweighted mean of the prototypes of the
clients that hold it; no weight averaging (`LocalModelsRule`), so the clients' models may
differ: FedProto-mh gives clients 0-6 / 7-13 / 14-19 conv2 widths 18 / 20 / 22
(`fedproto_mh_model`, a registered variant of the method).
"""
from __future__ import annotations

from lightning_modules.fedproto import FedProtoRound
from lightning_modules.prototypes import mean_prototypes
from lightning_modules.server import LocalModelsRule


class FedProtoOrigServer(LocalModelsRule):
    def payload(self, client_protos, round_idx):
        return FedProtoRound(global_protos=mean_prototypes(client_protos, self.num_classes, self.feature_dim))


def fedproto_mh_model(client_id: int) -> dict:
    """FedProto-mh's model of a client (the official code's out_channels by client index)."""
    return {"conv2_channels": 18 if client_id < 7 else 20 if client_id < 14 else 22}
