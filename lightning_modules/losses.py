"""Pure, vectorised loss terms of the methods (no Python loop over samples): FPL's CPCL and UPCR
(also FedProto's MSE), MOON's model-contrastive loss, FedProc's prototype InfoNCE, FedPLVM's
alpha-sparsity contrastive term and its correction term, FedPCL's prototype contrastive loss."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """len(a) x len(b): the cosine of each row of `a` with each row of `b`, in float32 or wider even under
    bf16-mixed autocast: divided by a temperature of 0.02, bfloat16's resolution of a cosine near 1
    (about 0.004) would move a logit by about 0.2."""
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    with torch.autocast(a.device.type, enabled=False):
        return F.normalize(a.to(dtype), dim=1) @ F.normalize(b.to(dtype), dim=1).T


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
    sim = cosine_matrix(features, prototypes)  # B x M
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


def prototype_infonce(z: torch.Tensor, y: torch.Tensor, global_protos: torch.Tensor,
                      temperature: float) -> torch.Tensor:
    """FedProc's prototype contrastive loss, batch mean.

    Per sample: CE over cos(z, G_k) / T for the classes k with a prototype (NaN rows are
    absent), the sample's own class the target; a sample whose class has no prototype
    contributes 0.
    """
    held = ~torch.isnan(global_protos).any(dim=1)
    # absent classes: logit -inf (out of the softmax), their samples' target ignored; masks, not an index of the
    # held rows (torch.nonzero would wait for the device every step)
    logits = (cosine_matrix(z, torch.nan_to_num(global_protos)) / temperature).masked_fill(~held, float("-inf"))
    target = torch.where(held[y], y, -100)
    per_sample = F.cross_entropy(logits, target, ignore_index=-100, reduction="none")
    return per_sample.sum() / len(y)


COS_EPS = 1e-6  # FedPLVM: cosines are clamped here before the power alpha (d/ds s^alpha is infinite at 0;
                # docs/deviations.md)


def _alpha_similarity(features: torch.Tensor, prototypes: torch.Tensor, alpha: float) -> torch.Tensor:
    """B x M: max(cos(z, p), COS_EPS) ** alpha."""
    cos = cosine_matrix(features, prototypes)
    return cos.clamp_min(COS_EPS) ** alpha


def alpha_sparsity_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor,
    prototype_labels: torch.Tensor,
    alpha: float,
    tau: float,
) -> torch.Tensor:
    """FedPLVM's alpha-sparsity contrastive term (Eq. 6, as coded), batch mean.

    Per sample: -log( sum_{p of class y} exp(s_p / tau) / sum_p exp(s_p / tau) ) with
    s_p = max(cos(z, p), COS_EPS) ** alpha, every global clustered prototype in the
    denominator, all positives summed inside the log. A sample whose class has no
    prototype contributes 0. Log-sum-exp form: the value of the plain exponentials, no overflow.
    """
    logits = _alpha_similarity(features, prototypes, alpha) / tau
    positive = labels[:, None] == prototype_labels[None, :]
    has_pos = positive.any(dim=1)
    # a sample without a positive takes every prototype as "positive": log(1) = 0, gradient 0
    pos = logits.masked_fill(~(positive | ~has_pos[:, None]), float("-inf"))
    per_sample = logits.logsumexp(dim=1) - pos.logsumexp(dim=1)
    return per_sample.mean()


def correction_loss(features: torch.Tensor, labels: torch.Tensor, mean_prototypes: torch.Tensor) -> torch.Tensor:
    """FedPLVM's correction term as coded: 2 * mean over the batch of (1 - cos(z, g_y))^2 (the code's
    2 * MSE(cos, 1)), g_y = `mean_prototypes[y]`, the mean of class y's global clustered prototypes.
    A NaN row marks a class without prototypes; its samples contribute 0."""
    target = mean_prototypes[labels]
    valid = ~torch.isnan(target).any(dim=1)
    cos = F.cosine_similarity(features, torch.nan_to_num(target), dim=1)
    return 2 * ((1 - cos) ** 2 * valid).mean()


def paper_correction_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor,
    prototype_labels: torch.Tensor,
    alpha: float,
) -> torch.Tensor:
    """FedPLVM's correction term as the paper writes it (Eq. 8), batch mean: per sample
    | sum_{g of class y} s_alpha(z, g) - C_y |, C_y the number of class y's global clustered prototypes
    (the sum pushed to C_y: the mean alpha-similarity to 1), s_alpha as in `alpha_sparsity_loss`.
    A sample whose class has no prototype contributes 0."""
    positive = (labels[:, None] == prototype_labels[None, :]).to(features.dtype)
    s = _alpha_similarity(features, prototypes, alpha)
    return ((s * positive).sum(dim=1) - positive.sum(dim=1)).abs().mean()


def prototype_contrastive_loss(features: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor,
                               temperature: float, base_temperature: float = 0.07) -> torch.Tensor:
    """FedPCL's contrastive loss against one prototype set (its `ConLoss`, lib/losses.py), mean over the rows.

    Row i's anchor is the prototype of its class, a_i = prototypes[labels_i] (num_classes x d; a NaN row: a class
    without one, whose rows contribute 0); its logits are a_i . z_j / temperature over every feature j but its own
    (plain dot products: FedPCL's features are L2-normalised, its prototypes are means of them); per row
    -(temperature / base_temperature) times the mean over its positives (j != i of its class) of
    log softmax_j. A row without a positive contributes 0 (the reference divides 0 by 0 there).
    """
    anchors = prototypes[labels]
    valid = ~torch.isnan(anchors).any(dim=1)
    eye = torch.eye(len(labels), dtype=torch.bool, device=features.device)
    logits = (torch.nan_to_num(anchors) @ features.T / temperature).masked_fill(eye, float("-inf"))
    log_prob = logits - logits.logsumexp(dim=1, keepdim=True)
    positive = (labels[:, None] == labels[None, :]) & ~eye
    count = positive.sum(dim=1)
    mean_pos = log_prob.masked_fill(~positive, 0).sum(dim=1) / count.clamp_min(1)
    return (-(temperature / base_temperature) * mean_pos * (valid & (count > 0))).mean()
