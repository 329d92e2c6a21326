"""FedPLVM: dual-level prototype clustering and the alpha-sparsity prototype loss.

Pengyu Wang, Wenjie Ma, Zhenyu Zhang, Qingyu Liu, Wenbo Li, Wanlu Zhou, Yuhan Shi, Yang Liu.
"Taming Cross-Domain Representation Variance in Federated Prototype Learning with
Heterogeneous Data Domains." NeurIPS 2024.

Client: CE + lambda * (alpha-sparsity contrast against every global clustered
prototype + correction towards the class's averaged prototype g_y); round 0 has no
prototypes and trains CE alone. After its local training a client runs its model in
eval mode over its own training data and, per class, clusters the features with
FINCH (local clustered prototypes, the members' means): `local_prototypes`. Server:
FedAvg of the whole state_dict; per class, FINCH again over every uploaded local
clustered prototype (global clustered prototypes), sent with their classes; each client
takes g_y as the unweighted mean of class y's (the same in every ablation).

The paper's ablations are hyperparameters and registry variants:
`local_protos` cluster | mean and `global_protos` cluster | mean (Table 3),
`global_protos` all: every local clustered prototype sent, no global clustering
(Table 4), `contrast` / `correction` on or off (Table 5); `correction_form` code |
paper picks the correction term (docs/deviations.md); `clustering` finch | kmeans with
`kmeans_k` adaptive (FINCH's count) or a number, at both levels (Table 9); Table 11's privacy protection:
`dp_sgd` (local training by DP-SGD, Opacus, within `dp_epsilon`, `dp_delta` over the run) and `proto_noise`
(Gaussian noise on the uploaded local clustered prototypes), `lightning_modules/privacy.py`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lightning_modules.base import ClientModule
from lightning_modules.fedavg import FedAvgServer
from lightning_modules.losses import alpha_sparsity_loss, correction_loss, paper_correction_loss
from lightning_modules.privacy import perturb_prototypes
from lightning_modules.prototypes import by_class, class_cluster_prototypes, cluster_prototypes, mean_prototypes
from lightning_modules.server import RoundPayload


@dataclass(frozen=True)
class FedPLVMRound(RoundPayload):
    prototypes: torch.Tensor  # M x d: the global (clustered) prototypes every client receives
    prototype_labels: torch.Tensor  # M: the class of each

    @property
    def num_prototypes(self) -> int:
        """The prototypes each client receives this round (Table 4)."""
        return len(self.prototype_labels)


def class_means(prototypes: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """num_classes x d: per class the unweighted mean of its rows of `prototypes`; a NaN row for a class
    without any (g_y: the mean of class y's global clustered prototypes)."""
    sums = torch.zeros(num_classes, prototypes.shape[1], dtype=prototypes.dtype, device=prototypes.device)
    sums.index_add_(0, labels, prototypes)
    counts = torch.bincount(labels, minlength=num_classes).to(prototypes.dtype)
    return sums / counts[:, None]  # 0 / 0: NaN


class FedPLVMClient(ClientModule):
    payload: FedPLVMRound | None
    mean_prototypes: torch.Tensor | None = None  # K x d: g_y of the round's prototypes (NaN row: a class without)

    def start_round(self, round_idx, payload, global_state, client_state=None):
        super().start_round(round_idx, payload, global_state, client_state)
        p = self.payload  # g_y, the same for every client of the round (a plain attribute)
        self.mean_prototypes = None if p is None else class_means(p.prototypes, p.prototype_labels, self.num_classes)

    def extra_loss(self, x, y, logits, z):
        p, hp = self.payload, self.hparams
        if p is None or not (hp["contrast"] or hp["correction"]):  # round 0: no prototypes yet
            return None
        loss = torch.zeros((), dtype=z.dtype, device=z.device)
        if hp["contrast"]:
            loss = loss + alpha_sparsity_loss(z, y, p.prototypes, p.prototype_labels, hp["alpha"], hp["tau"])
        if hp["correction"]:
            if hp["correction_form"] == "code":
                loss = loss + correction_loss(z, y, self.mean_prototypes)
            else:
                loss = loss + paper_correction_loss(z, y, p.prototypes, p.prototype_labels, hp["alpha"])
        return hp["lambda"] * loss

    def local_prototypes(self, x=None, y=None, generator=None) -> dict[int, torch.Tensor]:
        """Class -> this client's local prototypes (J x d, CPU) from an eval-mode pass over its training data:
        FINCH cluster means (`local_protos=cluster`) or the one class mean (`mean`, Table 3's avg); under
        `proto_noise` (Table 11) perturbed before the upload, the noise drawn from the client's generator."""
        z, y = self.eval_features(x).cpu(), y.cpu()
        hp = self.hparams
        if hp["local_protos"] == "mean":
            protos = {int(k): z[y == k].mean(dim=0, keepdim=True) for k in torch.unique(y)}
        else:
            protos = class_cluster_prototypes(z, y, hp["clustering"], hp["kmeans_k"])
        if hp["proto_noise"]:
            protos = perturb_prototypes(protos, hp["proto_noise_scale"], hp["proto_noise_coefficient"], generator)
        return protos


class FedPLVMServer(FedAvgServer):
    """FedAvg of the weights; the prototypes of the next round from the clients' local ones."""

    def payload(self, client_protos, round_idx):
        how = self.hparams["global_protos"]
        if how == "cluster":  # FINCH per class over every client's local prototypes
            protos, labels, _ = cluster_prototypes(client_protos, self.num_classes, self.feature_dim,
                                                   self.hparams["clustering"], self.hparams["kmeans_k"])
            return FedPLVMRound(prototypes=protos, prototype_labels=labels)
        if how == "mean":  # one prototype per class: the mean of the clients' local prototypes (Table 3, */avg)
            means = mean_prototypes(client_protos, self.num_classes, self.feature_dim)
            classes = torch.nonzero(~torch.isnan(means).any(dim=1)).flatten()
            return FedPLVMRound(prototypes=means[classes], prototype_labels=classes)
        # "all": every local prototype sent as it is, no global clustering (Table 4, w/o)
        grouped = by_class(client_protos)
        protos = [torch.zeros(0, self.feature_dim), *grouped.values()]
        labels = [torch.zeros(0, dtype=torch.long)] + [torch.full((len(v),), k) for k, v in grouped.items()]
        return FedPLVMRound(prototypes=torch.cat(protos), prototype_labels=torch.cat(labels))
