"""FedPCL: prototype-wise contrastive learning, only prototypes shared.

Yue Tan, Guodong Long, Jie Ma, Lu Liu, Tianyi Zhou, Jing Jiang. "Federated Learning from Pre-Trained Models:
A Contrastive Learning Approach." NeurIPS 2022; official code yuetan031/FedPCL (`lib/update.py`
`update_weights_lg`, `lib/losses.py` `ConLoss`, `exps/federated_main.py` `FedPCL`). A baseline of FedPLVM's
Tables 1, 2, 7 and 8 (PROTOCOL.md section 2, appendix).

No pre-trained backbone is available offline: each client trains the protocol's model end to end (FedPLVM's
ResNet-10 under its presets) with FedPCL's projection head on its feature, Linear(d, 256) -> ReLU -> L2
normalisation (`projected`: the model's features are then the projected ones). No weights are averaged
(`LocalModelsRule`): every client keeps its own model from its own initialisation, and only prototypes travel.

Client loss, as the code: the sum over the clients' prototype sets (every client's local prototypes of the last
round, a class a client lacks filled with the global prototype of that class) of `prototype_contrastive_loss`
on the batch's features taken twice (the code's two views, which FedPLVM's and FedPCL's digit transforms
make the same image), temperature 0.07. CE is computed by the code but not trained on (`loss = loss2`): its
weight is 0 here. Round 0 has no prototypes: a zero loss, as the code's `0 * loss1`. `global_term=true` adds the
same loss against the global prototypes (the paper's global prototypical term, which the code leaves out).
After training the client runs its model in eval mode over its training images; its local prototypes are the
class means of the projected features. Server: per class the unweighted mean of the clients' prototypes
(the global prototypes); it sends every client's local prototypes and the global ones. Inference: the nearest
(L2) of the client's own local prototypes (the code's `test_inference_twoway`). docs/deviations.md, 31.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lightning_modules.base import ClientModule
from lightning_modules.losses import prototype_contrastive_loss
from lightning_modules.prototypes import mean_prototypes
from lightning_modules.server import LocalModelsRule, RoundPayload


@functools.cache
def projected(base: type, dim: int) -> type:
    """`base` (a model class with `features`, `classifier`, `feature_dim`) with FedPCL's projection head on its
    feature: `features(x)` and the second output of `forward` are normalize(relu(Linear(base feature)))."""

    class Projected(base):
        feature_dim = dim

        def __init__(self, num_classes: int = 10, **kwargs):
            super().__init__(num_classes, **kwargs)
            self.projection = nn.Linear(base.feature_dim, dim)

        def project(self, h: torch.Tensor) -> torch.Tensor:
            return F.normalize(F.relu(self.projection(h)), dim=1)

        def features(self, x):
            return self.project(base.features(self, x))

        def forward(self, x):
            h = base.features(self, x)
            return self.classifier(h), self.project(h)

    Projected.__name__ = Projected.__qualname__ = f"{base.__name__}Projected{dim}"
    return Projected


@dataclass(frozen=True)
class FedPCLRound(RoundPayload):
    client_ids: torch.Tensor  # M: the clients whose prototypes are sent, in order
    local_protos: torch.Tensor  # M x K x d: each client's local prototypes; NaN row: a class it does not hold
    global_protos: torch.Tensor  # K x d: per class the mean over the clients that hold it; NaN row: none does

    def test_prototypes(self, client_id: int) -> torch.Tensor:
        """A client is tested by its own local prototypes (the code's `test_inference_twoway`); one that did not
        train this round (`--participation`: none sent) by the global prototypes."""
        row = torch.nonzero(self.client_ids == client_id)
        return self.global_protos if len(row) == 0 else self.local_protos[int(row[0, 0])]


class FedPCLClient(ClientModule):
    payload: FedPCLRound | None
    anchor_sets: list[torch.Tensor] | None = None  # K x d each: the prototype sets of the round's loss

    def __init__(self, net, hparams=None, **optim):
        model = projected(type(net), hparams["proj_dim"])(net.num_classes).to(memory_format=torch.channels_last)
        super().__init__(model, hparams, **optim)

    def start_round(self, round_idx, payload, global_state, client_state=None):
        super().start_round(round_idx, payload, global_state, client_state)
        p = self.payload  # the anchors' prototype sets, the same for every client of the round (a plain attribute)
        if p is None:
            self.anchor_sets = None
            return
        sets = torch.where(torch.isnan(p.local_protos), p.global_protos[None], p.local_protos)
        self.anchor_sets = [*sets, p.global_protos] if self.hparams["global_term"] else list(sets)

    def ce_weight(self) -> float:
        return 0.0  # computed by the code, not trained on

    def extra_loss(self, x, y, logits, z):
        if self.anchor_sets is None:  # round 0: no prototypes yet, nothing to train
            return torch.zeros((), dtype=z.dtype, device=z.device)
        views, labels = torch.cat([z, z]), torch.cat([y, y])
        return sum(prototype_contrastive_loss(views, labels, protos, self.hparams["tau"])
                   for protos in self.anchor_sets)

    def local_prototypes(self, x=None, y=None, generator=None) -> dict[int, torch.Tensor]:
        """Class -> the mean projected feature of the client's training images of that class, eval mode (CPU)."""
        z, y = self.eval_features(x).cpu(), y.cpu()
        return {int(k): z[y == k].mean(dim=0) for k in torch.unique(y)}


class FedPCLServer(LocalModelsRule):
    """No weights; every client's local prototypes and their per-class means sent to every client."""

    def payload(self, client_protos, round_idx):
        ids = sorted(client_protos)
        dim = next(iter(client_protos[ids[0]].values())).shape[-1]  # the projection's, not the model's feature_dim
        local = torch.full((len(ids), self.num_classes, dim), float("nan"))
        for m, c in enumerate(ids):
            for k, v in client_protos[c].items():
                local[m, k] = v.float()
        return FedPCLRound(client_ids=torch.tensor(ids), local_protos=local,
                           global_protos=mean_prototypes(client_protos, self.num_classes, dim))
