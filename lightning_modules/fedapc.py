"""FedAPC: augmented prototypes and a prototype contrastive loss against their global means.

Huy Q. Le, Latif U. Khan, Choong Seon Hong. "Robust Federated Learning on Edge Devices
with Domain Heterogeneity." 2025 (PROTOCOL.md section 3; no public code).

Client: CE + L_APC, L_APC the sum-of-positives InfoNCE of FPL's CPCL (`cpcl_loss`) between
the feature and the global prototypes (one per class), cosine similarity over `tau`;
round 0 has no prototypes and trains CE alone. After its local training the client
runs its trained model (eval mode, no gradient) over its training images: each image's
feature is the mean over `n_views` augmented views (random crop and flip as in training,
then torchvision's random erasing, drawn from the client's generator), and its local
augmented prototypes are the class means of these features (the paper's Eq. 2, 3).
`augment=false` (the Table II ablation, registry variant `fedapc_noaug`): one view, the
image itself. `prototypes=last_epoch` reads Alg. 1, which lists Eq. 3 inside the batch loop, as
FPL's and FedProto's code gather prototypes: the class means of the training-mode features of
the last local epoch's batches (one view each, as training makes it; no pass after training). Server:
sample-weighted FedAvg of the weights (Alg. 1, line 9); the global prototype of a class is the
unweighted mean of the clients' local prototypes (the text's "averaging"; Eq. 4's sum differs
by a positive factor, which the cosine ignores).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from benchmark.transforms import augment, random_erasing
from lightning_modules.base import ClientModule, precision_context
from lightning_modules.fedavg import FedAvgServer
from lightning_modules.losses import cpcl_loss
from lightning_modules.prototypes import held_prototypes, mean_prototypes
from lightning_modules.server import RoundPayload

CHUNK = 256  # images per forward pass of the prototype extraction (times n_views)


@dataclass(frozen=True)
class FedAPCRound(RoundPayload):
    global_protos: torch.Tensor  # K x d: per class the mean of the clients' augmented prototypes; NaN row: none


class FedAPCClient(ClientModule):
    payload: FedAPCRound | None

    def start_round(self, round_idx, payload, global_state, client_state=None):
        super().start_round(round_idx, payload, global_state, client_state)
        # the prototypes some client holds, picked once per round (not a wait for the device every step)
        self.held = None if self.payload is None else held_prototypes(self.payload.global_protos)

    def extra_loss(self, x, y, logits, z):
        if self.payload is None:  # round 0: no prototypes yet
            return None
        protos, labels = self.held
        return cpcl_loss(z, y, protos, labels, self.hparams["tau"])

    def views(self, x: torch.Tensor, generator: torch.Generator) -> list[torch.Tensor]:
        """The views of the uint8 images `x` whose features are averaged, normalised as the dataset's
        transform: `n_views` augmented ones (crop with 4-pixel padding, flip, erasing; whether or not the
        protocol's training batches are augmented), or the image itself when `augment` is off."""
        dtype, t = next(self.net.parameters()).dtype, self.transform
        if not self.hparams["augment"]:
            return [t.eval(x).to(dtype)]
        return [random_erasing(augment(x, generator, t.mean, t.std), generator).to(dtype)
                for _ in range(self.hparams["n_views"])]

    @torch.no_grad()
    def augmented_features(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Each image's feature averaged over its views (Eq. 2), in the model's dtype, in the module's current mode."""
        out = []
        for chunk in x.split(CHUNK):
            views = self.views(chunk, generator)
            with precision_context(self.precision_mode, chunk.device):
                z = self.net.features(torch.cat(views))
            out.append(z.to(views[0].dtype).view(len(views), len(chunk), -1).mean(dim=0))
        return torch.cat(out)

    def local_prototypes(self, x=None, y=None, generator=None):
        """Class -> mean augmented feature of the client's training images of that class (Eq. 3), from the
        trained model in eval mode (CPU); under `prototypes=last_epoch` the last local epoch's class means."""
        if self.hparams["prototypes"] == "last_epoch":
            return super().local_prototypes()
        was_training = self.training
        self.eval()
        try:
            z = self.augmented_features(x, generator)
        finally:
            self.train(was_training)
        sums = torch.zeros(self.num_classes, z.shape[1], dtype=z.dtype, device=z.device).index_add_(0, y, z)
        counts = torch.bincount(y, minlength=self.num_classes)
        return {int(k): (sums[k] / counts[k]).cpu() for k in torch.nonzero(counts).flatten()}


class FedAPCServer(FedAvgServer):
    def payload(self, client_protos, round_idx):
        return FedAPCRound(global_protos=mean_prototypes(client_protos, self.num_classes, self.feature_dim))
