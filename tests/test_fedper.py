"""FedPer (PROTOCOL.md section 4, FedProto's Table 1 baseline): the body averaged (by sample count; unweighted, the
convolutions only, under FedProto's protocol), each client's head kept on the client from round to round. Hand
numbers on constructed weights, then a real round of three USPS clients on a tiny network checked against each
client trained alone by FedAvg's module."""
from __future__ import annotations

import pytest
import torch

from benchmark.cnn import CNNMnist
from benchmark.communication import count
from lightning_modules.clients import aggregation_weight
from lightning_modules.fedper import FedPerClient, FedPerServer
from lightning_modules.registry import METHODS, HyperparameterError
from lightning_modules.server import accumulate, weighted_mean
from ray_jobs.config import RunConfig

from test_fused import SIZES, make_group, shards  # noqa: F401 (the fixture: real USPS shards of 5 clients)
from tiny_net import TinyNet


def test_registry_entry():
    m = METHODS["fedper"]
    assert m.client is FedPerClient and m.server is FedPerServer and m.variant_of is None
    assert m.defaults == {"head": "classifier"} and FedPerServer.personal_models and not FedPerServer.per_client
    with pytest.raises(HyperparameterError,
                       match=r"^unknown head value 'fc2' \(did you mean fc\?\); choose one of: classifier, fc\.$"):
        RunConfig(method="fedper", hparams={"head": "fc2"})


def test_the_body_travels_by_hand():
    """FedProto's CNN: conv1 10x1x5x5 + 10 = 260, conv2 20x10x5x5 + 20 = 5,020, fc1 320 x 50 + 50 = 16,050,
    classifier 50 x 10 + 10 = 510. The classifier stays: 21,330 travel; every fc layer stays: 5,280, which x 20
    clients is the paper's 106k per round."""
    state = CNNMnist().state_dict()
    assert count(FedPerServer.travelling({"head": "classifier"}, state))[0] == 260 + 5020 + 16050
    assert count(FedPerServer.travelling({"head": "fc"}, state))[0] == 260 + 5020
    assert sorted(FedPerServer.travelling({"head": "fc"}, state)) == ["conv1.bias", "conv1.weight", "conv2.bias",
                                                                    "conv2.weight"]


@pytest.mark.parametrize("preset", ["fedproto-mnist-n3", "fedproto-mnist-n5-s3", "fedproto-mnist-n3-k20"])
def test_fedprotos_protocol_shares_the_convolutions_unweighted(preset):
    """FedProto's protocol (its code's `average_weights_per`: the keys not starting with `fc`, an unweighted mean):
    the head is every fc layer and each client weighs 1 whatever its samples; today's sharing (the classifier kept)
    is `--hp head=classifier`, a run of its own name. Without a preset: the classifier, by sample count."""
    for method in ("fedper", "fedrep"):
        cfg = RunConfig.from_preset(preset, method=method)
        assert cfg.hparams["head"] == "fc" and cfg.aggregation == "uniform"
        assert aggregation_weight(cfg, FedPerServer, 396) == aggregation_weight(cfg, FedPerServer, 200) == 1.0
        assert cfg.run_name.endswith(f"{cfg.split}-seed0")
        kept = RunConfig.from_preset(preset, method=method, hparams={"head": "classifier"})
        assert kept.run_name.endswith(f"{cfg.split}-headclassifier-seed0")
        plain = RunConfig(method=method, dataset="mnist")
        assert plain.hparams["head"] == "classifier" and aggregation_weight(plain, FedPerServer, 396) == 396.0


def test_the_convolutions_averaged_unweighted_by_hand():
    """Two CNN clients of 200 and 500 samples under FedProto's protocol: conv1 and conv2 become (a + b) / 2, fc1 and
    the classifier are not uploaded and the global ones stay the initialisation's."""
    cfg = RunConfig.from_preset("fedproto-mnist-n3", method="fedper")
    torch.manual_seed(0)
    init, a, b = (CNNMnist().state_dict() for _ in range(3))
    rule = FedPerServer(cfg.hparams, 10, 50, 100, list(init))
    acc, total = None, 0.0
    for state, n in ((a, 200), (b, 500)):
        w = aggregation_weight(cfg, rule, n)
        acc, total = accumulate(acc, rule.travelling(rule.hparams, state), w), total + w
    assert sorted(acc) == ["conv1.bias", "conv1.weight", "conv2.bias", "conv2.weight"] and total == 2.0
    new = rule.aggregate(init, weighted_mean([acc], [total]), 0)
    for k in init:
        want = (a[k] + b[k]) / 2 if k.startswith("conv") else init[k]
        torch.testing.assert_close(new[k], want)


def test_aggregation_by_hand():
    """Two clients of 2 and 3 samples: the body is (2 a + 3 b) / 5, the global head stays the initial one."""
    rule = FedPerServer({"head": "classifier"}, 2, 1, 5, ["body.w", "classifier.w"])
    init = {"body.w": torch.tensor([0.0, 0.0]), "classifier.w": torch.tensor([7.0])}
    a = {"body.w": torch.tensor([1.0, 2.0]), "classifier.w": torch.tensor([100.0])}
    b = {"body.w": torch.tensor([6.0, -3.0]), "classifier.w": torch.tensor([-100.0])}
    acc = None
    for state, n in ((a, 2), (b, 3)):
        acc = accumulate(acc, rule.travelling(rule.hparams, state), n)
    new = rule.aggregate(init, weighted_mean([acc], [5]), 0)
    torch.testing.assert_close(new["body.w"], torch.tensor([(2 + 18) / 5, (4 - 9) / 5]))  # (4, -1)
    torch.testing.assert_close(new["classifier.w"], torch.tensor([7.0]))
    # a client starts from the global body and its own head (the initial head before it has one)
    module = FedPerClient(TinyNet(2), {"head": "classifier"})
    assert module.personalise(new, None) is new
    assert module.personalise(new, {"classifier.w": a["classifier.w"]})["classifier.w"].item() == 100.0


def test_a_round_heads_apart_and_the_body_the_weighted_mean(shards):  # noqa: F811
    """Round 0 trains each client as FedAvg's module would from the same start (same generator); after it each
    client keeps its own trained head, the global body is the sample-weighted mean of the trained bodies (by
    hand over the clients trained alone), and round 1 starts each client from that body and its own head."""
    torch.manual_seed(0)
    init = TinyNet(10).state_dict()
    group = make_group("fedper", "sequential", shards, torch.float32)
    res = group.train(init, None, 0)
    alone = {}
    for cid in SIZES:  # FedAvg's module, one client per group: its trained weights are its sum / its weight
        single = make_group("fedavg", "sequential", {cid: shards[cid]}, torch.float32)
        single.clients = [c for c in single.clients if c["id"] == cid]
        r = single.train(init, None, 0)
        alone[cid] = {k: v / r["weight"] for k, v in r["sum"].items()}
    heads = {cid: group.client_states[cid] for cid in SIZES}
    for cid in SIZES:
        assert sorted(heads[cid]) == ["classifier.bias", "classifier.weight"]
        for k, v in heads[cid].items():
            torch.testing.assert_close(v, alone[cid][k].float())
    assert not torch.allclose(heads[0]["classifier.weight"], heads[1]["classifier.weight"])
    assert not torch.allclose(heads[0]["classifier.weight"], init["classifier.weight"])
    rule = FedPerServer(METHODS["fedper"].defaults, 10, 6, 2, [k for k, _ in TinyNet(10).named_parameters()])
    assert sorted(res["sum"]) == sorted(k for k in init if not k.startswith("classifier."))  # no head travels
    new = rule.aggregate(init, weighted_mean([res["sum"]], [res["weight"]]), 0)
    total = sum(SIZES.values())
    for k in res["sum"]:
        by_hand = sum(SIZES[c] * alone[c][k] for c in SIZES) / total
        torch.testing.assert_close(new[k], by_hand.to(init[k].dtype), rtol=1e-6,
                                   atol=1e-6 if k != "bn.num_batches_tracked" else 0)
    torch.testing.assert_close(new["classifier.weight"], init["classifier.weight"])
    for c in group.clients:  # round 1: the global body with the client's own head
        group.start_client(c, new, None, 1)
        start = group.module.net.state_dict()
        for k, v in start.items():
            torch.testing.assert_close(v, heads[c["id"]][k] if k.startswith("classifier.") else new[k])


@pytest.mark.parametrize("method", ["fedper", "fesem"])
@pytest.mark.slow
def test_a_resumed_run_keeps_the_heads_and_the_centres(method, data_root, tmp_path):
    """FedPer's heads are client states, FeSEM's centres and assignment the server rule's state: a run stopped
    after round 1 (a non-finite loss in round 2) and resumed from its checkpoint ends as the uninterrupted run."""
    from benchmark.results import read_jsonl
    from ray_jobs.run import RunError, run

    def cfg(out, **kw):
        return RunConfig.from_preset("fedproto-mnist-n3", method=method, rounds=3, client_fraction=0.05,
                                     executor="local", data_root=str(data_root), out=str(out), **kw)

    ref = run(cfg(tmp_path / "ref"), quiet=True)
    with pytest.raises(RunError, match="non-finite loss in round 2, client 5"):
        run(cfg(tmp_path / "resumed", test_faults={"nan_loss": [2, 5]}), quiet=True)
    resumed = run(cfg(tmp_path / "resumed"), quiet=True, resume=True)
    strip = lambda rows: [(r["round"], r["client_accuracy"], r["client_loss"]) for r in rows]  # noqa: E731
    assert (strip(read_jsonl(tmp_path / "resumed" / "metrics.jsonl"))
            == strip(read_jsonl(tmp_path / "ref" / "metrics.jsonl")))
    assert resumed["final"] == ref["final"]
