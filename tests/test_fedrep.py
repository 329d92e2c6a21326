"""FedRep (PROTOCOL.md section 4, FedProto's Table 1 baseline; lgcollins/FedRep): each round the head first, the
body frozen, then the body, the head frozen; FedPer's rule on the server. The split by hand, and on real USPS
images the frozen part of each phase does not move (SGD with momentum and weight decay)."""
from __future__ import annotations

import pytest
import torch

from benchmark.cnn import CNNMnist
from lightning_modules.base import fit_local
from lightning_modules.clients import client_generator
from lightning_modules.fedper import FedPerServer
from lightning_modules.fedrep import FedRepClient
from lightning_modules.registry import METHODS, HyperparameterError
from ray_jobs.config import RunConfig

from test_fused import shards  # noqa: F401 (the fixture: real USPS shards of 5 clients)
from tiny_net import TinyNet


def test_registry_entry():
    m = METHODS["fedrep"]
    assert m.client is FedRepClient and m.server is FedPerServer and m.variant_of is None
    assert m.defaults == {"head": "classifier", "rep_epochs": 0.5}
    with pytest.raises(HyperparameterError, match=r"^rep_epochs must be a number > 0 \(got 0\)\.$"):
        RunConfig(method="fedrep", hparams={"rep_epochs": 0})


def phases(rep_epochs: float, epoch_steps: int, epochs: int) -> str:
    """'h' where the head trains, 'b' where the body does, step by step."""
    module = FedRepClient(TinyNet(10), {"head": "classifier", "rep_epochs": rep_epochs})
    out = ""
    for step in range(epoch_steps * epochs):
        module.on_local_step(step, epoch_steps, epochs)
        head, body = module.net.classifier.weight.requires_grad, module.net.conv.weight.requires_grad
        assert head != body and all(p.requires_grad == body for n, p in module.net.named_parameters()
                                    if not n.startswith("classifier."))
        out += "h" if head else "b"
    return out


def test_the_split_by_hand():
    assert phases(0.5, 10, 1) == "hhhhhbbbbb"  # FedProto's one epoch: its first half the head, then the body
    assert phases(1, 4, 3) == "hhhhhhhhbbbb"  # the reference's rule: all epochs but the last rep_epochs
    assert phases(1, 4, 1) == "bbbb"  # the reference with 1 epoch: the head never trains
    assert phases(0.25, 4, 1) == "hhhb"
    # an odd number of steps: the head's count is rounded half to even (Python's round, as the committed runs ran)
    assert phases(0.5, 5, 1) == "hhbbb" and phases(0.5, 7, 1) == "hhhhbbb" and phases(0.5, 1, 1) == "b"


def test_under_fedprotos_protocol_the_head_is_every_fc_layer():
    """FedProto's CNN with `head=fc` (its protocol's): fc1 and the classifier train in the head's steps, conv1 and
    conv2 in the body's."""
    cfg = RunConfig.from_preset("fedproto-mnist-n4", method="fedrep")
    assert cfg.hparams == {"head": "fc", "rep_epochs": 0.5} and cfg.aggregation == "uniform"
    module = FedRepClient(CNNMnist(), cfg.hparams)
    seen = []
    for step in range(4):
        module.on_local_step(step, 4, 1)
        seen.append(sorted(n for n, p in module.net.named_parameters() if p.requires_grad))
    fc = ["classifier.bias", "classifier.weight", "fc1.bias", "fc1.weight"]
    assert seen == [fc, fc, ["conv1.bias", "conv1.weight", "conv2.bias", "conv2.weight"]] + [seen[2]]


def test_frozen_parts_do_not_move_in_their_phase(shards):  # noqa: F811
    """One epoch of 10 samples, batch 2 (5 steps), momentum 0.9 and weight decay 1e-3: in the head's 3 steps the
    body keeps its weights, in the body's 2 steps the head keeps the weights it had at the switch, though its
    momentum buffer is not zero; both parts do move in their own phase."""
    module = FedRepClient(TinyNet(10), {"head": "classifier", "rep_epochs": 0.4}, lr=0.05, momentum=0.9,
                          weight_decay=1e-3)
    torch.manual_seed(0)
    start = {k: v.clone() for k, v in TinyNet(10).state_dict().items()}
    module.start_round(0, None, start)
    seen = []
    step_hook = module.on_local_step

    def record(step, epoch_steps, epochs):
        seen.append({k: v.detach().clone() for k, v in module.net.state_dict().items()})
        step_hook(step, epoch_steps, epochs)

    module.on_local_step = record
    x, y = shards[0]
    fit_local(module, x, y, 1, 2, client_generator(0, 0, 0))
    seen.append({k: v.detach().clone() for k, v in module.net.state_dict().items()})
    assert len(seen) == 6  # before each of the 5 steps, and after the last
    body = [k for k in start if not k.startswith("classifier.") and "running" not in k and "num_batches" not in k]
    head = ["classifier.weight", "classifier.bias"]
    for s in seen[:4]:  # before steps 0-3: only head steps (0, 1, 2) ran
        for k in body:
            torch.testing.assert_close(s[k], start[k], rtol=0, atol=0)
    for s in seen[4:]:  # after the switch (step 3): the head as it was then
        for k in head:
            torch.testing.assert_close(s[k], seen[3][k], rtol=0, atol=0)
    assert all(not torch.equal(seen[3][k], start[k]) for k in head)  # the head moved in its phase
    assert all(not torch.equal(seen[5][k], seen[3][k]) for k in body)  # the body moved in its phase
