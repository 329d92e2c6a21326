"""Pure, vectorised loss terms of the prototype methods (no Python loop over samples)."""
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


def upcr_loss(features: torch.Tensor, labels: torch.Tensor, unbiased_prototypes: torch.Tensor) -> torch.Tensor:
    """FPL's unbiased prototype consistent regularisation, batch mean.

    Per sample: mean over the feature dimensions of (z - U_y)^2, on the raw
    feature. `unbiased_prototypes[k]` is class k's; a row of NaN marks a class
    without a prototype, whose samples contribute 0.
    """
    target = unbiased_prototypes[labels]
    valid = ~torch.isnan(target).any(dim=1)
    per_sample = ((features - torch.nan_to_num(target)) ** 2).mean(dim=1)
    return (per_sample * valid).mean()
