"""FPL's pieces against straightforward references: CPCL, UPCR, FINCH cluster prototypes, local prototypes."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from benchmark.data import to_tensor_images
from benchmark.models import ResNet10
from benchmark.transforms import normalize
from lightning_modules.base import ClientModule
from lightning_modules.fpl import FPLServer
from lightning_modules.losses import cpcl_loss, upcr_loss
from lightning_modules.prototypes import cluster_prototypes, mean_prototypes

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from finch import FINCH


# --------------------------------------------------------------------------- references (one sample at a time)

def cpcl_reference(z, y, protos, proto_labels, tau):
    """-log( sum_{p in P(y)} exp(cos(z,p)/tau) / sum_{p in P} exp(cos(z,p)/tau) ), batch mean; 0 without positives."""
    total = z.sum() * 0
    for i in range(len(z)):
        num, den = 0.0, 0.0
        for p, k in zip(protos, proto_labels):
            cos = torch.dot(z[i], p) / (torch.linalg.norm(z[i]) * torch.linalg.norm(p))
            e = torch.exp(cos / tau)
            den = den + e
            if int(k) == int(y[i]):
                num = num + e
        if torch.is_tensor(num):
            total = total - torch.log(num / den)
    return total / len(z)


def upcr_reference(z, y, unbiased):
    """mean over dimensions of (z - U_y)^2, batch mean; 0 for a class without a prototype."""
    total = z.sum() * 0
    for i in range(len(z)):
        u = unbiased[int(y[i])]
        if torch.isnan(u).any():
            continue
        total = total + sum((z[i, d] - u[d]) ** 2 for d in range(z.shape[1])) / z.shape[1]
    return total / len(z)


def _random_case(seed, dim=16):
    g = torch.Generator().manual_seed(seed)
    z = torch.relu(torch.randn(12, dim, generator=g, dtype=torch.float64)) + 0.01  # non-negative, some near 0
    y = torch.tensor([0, 1, 2, 3, 4, 0, 1, 3, 2, 0, 4, 3])
    proto_labels = torch.tensor([0, 0, 0, 1, 1, 2, 4, 4])  # class 3 has no prototype
    protos = torch.rand(len(proto_labels), dim, generator=g, dtype=torch.float64)
    return z, y, protos, proto_labels


# --------------------------------------------------------------------------- CPCL

def test_cpcl_hand_value():
    # z along the positive, orthogonal to the negative: -log(e^{1/tau} / (e^{1/tau} + 1)) = log(1 + e^{-1/tau})
    z = torch.tensor([[2.0, 0.0]], dtype=torch.float64)
    protos = torch.tensor([[1.0, 0.0], [0.0, 3.0]], dtype=torch.float64)
    for tau in (1.0, 0.5):
        out = cpcl_loss(z, torch.tensor([0]), protos, torch.tensor([0, 1]), tau)
        assert out.item() == pytest.approx(math.log1p(math.exp(-1 / tau)), rel=1e-12)
    # two positives at cos 1 and cos 0, one negative at cos 0 (tau 1): -log((e + 1) / (e + 2))
    protos3 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 5.0]], dtype=torch.float64)
    out = cpcl_loss(z, torch.tensor([0]), protos3, torch.tensor([0, 0, 1]), 1.0)
    assert out.item() == pytest.approx(-math.log((math.e + 1) / (math.e + 2)), rel=1e-12)


@pytest.mark.parametrize("seed,tau", [(0, 0.02), (1, 0.02), (2, 0.5)])
def test_cpcl_matches_reference_value_and_gradient(seed, tau):
    z, y, protos, plabels = _random_case(seed)
    z1 = z.clone().requires_grad_(True)
    z2 = z.clone().requires_grad_(True)
    out = cpcl_loss(z1, y, protos, plabels, tau)
    ref = cpcl_reference(z2, y, protos, plabels, tau)
    assert out.dtype == torch.float64
    assert torch.isfinite(ref) and ref.item() > 0
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    g1, = torch.autograd.grad(out, z1)
    g2, = torch.autograd.grad(ref, z2)
    torch.testing.assert_close(g1, g2, rtol=1e-8, atol=1e-12)
    # the class-3 samples (no prototype) get no gradient (up to rounding of log(den / den))
    assert g1[y == 3].abs().max() < 1e-12 and g1[y != 3].abs().max() > 1e-3


def test_cpcl_class_without_prototype_contributes_zero():
    z, y, protos, plabels = _random_case(3)
    only3 = y == 3
    assert cpcl_loss(z[only3], y[only3], protos, plabels, 0.02).item() == 0.0
    # adding those samples to a batch only changes the mean's denominator
    full = cpcl_loss(z, y, protos, plabels, 0.02)
    rest = cpcl_loss(z[~only3], y[~only3], protos, plabels, 0.02)
    assert full.item() == pytest.approx(rest.item() * (~only3).sum().item() / len(y), rel=1e-12)


def test_cpcl_tau_001_overflows():
    # the paper's Fig. 4: tau = 0.01 gives NaN; in float32 exp(cos/0.01) overflows when z is near a prototype
    g = torch.Generator().manual_seed(0)
    protos = torch.rand(4, 512, generator=g)
    plabels = torch.tensor([0, 0, 1, 2])
    z = protos[[0, 2]] * 1.5 + 1e-4
    y = torch.tensor([0, 1])
    assert not torch.isfinite(cpcl_loss(z, y, protos, plabels, 0.01))
    assert torch.isfinite(cpcl_loss(z, y, protos, plabels, 0.02))  # exp(50) still fits in float32


# --------------------------------------------------------------------------- UPCR

def test_upcr_hand_value():
    z = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0], [3.0, 3.0, 3.0, 3.0]], dtype=torch.float64)
    unbiased = torch.tensor([[0.0, 0.0, 0.0, 0.0], [float("nan")] * 4, [1.0, 2.0, 3.0, 5.0]], dtype=torch.float64)
    y = torch.tensor([0, 1, 2])
    # sample 0: (1 + 4 + 9 + 16) / 4 = 7.5; sample 1: no prototype, 0; sample 2: (4 + 1 + 0 + 4) / 4 = 2.25
    assert upcr_loss(z, y, unbiased).item() == pytest.approx((7.5 + 0 + 2.25) / 3, rel=1e-14)


def test_upcr_sum_reduction_is_the_papers_eq10():
    """The paper's Eq. 10 sums (z - U_y)^2 over the feature dimensions; the code (default) takes the mean."""
    z = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0], [3.0, 3.0, 3.0, 3.0]], dtype=torch.float64)
    unbiased = torch.tensor([[0.0, 0.0, 0.0, 0.0], [float("nan")] * 4, [1.0, 2.0, 3.0, 5.0]], dtype=torch.float64)
    y = torch.tensor([0, 1, 2])
    # sample 0: 1 + 4 + 9 + 16 = 30; sample 1: no prototype, 0; sample 2: 4 + 1 + 0 + 4 = 9
    assert upcr_loss(z, y, unbiased, "sum").item() == pytest.approx((30 + 0 + 9) / 3, rel=1e-14)
    assert upcr_loss(z, y, unbiased, "mean").item() == pytest.approx((7.5 + 0 + 2.25) / 3, rel=1e-14)


@pytest.mark.parametrize("seed", [0, 1])
def test_upcr_matches_reference_value_and_gradient(seed):
    z, y, _, _ = _random_case(seed)
    g = torch.Generator().manual_seed(100 + seed)
    unbiased = torch.rand(5, z.shape[1], generator=g, dtype=torch.float64)
    unbiased[3] = float("nan")
    z1 = z.clone().requires_grad_(True)
    z2 = z.clone().requires_grad_(True)
    out = upcr_loss(z1, y, unbiased)
    ref = upcr_reference(z2, y, unbiased)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)
    g1, = torch.autograd.grad(out, z1)
    g2, = torch.autograd.grad(ref, z2)
    torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-14)
    assert torch.all(g1[y == 3] == 0) and torch.all(torch.isfinite(g1))
    # gradient by hand: 2 (z - U_y) / (dim * batch)
    hand = 2 * (z - unbiased[y]) / (z.shape[1] * len(y))
    torch.testing.assert_close(g1[y != 3], hand[y != 3], rtol=1e-12, atol=1e-14)


# --------------------------------------------------------------------------- server prototypes

DIM = 8


def _e(i, s=1.0):
    v = torch.zeros(DIM)
    v[i] = s
    return v


# class 0: three clients along e0, two along e1 (cosine groups of 3 and 2)
C0 = [3 * _e(0) + 0.1 * _e(4), 2 * _e(0) + 0.1 * _e(5), _e(0) + 0.1 * _e(6),
      _e(1) + 0.1 * _e(4), 4 * _e(1) + 0.1 * _e(7)]
# class 2: nine clients in four direction groups (3, 2, 2, 2) that pair up into two: FINCH's first
# partition has 4 clusters, its last (coarsest) 2
C2 = [_e(0) + 0.05 * _e(6), 2 * _e(0) + 0.1 * _e(7), _e(0) + 0.03 * _e(5),
      _e(0) + 0.6 * _e(1) + 0.05 * _e(6), 3 * (_e(0) + 0.6 * _e(1)) + 0.1 * _e(7),
      _e(2) + 0.05 * _e(6), 2 * _e(2) + 0.05 * _e(7),
      _e(2) + 0.6 * _e(3) + 0.05 * _e(5), 2 * (_e(2) + 0.6 * _e(3)) + 0.05 * _e(6)]
C1 = _e(6, 2.0) + 0.3 * _e(1)  # class 1 held by client 2 only; class 3 by nobody


def _client_protos():
    protos = {cid: {} for cid in range(9)}
    for cid, p in enumerate(C0):
        protos[cid][0] = p
    for cid, p in enumerate(C2):
        protos[cid][2] = p
    protos[2][1] = C1
    return protos


def _same_partition(labels, groups):
    """labels (one per point) split the points exactly into `groups` (lists of point indices)."""
    seen = set()
    for grp in groups:
        ids = {int(labels[i]) for i in grp}
        if len(ids) != 1 or ids & seen:
            return False
        seen |= ids
    return True


def test_finch_grouping_of_the_example():
    c, num_clust, _ = FINCH(data=torch.stack(C0).numpy(), distance="cosine", ensure_early_exit=False, verbose=False)
    assert list(num_clust) == [2] and _same_partition(c[:, -1], [[0, 1, 2], [3, 4]]), c
    c, num_clust, _ = FINCH(data=torch.stack(C2).numpy(), distance="cosine", ensure_early_exit=False, verbose=False)
    assert list(num_clust) == [4, 2], num_clust
    assert _same_partition(c[:, 0], [[0, 1, 2], [3, 4], [5, 6], [7, 8]]), c
    assert _same_partition(c[:, -1], [[0, 1, 2, 3, 4], [5, 6, 7, 8]]), c


def _rows_match(got: torch.Tensor, expected: list[torch.Tensor]) -> bool:
    """The same rows in any order."""
    if len(got) != len(expected):
        return False
    left = list(range(len(got)))
    for e in expected:
        hit = [i for i in left if torch.allclose(got[i], e, atol=1e-6)]
        if not hit:
            return False
        left.remove(hit[0])
    return True


def test_cluster_prototypes_by_hand():
    protos, labels, unbiased = cluster_prototypes(_client_protos(), num_classes=4, dim=DIM)
    a = (C0[0] + C0[1] + C0[2]) / 3
    b = (C0[3] + C0[4]) / 2
    g = [sum(C2[:5]) / 5, sum(C2[5:]) / 4]  # the last partition's clusters
    assert protos.shape == (5, DIM) and labels.tolist() == [0, 0, 1, 2, 2]
    assert _rows_match(protos[labels == 0], [a, b])
    assert _rows_match(protos[labels == 1], [C1])
    assert _rows_match(protos[labels == 2], g)
    assert unbiased.shape == (4, DIM)
    # each cluster weighted equally: (a + b) / 2, not the mean of the five client prototypes
    torch.testing.assert_close(unbiased[0], (a + b) / 2)
    assert not torch.allclose(unbiased[0], torch.stack(C0).mean(0), atol=1e-3)
    torch.testing.assert_close(unbiased[1], C1)
    torch.testing.assert_close(unbiased[2], (g[0] + g[1]) / 2)
    assert torch.isnan(unbiased[3]).all() and not torch.isnan(unbiased[:3]).any()


def test_cluster_prototypes_empty():
    protos, labels, unbiased = cluster_prototypes({0: {}, 1: {}}, num_classes=3, dim=DIM)
    assert protos.shape == (0, DIM) and labels.shape == (0,) and torch.isnan(unbiased).all()


def test_mean_prototypes_by_hand():
    out = mean_prototypes(_client_protos(), num_classes=4, dim=DIM)
    torch.testing.assert_close(out[0], (C0[0] + C0[1] + C0[2] + C0[3] + C0[4]) / 5)
    torch.testing.assert_close(out[1], C1)
    torch.testing.assert_close(out[2], sum(C2) / 9)
    assert torch.isnan(out[3]).all()
    small = mean_prototypes({0: {1: torch.tensor([1.0, 3.0])},
                             1: {1: torch.tensor([3.0, 5.0]), 0: torch.tensor([2.0, 2.0])}},
                            num_classes=2, dim=2)
    assert small.tolist() == [[2.0, 2.0], [2.0, 4.0]]


def test_fpl_server_payload():
    rule = FPLServer({}, 4, DIM, 3, [])
    pay = rule.payload(_client_protos(), 0)
    protos, labels, unbiased = cluster_prototypes(_client_protos(), 4, DIM)
    assert torch.equal(pay.cluster_protos, protos) and torch.equal(pay.cluster_labels, labels)
    assert torch.equal(pay.unbiased_protos.nan_to_num(-1), unbiased.nan_to_num(-1))
    assert torch.equal(pay.global_protos.nan_to_num(-1), mean_prototypes(_client_protos(), 4, DIM).nan_to_num(-1))
    # by hand too (the functions above are checked by hand; here the payload's own values): class 1 has one
    # client's prototype, class 3 none
    torch.testing.assert_close(pay.global_protos[1], C1)
    torch.testing.assert_close(pay.unbiased_protos[1], C1)
    assert torch.isnan(pay.global_protos[3]).all() and torch.isnan(pay.unbiased_protos[3]).all()


# --------------------------------------------------------------------------- local prototypes

@pytest.fixture(scope="module")
def usps(data_root):
    with np.load(data_root / "digits/usps_test.npz") as z:
        x, y = z["x"][:32], z["y"][:32]
    return normalize(to_tensor_images(x)), torch.from_numpy(y).long()


@pytest.mark.slow
def test_local_prototypes_are_means_of_the_last_epoch(usps):
    x, y = usps
    torch.manual_seed(0)
    module = ClientModule(ResNet10(10), lr=0.1)
    opt = module.configure_optimizers()
    module.train()
    dropped = int(y[0])  # a class seen in epoch 1 only
    keep = y != dropped
    epochs = [[(x, y)], [(x[keep][:14], y[keep][:14]), (x[keep][14:], y[keep][14:])]]
    expected_sums = {}
    for epoch in epochs:
        module.on_train_epoch_start()
        sums, counts = torch.zeros(10, 512), torch.zeros(10)
        for i, (xb, yb) in enumerate(epoch):
            with torch.no_grad():  # same weights, same mode (BatchNorm on batch statistics)
                f = module.net.features(xb)
                ce = F.cross_entropy(module.net.classifier(f), yb)
            loss = module.training_step((xb, yb), i)
            assert loss.item() == pytest.approx(ce.item(), rel=1e-5)  # FedAvg's client: CE only
            for k in range(10):
                sums[k] += f[yb == k].sum(0)
                counts[k] += (yb == k).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        expected_sums = {k: sums[k] / counts[k] for k in range(10) if counts[k] > 0}
        first_epoch = expected_sums if epoch is epochs[0] else first_epoch
    got = module.local_prototypes()
    assert sorted(got) == sorted(expected_sums) == sorted(set(y[keep].tolist()))
    assert dropped not in got
    for k in got:
        torch.testing.assert_close(got[k], expected_sums[k], rtol=1e-4, atol=1e-5)
        assert torch.all(got[k] >= 0)
    # the weights moved between the epochs, so epoch 1's means are not what was returned
    assert any(not torch.allclose(got[k], first_epoch[k], rtol=1e-4, atol=1e-5) for k in got)


def test_contrastive_similarities_stay_float32_under_bf16_autocast():
    """--precision bf16-mixed: the features come out of the network in bfloat16, but the cosines divided by
    tau = 0.02 (FPL, FedAPC), 0.07 (FedPLVM) or T = 1 (FedProc) are computed in float32: the loss equals the
    float32 loss of the same (bfloat16) features. A bfloat16 matmul would resolve the cosines near 1 of a
    trained model to about 0.004, 0.2 in a logit, and miss by far more than 1e-5."""
    from lightning_modules.losses import alpha_sparsity_loss, prototype_infonce

    g = torch.Generator().manual_seed(0)
    protos = torch.randn(30, 512, generator=g)
    proto_labels = torch.arange(30) % 10
    y = torch.randint(0, 10, (64,), generator=g)
    own = protos[y + 10 * torch.randint(0, 3, (64,), generator=g)]
    z = (own + 0.05 * torch.randn(64, 512, generator=g)).to(torch.bfloat16)  # near a prototype: cos about 0.999
    losses = {"cpcl": lambda f: cpcl_loss(f, y, protos, proto_labels, 0.02),
              "alpha": lambda f: alpha_sparsity_loss(f, y, protos, proto_labels, 0.25, 0.07),
              "infonce": lambda f: prototype_infonce(f, y, protos[:10], 1.0)}
    for name, loss in losses.items():
        ref = loss(z.float())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = loss(z)
        assert out.dtype == torch.float32, name
        assert abs(out.item() - ref.item()) < 1e-5 * max(1.0, abs(ref.item())), (name, out.item(), ref.item())
