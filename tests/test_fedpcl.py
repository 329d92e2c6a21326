"""FedPCL (Tan et al., NeurIPS 2022; yuetan031/FedPCL): its loss against a per-sample loop written as the
reference's `ConLoss` and `update_weights_lg` compute it, the projection head, the server's payload by hand,
and inference by the client's own local prototypes."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from benchmark.data import to_tensor_images
from benchmark.models import ResNet10PLVM
from benchmark.transforms import Transform
from lightning_modules.base import own_initialisation
from lightning_modules.fedpcl import FedPCLClient, FedPCLRound, FedPCLServer, projected
from lightning_modules.losses import prototype_contrastive_loss
from lightning_modules.registry import METHODS
from lightning_modules.server import LocalModelsRule
from tiny_net import TinyNet

T = 0.07


def reference_conloss(f1: torch.Tensor, f2: torch.Tensor, labels: torch.Tensor, protos: dict[int, torch.Tensor],
                      temperature: float = T, base_temperature: float = 0.07) -> torch.Tensor:
    """ConLoss row by row: the contrast features are view 1 then view 2 of the batch; row i's anchor is the
    prototype of sample i % B's class; every column but i is in the denominator, the columns of that class but
    i are the positives; -(T / T_base) times the mean over the positives of log(e^l_ij / sum_k e^l_ik)."""
    b = len(labels)
    contrast = torch.cat([f1, f2])
    rows = []
    for i in range(2 * b):
        anchor = protos[int(labels[i % b])]
        logits = [anchor @ contrast[j] / temperature for j in range(2 * b)]
        log_denom = torch.log(sum(torch.exp(logits[k]) for k in range(2 * b) if k != i))
        pos = [logits[j] - log_denom for j in range(2 * b) if j != i and labels[j % b] == labels[i % b]]
        rows.append(-(temperature / base_temperature) * sum(pos) / len(pos))
    return sum(rows) / len(rows)


def reference_fedpcl_loss(z, labels, client_protos: list[dict], global_protos: dict) -> torch.Tensor:
    """update_weights_lg's loss2: the sum over the clients' prototype sets, each filled with the global prototype
    of the classes it lacks."""
    total = 0
    for protos in client_protos:
        filled = {**global_protos, **protos}
        total = total + reference_conloss(z, z, labels, filled)
    return total


def unit(g, n, d):
    return F.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=1)


def test_registry_defaults():
    m = METHODS["fedpcl"]
    assert m.client is FedPCLClient and m.server is FedPCLServer and issubclass(m.server, LocalModelsRule)
    assert m.defaults == {"tau": 0.07, "proj_dim": 256, "global_term": False}
    assert not m.server.averages_weights


def test_contrastive_loss_equals_the_per_sample_loop_values_and_gradients():
    g = torch.Generator().manual_seed(3)
    z = unit(g, 6, 4).requires_grad_(True)
    labels = torch.tensor([0, 2, 0, 1, 2, 2])
    protos = unit(g, 3, 4) * 0.7  # means of unit vectors: shorter than 1
    ours = prototype_contrastive_loss(torch.cat([z, z]), torch.cat([labels, labels]), protos, T)
    zr = z.detach().clone().requires_grad_(True)
    ref = reference_conloss(zr, zr, labels, dict(enumerate(protos)))
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    ours.backward(), ref.backward()
    torch.testing.assert_close(z.grad, zr.grad, rtol=1e-10, atol=1e-12)
    # two different views (the code's general case) as well
    z2 = unit(g, 6, 4)
    torch.testing.assert_close(prototype_contrastive_loss(torch.cat([z.detach(), z2]), torch.cat([labels, labels]),
                                                          protos, T),
                               reference_conloss(z.detach(), z2, labels, dict(enumerate(protos))),
                               rtol=1e-12, atol=1e-12)


def test_a_class_without_prototype_or_positive_contributes_zero():
    z = torch.eye(3, dtype=torch.float64)
    protos = torch.tensor([[1.0, 0, 0], [float("nan")] * 3], dtype=torch.float64)
    # one view: sample 1 (class 1) has no prototype; samples 0 and 2 (class 0) are each other's positive
    labels = torch.tensor([0, 1, 0])
    got = prototype_contrastive_loss(z, labels, protos, 1.0, 1.0)
    # rows 0 and 2 (anchor e1): logits e1 . z_j = 1, 0, 0; row 0 over j = 1, 2: log(e^0 / (e^0 + e^0)); row 2 over
    # j = 0, 1: log(e^1 / (e^1 + e^0)); row 1: 0; mean over 3 rows
    want = -(math.log(0.5) + math.log(math.e / (math.e + 1))) / 3
    assert float(got) == pytest.approx(want, rel=1e-12)


def make_client(**hp):
    torch.manual_seed(0)
    return FedPCLClient(TinyNet(10), {**METHODS["fedpcl"].defaults, "proj_dim": 5, **hp}).double()


def payload_for(client_protos: dict[int, dict[int, torch.Tensor]]) -> FedPCLRound:
    return FedPCLServer(METHODS["fedpcl"].defaults, 3, 6, 10, []).payload(client_protos, 0)


def test_client_loss_sums_over_every_clients_prototypes_filled_with_the_global_ones():
    g = torch.Generator().manual_seed(5)
    p = (unit(g, 7, 5) * 0.8).float().double()  # values the float32 payload holds exactly
    clients = {0: {0: p[0], 1: p[1], 2: p[2]}, 1: {0: p[3], 2: p[4]}, 2: {1: p[5], 2: p[6]}}
    payload = payload_for(clients)
    glob = {0: (p[0] + p[3]) / 2, 1: (p[1] + p[5]) / 2, 2: (p[2] + p[4] + p[6]) / 3}
    for k, v in glob.items():  # the server's global prototypes by hand
        torch.testing.assert_close(payload.global_protos[k].double(), v, rtol=1e-6, atol=1e-6)
    client = make_client()
    client.start_round(1, payload, client.net.state_dict())
    z = unit(g, 5, 5).requires_grad_(True)
    y = torch.tensor([2, 0, 1, 2, 0])
    assert client.ce_weight() == 0.0  # CE is computed by the code, not trained on
    ours = client.extra_loss(None, y, None, z)
    ref = reference_fedpcl_loss(z.detach(), y, [{k: v.double() for k, v in c.items()} for c in clients.values()],
                                {k: payload.global_protos[k].double() for k in glob})
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    # the paper's global term adds the same loss against the global prototypes
    with_global = make_client(global_term=True)
    with_global.start_round(1, payload, with_global.net.state_dict())
    extra = reference_conloss(z.detach(), z.detach(), y, {k: payload.global_protos[k].double() for k in glob})
    torch.testing.assert_close(with_global.extra_loss(None, y, None, z), ref + extra, rtol=1e-10, atol=1e-10)
    # round 0: no prototypes, a zero loss
    client.start_round(0, None, client.net.state_dict())
    assert float(client.extra_loss(None, y, None, z)) == 0.0


def test_projection_head_and_own_initialisation():
    client = make_client()
    net = client.net
    assert isinstance(net, TinyNet) and net.feature_dim == 5 and type(net) is projected(TinyNet, 5)
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    logits, z = net(x)
    h = TinyNet.features(net, x)
    torch.testing.assert_close(z, F.normalize(F.relu(net.projection(h)), dim=1))
    torch.testing.assert_close(logits, net.classifier(h))
    torch.testing.assert_close(net.features(x), z)
    # a client's own model (LocalModelsRule) includes the head, seeded from (seed, client id)
    own = own_initialisation(type(net), 10, 0, 3)
    assert "projection.weight" in own and torch.equal(own["projection.weight"],
                                                      own_initialisation(type(net), 10, 0, 3)["projection.weight"])
    assert not torch.equal(own["projection.weight"], own_initialisation(type(net), 10, 0, 4)["projection.weight"])
    assert projected(ResNet10PLVM, 256)(10).feature_dim == 256


def test_local_prototypes_are_class_means_of_eval_features(data_root):
    """What a client uploads: per class the mean of its training images' projected features (the L2-normalised
    ReLU of the projection head on the model's feature), in eval mode (BatchNorm running statistics), the images
    through the eval transform; computed here by hand from the model's layers."""
    with np.load(data_root / "digits/usps_test.npz") as f:
        x, y = to_tensor_images(f["x"][:30]), torch.from_numpy(f["y"][:30]).long()
    client = make_client()
    client.net.bn.running_mean.fill_(0.3)  # eval mode's statistics differ from the batch's
    client.eval_batch = 8  # several passes
    client.transform = Transform(mean=(0.5,) * 3, std=(0.5,) * 3, augment=False)
    client.train()
    got = client.local_prototypes(x, y)
    assert client.net.training  # training mode restored
    xn, net = (x.double() / 255 - 0.5) / 0.5, client.net

    def projected_features(training: bool) -> torch.Tensor:
        with torch.no_grad():
            return F.normalize(F.relu(net.projection(TinyNet.features(net.train(training), xn))), dim=1)

    z = projected_features(False)
    assert sorted(got) == sorted(set(y.tolist()))
    for k in got:
        torch.testing.assert_close(got[k], z[y == k].mean(dim=0))
    zb = projected_features(True)  # (batch statistics would give other prototypes)
    assert not torch.allclose(got[int(y[0])], zb[y == y[0]].mean(dim=0), atol=1e-3)


def test_each_client_is_tested_by_its_own_prototypes():
    a, b = torch.tensor([1.0, 0]), torch.tensor([0.0, 1.0])
    payload = payload_for({4: {0: a}, 7: {0: b, 2: a}})
    assert torch.equal(payload.client_ids, torch.tensor([4, 7]))
    own4, own7 = payload.test_prototypes(4), payload.test_prototypes(7)
    assert torch.equal(own4[0], a) and torch.isnan(own4[1:]).all()
    assert torch.equal(own7[0], b) and torch.equal(own7[2], a) and torch.isnan(own7[1]).all()


def test_payload_values():
    """Two clients of one class each (0 and 1) in three classes: each client's row holds its own class's prototype
    and NaN elsewhere; the global table holds each class's (one client's) and NaN for class 2, which no client has."""
    payload = payload_for({0: {0: torch.ones(5)}, 1: {1: torch.full((5,), 2.0)}})
    local, glob = payload.local_protos, payload.global_protos
    assert local.shape == (2, 3, 5) and glob.shape == (3, 5)
    assert torch.equal(local[0, 0], torch.ones(5)) and torch.equal(local[1, 1], torch.full((5,), 2.0))
    assert torch.isnan(local[0, 1:]).all() and torch.isnan(local[1, [0, 2]]).all()
    assert torch.equal(glob[0], torch.ones(5)) and torch.equal(glob[1], torch.full((5,), 2.0))
    assert torch.isnan(glob[2]).all()
