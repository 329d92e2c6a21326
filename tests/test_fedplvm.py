"""FedPLVM (PROTOCOL.md section 2): the alpha-sparsity contrast and the correction terms against
straightforward per-sample implementations (values and gradients), dual-level clustering on a
constructed example whose clusters are known, the eval-mode feature pass, the server's
prototype rules of the ablations (Tables 3 and 4), the loss switches (Table 5) and the
hyperparameter checks."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from finch import FINCH
from test_fpl import _rows_match  # the same rows in any order
from tiny_net import TinyNet

from benchmark.data import to_tensor_images
from benchmark.transforms import Transform
from lightning_modules.fedplvm import FedPLVMClient, FedPLVMRound, FedPLVMServer, class_means
from lightning_modules.losses import COS_EPS, alpha_sparsity_loss, correction_loss, paper_correction_loss
from lightning_modules.registry import METHODS
from ray_jobs.config import RunConfig

NAN = float("nan")
ALPHA, TAU = 0.25, 0.07


# --------------------------------------------------------------------------- per-sample references
def s_alpha(z, p, alpha):
    cos = torch.dot(z, p) / (z.norm() * p.norm())
    return torch.clamp(cos, min=COS_EPS) ** alpha


def ref_contrast(z, y, protos, labels, alpha, tau):
    """The official code's loop: per sample -log(sum_pos e^{s/tau} / sum_all e^{s/tau}); no positive: 0."""
    total = 0
    for zi, yi in zip(z, y.tolist()):
        e = [torch.exp(s_alpha(zi, p, alpha) / tau) for p in protos]
        pos = [v for v, lab in zip(e, labels.tolist()) if lab == yi]
        if pos:
            total = total - torch.log(sum(pos) / sum(e))
    return total / len(y)


def ref_correction(z, y, means):
    """The official code: 2 * MSE(cos(z_i, g_{y_i}), 1); a class without prototypes contributes 0."""
    total = 0
    for zi, yi in zip(z, y.tolist()):
        if not torch.isnan(means[yi]).any():
            total = total + (1 - torch.dot(zi, means[yi]) / (zi.norm() * means[yi].norm())) ** 2
    return 2 * total / len(y)


def ref_paper_correction(z, y, protos, labels, alpha):
    """Eq. 8: | sum_{g of class y} s_alpha(z, g) - C_y |, C_y = the number of class y's prototypes."""
    total = 0
    for zi, yi in zip(z, y.tolist()):
        mine = [p for p, lab in zip(protos, labels.tolist()) if lab == yi]
        if mine:
            total = total + abs(sum(s_alpha(zi, p, alpha) for p in mine) - len(mine))
    return total / len(y)


@pytest.fixture(scope="module")
def case():
    gen = torch.Generator().manual_seed(0)
    dim = 5
    z = torch.rand(7, dim, generator=gen, dtype=torch.float64)  # non-negative like post-ReLU features
    z[6] = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0], dtype=torch.float64)  # orthogonal to protos[0]: clamped cosine
    y = torch.tensor([0, 1, 2, 3, 0, 2, 0])  # class 3 has no prototype
    protos = torch.rand(6, dim, generator=gen, dtype=torch.float64)
    protos[0] = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 2, 2, 2])
    means = torch.full((4, dim), NAN, dtype=torch.float64)
    for k in range(3):
        means[k] = protos[labels == k].mean(dim=0)
    return z, y, protos, labels, means


def grads(fn, z):
    z = z.clone().requires_grad_(True)
    out = fn(z)
    (g,) = torch.autograd.grad(out, z)
    return out.detach(), g


def test_alpha_sparsity_loss_against_per_sample_reference(case):
    z, y, protos, labels, _ = case
    for alpha, tau in ((ALPHA, TAU), (0.5, 0.3), (1.0, 0.07)):
        got, g_got = grads(lambda t: alpha_sparsity_loss(t, y, protos, labels, alpha, tau), z)
        ref, g_ref = grads(lambda t: ref_contrast(t, y, protos, labels, alpha, tau), z)
        assert float(got) == pytest.approx(float(ref), rel=1e-10)
        torch.testing.assert_close(g_got, g_ref, rtol=1e-9, atol=1e-12)
        assert torch.all(g_got[3] == 0) and g_got.abs().sum() > 0  # no prototype: no term
    # alpha matters: the sparsity power changes the value
    assert float(alpha_sparsity_loss(z, y, protos, labels, 0.25, TAU)) != pytest.approx(
        float(alpha_sparsity_loss(z, y, protos, labels, 1.0, TAU)), rel=1e-3)


def test_alpha_sparsity_loss_is_finite_where_a_cosine_is_zero():
    z = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    protos = torch.tensor([[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    loss = alpha_sparsity_loss(z, torch.tensor([1]), protos, torch.tensor([0, 1]), ALPHA, TAU)
    loss.backward()
    assert torch.isfinite(z.grad).all()
    # by hand: s = (eps^a, (1/sqrt 2)^a); loss = -log(e^{s1/tau} / (e^{s0/tau} + e^{s1/tau}))
    s0, s1 = COS_EPS ** ALPHA, (1 / math.sqrt(2)) ** ALPHA
    assert float(loss.detach()) == pytest.approx(math.log1p(math.exp((s0 - s1) / TAU)), rel=1e-9)


def test_correction_losses_against_per_sample_reference(case):
    z, y, protos, labels, means = case
    got, g_got = grads(lambda t: correction_loss(t, y, means), z)
    ref, g_ref = grads(lambda t: ref_correction(t, y, means), z)
    assert float(got) == pytest.approx(float(ref), rel=1e-10)
    torch.testing.assert_close(g_got, g_ref, rtol=1e-9, atol=1e-12)
    got, g_got = grads(lambda t: paper_correction_loss(t, y, protos, labels, ALPHA), z)
    ref, g_ref = grads(lambda t: ref_paper_correction(t, y, protos, labels, ALPHA), z)
    assert float(got) == pytest.approx(float(ref), rel=1e-10)
    torch.testing.assert_close(g_got, g_ref, rtol=1e-9, atol=1e-12)
    assert float(got) != pytest.approx(float(correction_loss(z, y, means)), rel=1e-2)  # two different terms


def test_correction_hand_numbers():
    # cos(z0, g0) = 1/sqrt2, cos(z1, g1) = 1: 2 * ((1 - 1/sqrt2)^2 + 0) / 2
    z = torch.tensor([[1.0, 0.0], [0.0, 3.0]])
    means = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    assert float(correction_loss(z, torch.tensor([0, 1]), means)) == pytest.approx((1 - 1 / math.sqrt(2)) ** 2)


# --------------------------------------------------------------------------- dual-level clustering
DIM = 6


def group(direction: int, n: int, seed: int, client: int = 0) -> torch.Tensor:
    """n points close to basis vector e_direction (non-negative), a group FINCH keeps as one cluster;
    another client's group of the same direction lies slightly off (in e_5) so that its members
    stay nearer each other than to this client's."""
    gen = torch.Generator().manual_seed(seed)
    pts = torch.zeros(n, DIM)
    pts[:, direction] = 1.0
    pts[:, 5] = 0.05 * client
    return pts + 0.01 * torch.rand(n, DIM, generator=gen)


def constructed():
    """Two clients; their features by class, in groups of 3 along basis directions.

    client 0: class 0 along e0 and e1 (two groups), class 1 along e2 (one group);
    client 1: class 0 along e0 and e1, class 1 along e3.
    Expected local level: client 0 class 0 -> 2 prototypes, class 1 -> 1; client 1 the same.
    Global level: class 0's four local prototypes pair up by direction -> 2 global prototypes;
    class 1's two (e2, e3) -> one.
    """
    feats = {
        0: {0: [group(0, 3, 1), group(1, 3, 2)], 1: [group(2, 3, 3)]},
        1: {0: [group(0, 3, 4, client=1), group(1, 3, 5, client=1)], 1: [group(3, 3, 6, client=1)]},
    }
    return feats


def test_dual_level_clustering_on_a_constructed_example():
    feats = constructed()
    module = FedPLVMClient(TinyNet(4), METHODS["fedplvm"].defaults)
    module.eval_features = lambda x: x  # the features themselves stand for the images here
    uploads, local_expected = {}, {}
    for cid, by_cls in feats.items():
        z = torch.cat([g for k in sorted(by_cls) for g in by_cls[k]])
        y = torch.cat([torch.full((3 * len(by_cls[k]),), k) for k in sorted(by_cls)])
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(cid))  # order does not matter
        uploads[cid] = module.local_prototypes(z[perm], y[perm])
        local_expected[cid] = {k: [g.mean(dim=0) for g in gs] for k, gs in by_cls.items()}
        assert sorted(uploads[cid]) == [0, 1]
        for k in (0, 1):
            assert _rows_match(uploads[cid][k], local_expected[cid][k]), (cid, k, uploads[cid][k])
    rule = FedPLVMServer(METHODS["fedplvm"].defaults, 4, DIM, 10, [])
    pay = rule.payload(uploads, 0)
    e = local_expected
    g0 = [(e[0][0][0] + e[1][0][0]) / 2, (e[0][0][1] + e[1][0][1]) / 2]  # pairs by direction
    g1 = [(e[0][1][0] + e[1][1][0]) / 2]
    assert pay.prototype_labels.tolist() == [0, 0, 1] and pay.num_prototypes == 3
    assert _rows_match(pay.prototypes[pay.prototype_labels == 0], g0)
    assert _rows_match(pay.prototypes[pay.prototype_labels == 1], g1)
    g = class_means(pay.prototypes, pay.prototype_labels, 4)  # g_y, as each client takes it
    torch.testing.assert_close(g[0], (g0[0] + g0[1]) / 2)
    torch.testing.assert_close(g[1], g1[0])
    assert torch.isnan(g[2:]).all()

    # Table 4 w/o: every local prototype sent (4 of class 0, 2 of class 1), g_y their mean
    rule_all = FedPLVMServer(METHODS["fedplvm_no_global_clustering"].defaults, 4, DIM, 10, [])
    pay_all = rule_all.payload(uploads, 0)
    assert pay_all.prototype_labels.tolist() == [0, 0, 0, 0, 1, 1] and pay_all.num_prototypes == 6
    assert _rows_match(pay_all.prototypes[:4], e[0][0] + e[1][0])
    torch.testing.assert_close(class_means(pay_all.prototypes, pay_all.prototype_labels, 4)[0],
                               sum(e[0][0] + e[1][0]) / 4)

    # Table 3 */avg: one prototype per class, the mean of the clients' local ones
    pay_mean = FedPLVMServer(METHODS["fedplvm_avg_avg"].defaults, 4, DIM, 10, []).payload(uploads, 0)
    assert pay_mean.prototype_labels.tolist() == [0, 1]
    torch.testing.assert_close(pay_mean.prototypes, class_means(pay_all.prototypes, pay_all.prototype_labels, 4)[:2])

    # Table 12 cluster/avg: the clustered local prototypes, one global per class, the mean of all of them
    pay_ca = FedPLVMServer(METHODS["fedplvm_cluster_avg"].defaults, 4, DIM, 10, []).payload(uploads, 0)
    assert pay_ca.prototype_labels.tolist() == [0, 1]
    torch.testing.assert_close(pay_ca.prototypes[0], sum(e[0][0] + e[1][0]) / 4)
    torch.testing.assert_close(pay_ca.prototypes[1], sum(e[0][1] + e[1][1]) / 2)

    # Table 3 avg/*: a client uploads one class mean per class
    module.hparams["local_protos"] = "mean"
    z = torch.cat(feats[0][0] + feats[0][1])
    y = torch.tensor([0] * 6 + [1] * 3)
    got = module.local_prototypes(z, y)
    torch.testing.assert_close(got[0], z[:6].mean(dim=0, keepdim=True))
    torch.testing.assert_close(got[1], z[6:].mean(dim=0, keepdim=True))


def lloyd_fixed_point(points: torch.Tensor, centers: torch.Tensor) -> bool:
    """Each center is the mean of the points nearest to it (K-Means converged), and every center has some."""
    nearest = torch.cdist(points, centers).argmin(dim=1)
    return all((nearest == j).any() and torch.allclose(points[nearest == j].mean(dim=0), c, atol=1e-5)
               for j, c in enumerate(centers))


def test_kmeans_finds_constructed_clusters():
    """Table 9's K-Means (scikit-learn, seeded): three tight groups far apart give their means with K = 3; K = FINCH's
    count (4 here) and K = 2 converged partitions of that many; K above the distinct points as many as there are."""
    from lightning_modules.prototypes import finch_clusters, kmeans_centers

    blobs = [group(d, 10, 20 + d) for d in (0, 1, 2)]
    pts = torch.cat(blobs)[torch.randperm(30, generator=torch.Generator().manual_seed(0))]
    means = [b.mean(dim=0) for b in blobs]
    assert _rows_match(kmeans_centers(pts, 3), means)
    n_finch = len(np.unique(finch_clusters(pts)))
    adaptive = kmeans_centers(pts, "adaptive")
    assert len(adaptive) == n_finch == 4 and lloyd_fixed_point(pts, adaptive)  # FINCH's last partition splits one
    two = kmeans_centers(pts, 2)
    assert len(two) == 2 and lloyd_fixed_point(pts, two)
    torch.testing.assert_close(kmeans_centers(pts, 2), two)  # seeded: the same again
    dup = torch.cat([means[0].expand(4, DIM), means[1].expand(3, DIM)])
    assert _rows_match(kmeans_centers(dup, 5), means[:2])  # 2 distinct rows: 2 clusters
    torch.testing.assert_close(kmeans_centers(pts[:1], 5), pts[:1])


def test_kmeans_at_both_levels_on_the_constructed_example():
    """On the constructed example FINCH finds its groups; K-Means with K = FINCH's count gives the same prototypes
    at both levels; K = 2 gives 2 local prototypes for every class (Lloyd fixed points of its features) and 2
    global ones of each class."""
    feats = constructed()
    finch = FedPLVMClient(TinyNet(4), METHODS["fedplvm"].defaults)
    kmeans = FedPLVMClient(TinyNet(4), METHODS["fedplvm_kmeans_adaptive"].defaults)
    k2 = FedPLVMClient(TinyNet(4), METHODS["fedplvm_kmeans2"].defaults)
    ups = {"f": {}, "a": {}, "2": {}}
    for cid, by_cls in feats.items():
        z = torch.cat([g for k in sorted(by_cls) for g in by_cls[k]])
        y = torch.cat([torch.full((3 * len(by_cls[k]),), k) for k in sorted(by_cls)])
        for key, m in (("f", finch), ("a", kmeans), ("2", k2)):
            m.eval_features = lambda x: x
            ups[key][cid] = m.local_prototypes(z, y)
        for k in (0, 1):
            assert _rows_match(ups["a"][cid][k], ups["f"][cid][k])
            assert len(ups["2"][cid][k]) == 2 and lloyd_fixed_point(z[y == k], ups["2"][cid][k])
    pf = FedPLVMServer(METHODS["fedplvm"].defaults, 4, DIM, 10, []).payload(ups["f"], 0)
    pa = FedPLVMServer(METHODS["fedplvm_kmeans_adaptive"].defaults, 4, DIM, 10, []).payload(ups["a"], 0)
    assert pa.prototype_labels.tolist() == pf.prototype_labels.tolist() == [0, 0, 1]
    for k in (0, 1):
        assert _rows_match(pa.prototypes[pa.prototype_labels == k], pf.prototypes[pf.prototype_labels == k])
    p2 = FedPLVMServer(METHODS["fedplvm_kmeans2"].defaults, 4, DIM, 10, []).payload(ups["2"], 0)
    assert p2.prototype_labels.tolist() == [0, 0, 1, 1]
    for k in (0, 1):
        pts = torch.cat([ups["2"][c][k] for c in (0, 1)])
        assert lloyd_fixed_point(pts, p2.prototypes[p2.prototype_labels == k])


def test_local_pass_is_eval_mode_over_the_training_images(data_root):
    """The post-training features come from the model in eval mode (BatchNorm running statistics),
    the images normalised without augmentation; training mode is restored after."""
    with np.load(data_root / "digits/usps_test.npz") as f:
        x, y = to_tensor_images(f["x"][:40]), torch.from_numpy(f["y"][:40]).long()
    torch.manual_seed(0)
    module = FedPLVMClient(TinyNet(10), METHODS["fedplvm"].defaults)
    module.net.bn.running_mean.fill_(0.3)  # eval mode's statistics differ from the batch's
    module.eval_batch = 16  # several passes
    module.transform = Transform(mean=(0.5,) * 3, std=(0.5,) * 3, augment=False)  # FedPLVM's Digit-5 transform
    module.train()
    got = module.eval_features(x)
    assert module.net.training
    xn = (x.float() / 255 - 0.5) / 0.5
    module.net.eval()
    with torch.no_grad():
        expected = module.net.features(xn)
        batch_stats = module.net.train().features(xn)
    torch.testing.assert_close(got, expected)
    assert not torch.allclose(got, batch_stats, atol=1e-3)
    module.net.eval()  # (the train-mode pass above moved the running statistics: the features as they are now)
    with torch.no_grad():
        now = module.net.features(xn)
    module.train()
    protos = module.local_prototypes(x, y)
    assert sorted(protos) == sorted(set(y.tolist()))
    for k, p in protos.items():  # per class the means of FINCH's clusters (finch-clust called here directly)
        z = now[y == k]
        if len(z) == 1:
            want = z
        else:
            c, _, _ = FINCH(data=z.numpy().astype(np.float32), distance="cosine", ensure_early_exit=False,
                            verbose=False)
            want = torch.stack([z[torch.from_numpy(c[:, -1] == j)].mean(dim=0) for j in np.unique(c[:, -1])])
        assert p.shape == want.shape and _rows_match(p, want), k
    module.hparams["local_protos"] = "mean"  # Table 3's avg: the one class mean
    protos = module.local_prototypes(x, y)
    for k in set(y.tolist()):
        torch.testing.assert_close(protos[k], now[y == k].mean(dim=0, keepdim=True))


# --------------------------------------------------------------------------- client loss and switches
@pytest.fixture(scope="module")
def payload(case):
    _, _, protos, labels, means = case
    return FedPLVMRound(prototypes=protos.float(), prototype_labels=labels)  # the clients' g_y: `means`


@pytest.mark.parametrize("name,terms", [
    ("fedplvm", ("contrast", "correction")),
    ("fedplvm_contrast_only", ("contrast",)),
    ("fedplvm_correction_only", ("correction",)),
    ("fedplvm_no_loss", ()),
    ("fedplvm_avg_avg", ("contrast", "correction")),
    ("fedplvm_no_global_clustering", ("contrast", "correction")),
])
def test_loss_switches_change_exactly_their_terms(case, payload, name, terms):
    z, y, protos, labels, means = case
    z = z.float()
    m = METHODS[name]
    assert m.client is FedPLVMClient and m.server is FedPLVMServer
    module = m.client(TinyNet(10), m.defaults)
    module.start_round(0, None, module.net.state_dict())
    assert module.extra_loss(None, y, None, z) is None  # round 0: no prototypes, CE alone
    module.start_round(3, payload, module.net.state_dict())
    got = module.extra_loss(None, y, None, z)
    ref = {"contrast": float(ref_contrast(z.double(), y, protos, labels, ALPHA, TAU)),
           "correction": float(ref_correction(z.double(), y, means))}
    if not terms:
        assert got is None
    else:
        assert float(got) == pytest.approx(100.0 * sum(ref[t] for t in terms), rel=1e-5)


def test_paper_correction_form(case, payload):
    z, y, protos, labels, means = case
    module = FedPLVMClient(TinyNet(10), {**METHODS["fedplvm"].defaults, "correction_form": "paper", "lambda": 2.0,
                                        "contrast": False})
    module.start_round(3, payload, module.net.state_dict())
    ref = float(ref_paper_correction(z, y, protos, labels, ALPHA))
    assert float(module.extra_loss(None, y, None, z.float())) == pytest.approx(2.0 * ref, rel=1e-5)


def test_registry_defaults_and_variants():
    base = {"alpha": 0.25, "tau": 0.07, "lambda": 100.0, "contrast": True, "correction": True,
            "correction_form": "code", "local_protos": "cluster", "global_protos": "cluster", "clustering": "finch",
            "kmeans_k": "adaptive", "dp_sgd": False, "dp_epsilon": 4.0, "dp_delta": 1e-5, "dp_max_grad_norm": 1.0,
            "dp_budget": "run", "proto_noise": False, "proto_noise_scale": 0.05,
            "proto_noise_coefficient": 0.1}  # Table 11: off
    assert METHODS["fedplvm"].defaults == base
    assert METHODS["fedplvm_avg_avg"].defaults == {**base, "local_protos": "mean", "global_protos": "mean"}
    assert METHODS["fedplvm_avg_cluster"].defaults == {**base, "local_protos": "mean"}
    assert METHODS["fedplvm_no_global_clustering"].defaults == {**base, "global_protos": "all"}
    assert METHODS["fedplvm_no_loss"].defaults == {**base, "contrast": False, "correction": False}
    assert METHODS["fedplvm_contrast_only"].defaults == {**base, "correction": False}
    assert METHODS["fedplvm_correction_only"].defaults == {**base, "contrast": False}
    assert METHODS["fedplvm_cluster_avg"].defaults == {**base, "global_protos": "mean"}  # Table 12
    assert METHODS["fedplvm_kmeans_adaptive"].defaults == {**base, "clustering": "kmeans"}  # Table 9
    assert METHODS["fedplvm_kmeans2"].defaults == {**base, "clustering": "kmeans", "kmeans_k": 2}
    assert METHODS["fedplvm_kmeans5"].defaults == {**base, "clustering": "kmeans", "kmeans_k": 5}


@pytest.mark.parametrize("name,value", [
    ("alpha", 0), ("alpha", 1.5), ("alpha", "0.25"), ("tau", 0), ("tau", -0.07), ("lambda", 0), ("lambda", True),
    ("contrast", "yes"), ("correction", 1), ("correction_form", "mse"), ("local_protos", "kmeans"),
    ("global_protos", "none"), ("clustering", "dbscan"), ("kmeans_k", 0), ("kmeans_k", "auto"), ("kmeans_k", 2.5),
])
def test_invalid_hyperparameter_raises_naming_it(name, value):
    with pytest.raises(ValueError, match=name):
        RunConfig(method="fedplvm", hparams={name: value})
