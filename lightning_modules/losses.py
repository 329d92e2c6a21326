"""Pure, vectorised loss terms of the methods (no Python loop over samples): FPL's CPCL and UPCR
(also FedProto's MSE), MOON's model-contrastive loss, FedProc's prototype InfoNCE."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def cpcl_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor,
    prototype_labels: torch.Tensor,
    tau: float,
) -> torch.Tensor:
    """FPL's cluster prototype contrastive loss, batch mean.

    Per sample: -log( sum_{p of class y} exp(cos(z,p)/tau) / sum_{p} exp(cos(z,p)/tau) ),
    all positives summed inside the log. Computed as written, with plain exp like
    the reference code, so tau = 0.01 overflows to a non-finite loss as the paper's
    Fig. 4 reports. A sample whose class has no prototype contributes 0.
    """
    sim = F.normalize(features, dim=1) @ F.normalize(prototypes, dim=1).T  # B x M
    expo = torch.exp(sim / tau)
    positive = labels[:, None] == prototype_labels[None, :]
    has_pos = positive.any(dim=1)
    pos_sum = (expo * positive).sum(dim=1)
    per_sample = -torch.log(torch.where(has_pos, pos_sum, expo.sum(dim=1)) / expo.sum(dim=1))
    return per_sample.mean()


def upcr_loss(features: torch.Tensor, labels: torch.Tensor, unbiased_prototypes: torch.Tensor,
              reduction: str = "mean") -> torch.Tensor:
    """FPL's unbiased prototype consistent regularisation, batch mean.

    Per sample: the mean (the code's form, default) or the sum (`reduction="sum"`,
    the paper's Eq. 10) over the feature dimensions of (z - U_y)^2, on the raw
    feature. `unbiased_prototypes[k]` is class k's; a row of NaN marks a class
    without a prototype, whose samples contribute 0.
    """
    target = unbiased_prototypes[labels]
    valid = ~torch.isnan(target).any(dim=1)
    sq = (features - torch.nan_to_num(target)) ** 2
    per_sample = sq.sum(dim=1) if reduction == "sum" else sq.mean(dim=1)
    return (per_sample * valid).mean()


def moon_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, temperature: float) -> torch.Tensor:
    """MOON's model-contrastive loss, batch mean.

    Per sample: -log( e^{cos(z,zg)/T} / (e^{cos(z,zg)/T} + e^{cos(z,zp)/T}) ), the global
    model's feature the positive, the previous local model's the negative.
    """
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], dim=1)
    return F.cross_entropy(logits / temperature, torch.zeros(len(z), dtype=torch.long, device=z.device))


def prototype_infonce(z: torch.Tensor, y: torch.Tensor, global_protos: torch.Tensor, temperature: float) -> torch.Tensor:
    """FedProc's prototype contrastive loss, batch mean.

    Per sample: CE over cos(z, G_k) / T for the classes k with a prototype (NaN rows are
    absent), the sample's own class the target; a sample whose class has no prototype
    contributes 0.
    """
    held = ~torch.isnan(global_protos).any(dim=1)
    classes = torch.nonzero(held).flatten()
    logits = F.normalize(z, dim=1) @ F.normalize(global_protos[classes], dim=1).T / temperature
    target_of_class = torch.full((len(global_protos),), -100, dtype=torch.long, device=z.device)
    target_of_class[classes] = torch.arange(len(classes), device=z.device)
    per_sample = F.cross_entropy(logits, target_of_class[y], ignore_index=-100, reduction="none")
    return per_sample.sum() / len(y)
