"""FPL: federated prototype learning with cluster and unbiased prototypes (CPCL + UPCR).

Wenke Huang, Mang Ye, Zekun Shi, He Li, Bo Du. "Rethinking Federated Learning with
Domain Shift: A Prototype View." CVPR 2023, pp. 16312-16322.

Client: CE + lambda * mean over the batch of (CPCL + UPCR), lambda 1 by default (the
paper's and its code's loss, unweighted; FedPLVM's Figure 4 varies it); round 0 has no
prototypes and trains CE alone. Server: FedAvg of the weights; per class, FINCH over the clients'
prototypes gives the cluster prototypes, whose mean is the unbiased prototype
(docs/deviations.md, 5, 6). The ablation switches of the paper are hyperparameters:
`cpcl`, `upcr` (Table 1), `upcr_target` unbiased | global (Table 3) and `cpcl_protos`
cluster | global (Fig. 5); the ablations are registry variants of FPL.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lightning_modules.base import ClientModule
from lightning_modules.fedavg import FedAvgServer
from lightning_modules.losses import cpcl_loss, upcr_loss
from lightning_modules.prototypes import cluster_prototypes, held_prototypes, mean_prototypes
from lightning_modules.server import RoundPayload


@dataclass(frozen=True)
class FPLRound(RoundPayload):
    cluster_protos: torch.Tensor  # M x d: FINCH cluster prototypes of every class
    cluster_labels: torch.Tensor  # M: the class of each cluster prototype
    unbiased_protos: torch.Tensor  # K x d: per class the mean of its cluster prototypes; NaN row: no client holds it
    global_protos: torch.Tensor  # K x d: per class the plain mean of the clients' prototypes (ablations); NaN rows too


class FPLClient(ClientModule):
    payload: FPLRound | None

    def start_round(self, round_idx, payload, global_state, client_state=None):
        super().start_round(round_idx, payload, global_state, client_state)
        # CPCL against the global prototypes (Fig. 5's ablation): those some client holds, picked once per round
        # (not a wait for the device every step)
        self.held = None if self.payload is None else held_prototypes(self.payload.global_protos)

    def extra_loss(self, x, y, logits, z):
        p, hp = self.payload, self.hparams
        if p is None:  # round 0: no prototypes yet
            return None
        loss = torch.zeros((), device=z.device)
        if hp["cpcl"]:
            if hp["cpcl_protos"] == "cluster":
                protos, proto_labels = p.cluster_protos, p.cluster_labels
            else:  # one global (mean) prototype per class
                protos, proto_labels = self.held
            loss = loss + cpcl_loss(z, y, protos, proto_labels, hp["tau"])
        if hp["upcr"]:
            target = p.unbiased_protos if hp["upcr_target"] == "unbiased" else p.global_protos
            loss = loss + upcr_loss(z, y, target, hp["upcr_reduction"])
        return hp["lambda"] * loss


class FPLServer(FedAvgServer):
    def payload(self, client_protos, round_idx):
        protos, labels, unbiased = cluster_prototypes(client_protos, self.num_classes, self.feature_dim)
        return FPLRound(cluster_protos=protos, cluster_labels=labels, unbiased_protos=unbiased,
                        global_protos=mean_prototypes(client_protos, self.num_classes, self.feature_dim))
