"""Prototype construction: class means, FINCH cluster prototypes (of the clients' prototypes on the server,
FPL and FedPLVM; of a client's own features, FedPLVM's local level), or K-Means ones instead (FedPLVM's Table 9),
unbiased prototypes."""
from __future__ import annotations

import warnings

import numpy as np
import torch

# finch warns, when imported, that pynndescent (only for more than 20k points) is absent. The filter is set here, once,
# as the module is imported: `finch_clusters` imports finch at its first call, perhaps in two client threads at once,
# where `warnings.catch_warnings` (process-wide state) is unsafe
warnings.filterwarnings("ignore", message="pynndescent is not installed", category=UserWarning)

def by_class(client_protos: dict[int, dict[int, torch.Tensor]]) -> dict[int, torch.Tensor]:
    """class -> the prototypes of the clients that hold it stacked (a client's J x d rows in a row), in
    client-id order."""
    grouped: dict[int, list[torch.Tensor]] = {}
    for cid in sorted(client_protos):
        for k, v in client_protos[cid].items():
            grouped.setdefault(int(k), []).append(v.float().cpu().reshape(-1, v.shape[-1]))
    return {k: torch.cat(grouped[k]) for k in sorted(grouped)}


def per_class_count(protos: dict[int, torch.Tensor]) -> float:
    """The mean over a client's classes of the prototypes it uploads for each (1 for a class mean, J for FedPLVM's
    J local clustered prototypes): FedPLVM's Figure 9."""
    return float(np.mean([v.reshape(-1, v.shape[-1]).shape[0] for v in protos.values()])) if protos else 0.0


def mean_prototypes(client_protos: dict, num_classes: int, dim: int) -> torch.Tensor:
    """Global prototypes: per class, the unweighted mean over the clients that hold it.

    Returns num_classes x dim; a class no client holds is a row of NaN.
    """
    out = torch.full((num_classes, dim), float("nan"))
    for k, protos in by_class(client_protos).items():
        out[k] = protos.mean(dim=0)
    return out


def held_prototypes(protos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of a num_classes x dim prototype table that some client holds (not NaN), and their classes."""
    held = ~torch.isnan(protos).any(dim=1)
    return protos[held], torch.nonzero(held).flatten()


def finch_clusters(points: torch.Tensor) -> np.ndarray:
    """FINCH (cosine, ensure_early_exit=False) labels of the last, coarsest partition. finch-clust (with the
    scikit-learn it imports: 0.6 s) is imported at the first call: a process that never clusters (every client actor
    but FedPLVM's) starts without it."""
    from finch import FINCH

    if len(points) == 1:
        return np.zeros(1, dtype=np.int64)
    c, _, _ = FINCH(data=points.numpy().astype(np.float32), distance="cosine", ensure_early_exit=False, verbose=False)
    return np.asarray(c[:, -1], dtype=np.int64)


CLUSTERINGS = ("finch", "kmeans")  # FedPLVM's `clustering` (Table 9: K-Means instead of FINCH)
KMEANS_SEED = 0  # scikit-learn's random_state, as FedPLVM's `cluster_protos` (utils/util.py)


def kmeans_centers(points: torch.Tensor, k: int | str = "adaptive") -> torch.Tensor:
    """scikit-learn's KMeans (Euclidean, `n_init="auto"`, `random_state=KMEANS_SEED`) over the rows of `points`, its
    `cluster_centers_` in its cluster order. k: the number of clusters, or "adaptive": as many as FINCH's last
    partition has (`finch_clusters`); at most the number of distinct rows (one cluster: their mean)."""
    from sklearn.cluster import KMeans

    x = points.detach().float().cpu().numpy()
    if k == "adaptive":
        k = len(np.unique(finch_clusters(points.detach().float().cpu())))
    k = min(int(k), len(np.unique(x, axis=0)))
    if k <= 1:
        return points.mean(dim=0, keepdim=True)
    km = KMeans(n_clusters=k, random_state=KMEANS_SEED, n_init="auto").fit(x)
    return torch.from_numpy(km.cluster_centers_).to(dtype=points.dtype, device=points.device)


def cluster_means(points: torch.Tensor, clustering: str = "finch", k: int | str = "adaptive") -> torch.Tensor:
    """FINCH (`finch_clusters`) over the rows of `points`; the mean of each cluster's members, one row per
    cluster in the order of FINCH's cluster ids. `clustering="kmeans"`: `kmeans_centers(points, k)` instead."""
    if clustering == "kmeans":
        return kmeans_centers(points, k)
    assign = torch.from_numpy(finch_clusters(points.detach().float().cpu())).to(points.device)
    return torch.stack([points[assign == i].mean(dim=0) for i in torch.unique(assign)])


def class_cluster_prototypes(features: torch.Tensor, labels: torch.Tensor, clustering: str = "finch",
                             k: int | str = "adaptive") -> dict[int, torch.Tensor]:
    """FedPLVM's local level: class -> `cluster_means` of that class's features (J x d), for the classes present."""
    return {int(c): cluster_means(features[labels == c], clustering, k) for c in torch.unique(labels)}


def cluster_prototypes(client_protos: dict, num_classes: int, dim: int, clustering: str = "finch",
                       k: int | str = "adaptive") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FPL's server step, and FedPLVM's global level.

    Per class, FINCH (or K-Means: `clustering`, `k`, as `cluster_means`) over the client prototypes (all rows of every
    client holding it); a cluster prototype is the mean of its members (a class held by one client keeps that
    prototype). The unbiased
    prototype of a class is the unweighted mean of its cluster prototypes.
    Returns (cluster prototypes M x dim, their classes M, unbiased num_classes x dim
    with NaN rows for classes no client holds).
    """
    protos, labels = [], []
    unbiased = torch.full((num_classes, dim), float("nan"))
    for c, points in by_class(client_protos).items():
        centers = cluster_means(points, clustering, k)
        protos.append(centers)
        labels.append(torch.full((len(centers),), c, dtype=torch.long))
        unbiased[c] = centers.mean(dim=0)
    if not protos:
        return torch.zeros(0, dim), torch.zeros(0, dtype=torch.long), unbiased
    return torch.cat(protos), torch.cat(labels), unbiased


def nearest_prototype(features: torch.Tensor, global_protos: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """FedProto's prototype inference: per sample the class, among `classes` (the client's own) that have a
    global prototype (NaN rows have none), whose prototype is nearest in L2; -1 when no such class exists."""
    allowed = torch.zeros(len(global_protos), dtype=torch.bool, device=features.device)
    allowed[classes] = True
    allowed &= ~torch.isnan(global_protos).any(dim=1)
    dist = torch.cdist(features, torch.nan_to_num(global_protos).to(features.dtype))  # B x K
    pred = dist.masked_fill(~allowed, float("inf")).argmin(dim=1)
    return torch.where(allowed.any(), pred, -1)  # masks, no host sync per test batch
