"""FedProto with parameter averaging (PROTOCOL.md section 1, baselines): CE + mu·MSE(z, global
prototype of y), mu = 2, plus weighted FedAvg; the global prototype of a class is the unweighted
mean over the clients that hold it (a class nobody holds: a NaN row)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from benchmark.models import ResNet10
from lightning_modules.base import fit_local
from lightning_modules.fedproto import FedProtoClient, FedProtoRound, FedProtoServer
from lightning_modules.moon import MOONClient
from lightning_modules.registry import METHODS

from tiny_net import TinyNet as TinyBNNet

NAN = float("nan")


def make_client(**hp):
    return FedProtoClient(ResNet10(10), {**METHODS["fedproto"].defaults, **hp})


def test_registry_defaults():
    m = METHODS["fedproto"]
    assert m.client is FedProtoClient and m.server is FedProtoServer
    assert m.defaults == {"mu": 2.0, "double_forward": True}


def test_mse_term_hand_numbers():
    module = make_client()
    protos = torch.tensor([[0.0, 0.0], [1.0, 1.0], [NAN, NAN]])
    module.start_round(1, FedProtoRound(global_protos=protos), module.net.state_dict())
    z = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    y = torch.tensor([0, 1, 2])
    # per sample mean over dims: (1 + 4)/2 = 2.5, (4 + 9)/2 = 6.5, class 2 absent: 0; batch mean 3; mu 2
    assert float(module.extra_loss(None, y, None, z)) == pytest.approx(6.0)
    module.hparams["mu"] = 0.5
    assert float(module.extra_loss(None, y, None, z)) == pytest.approx(1.5)


def test_mse_term_gradient():
    module = make_client()
    module.start_round(1, FedProtoRound(global_protos=torch.tensor([[0.0, 0.0], [1.0, 1.0]])), module.net.state_dict())
    z = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    module.extra_loss(None, torch.tensor([0, 1]), None, z).backward()
    # d/dz of mu * (1/B) * (1/D) * sum (z - G_y)^2 = mu * 2 (z - G_y) / (B D) = (z - G_y)
    torch.testing.assert_close(z.grad, torch.tensor([[1.0, 2.0], [2.0, 3.0]]))


def test_round0_has_no_term():
    module = make_client()
    module.start_round(0, None, module.net.state_dict())
    assert module.extra_loss(None, torch.tensor([0]), None, torch.ones(1, 2)) is None


def test_server_mean_prototypes_unweighted_over_holders():
    rule = FedProtoServer({"mu": 2.0}, 4, 2, 5, [])
    client_protos = {
        0: {0: torch.tensor([1.0, 1.0]), 1: torch.tensor([2.0, 0.0])},
        5: {0: torch.tensor([3.0, 5.0])},
        2: {0: torch.tensor([2.0, 0.0]), 3: torch.tensor([-1.0, 4.0])},
    }
    g = rule.payload(client_protos, 0).global_protos
    assert g.shape == (4, 2)
    torch.testing.assert_close(g[0], torch.tensor([2.0, 2.0]))  # (1+3+2)/3, (1+5+0)/3
    torch.testing.assert_close(g[1], torch.tensor([2.0, 0.0]))  # held by one client
    assert torch.isnan(g[2]).all()  # held by nobody
    torch.testing.assert_close(g[3], torch.tensor([-1.0, 4.0]))


def test_parameters_take_the_weighted_mean():
    rule = METHODS["fedproto"].server({"mu": 2.0}, 10, 4, 5, ["w"])
    mean = {"w": torch.tensor([0.25, 1.5], dtype=torch.float64), "n": torch.tensor(2.6, dtype=torch.float64)}
    out = rule.aggregate({"w": torch.zeros(2), "n": torch.tensor(0)}, mean, 0)
    torch.testing.assert_close(out["w"], torch.tensor([0.25, 1.5]))
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 3


class TinyNet(nn.Module):
    feature_dim = 2

    def __init__(self):
        super().__init__()
        self.classifier = nn.Linear(2, 3)

    def forward(self, x):
        return self.classifier(x), x  # the feature is the input itself


def test_local_prototypes_are_class_means_of_the_last_epoch():
    module = make_client()
    module.num_classes = 3
    module.net = TinyNet()
    module.on_train_epoch_start()  # epoch 1: forgotten
    module.training_step((torch.tensor([[9.0, 9.0], [7.0, 7.0]]), torch.tensor([0, 2])), 0)
    module.on_train_epoch_start()  # last epoch, two batches
    module.training_step((torch.tensor([[1.0, 2.0], [3.0, 0.0]]), torch.tensor([0, 1])), 0)
    module.training_step((torch.tensor([[3.0, 4.0]]), torch.tensor([0])), 1)
    protos = module.local_prototypes()
    assert sorted(protos) == [0, 1]
    torch.testing.assert_close(protos[0], torch.tensor([2.0, 3.0]))
    torch.testing.assert_close(protos[1], torch.tensor([3.0, 0.0]))


# --------------------------------------------------------------------- the reference's double forward
@pytest.mark.parametrize("method", ["fedproto", "moon"])
def test_double_forward_moves_bn_statistics_as_a_second_pass(method):
    """RethinkFL's FedProto and MOON run the network twice per step (logits, then features). With
    double_forward=true our one pass leaves the BatchNorm running statistics where a real second
    training-mode pass would; the weights are the same either way; with false the statistics differ."""
    cls = {"fedproto": FedProtoClient, "moon": MOONClient}[method]
    torch.manual_seed(0)
    start = {k: v.clone() for k, v in TinyBNNet(10).state_dict().items()}
    x = torch.randint(0, 256, (12, 3, 32, 32), generator=torch.Generator().manual_seed(4), dtype=torch.uint8)
    y = torch.arange(12) % 10

    def trained(double_forward, second_pass=False):
        module = cls(TinyBNNet(10), {**METHODS[method].defaults, "double_forward": double_forward})
        module.start_round(1, None, start, client_state=None)
        if second_pass:  # the reference: one more forward of the network in training mode every step
            step = module.training_step

            def twice(batch, i):
                module.net.features(batch[0])
                return step(batch, i)
            module.training_step = twice
        fit_local(module, x, y, 2, 4, torch.Generator().manual_seed(1))
        return module.net.state_dict()

    ours, single, reference = trained(True), trained(False), trained(False, second_pass=True)
    for k in ("bn.running_mean", "bn.running_var"):
        torch.testing.assert_close(ours[k], reference[k], rtol=1e-5, atol=1e-6)
        assert not torch.allclose(single[k], reference[k], rtol=1e-3, atol=1e-4)
    for k, v in reference.items():
        if "running" not in k and "num_batches" not in k:
            torch.testing.assert_close(ours[k], v, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(single[k], v, rtol=1e-5, atol=1e-6)
