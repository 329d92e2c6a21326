"""FeSEM (PROTOCOL.md section 4, FedProto's Table 1 baseline; Xie et al. 2020): K centres, each client assigned to
the nearest by the L2 distance of its weights, each centre the sample-weighted mean of its clients, each client
trained from its centre. Assignments and centres on constructed weights with a known answer."""
from __future__ import annotations

import pytest
import torch

from lightning_modules.clients import aggregation_weight
from lightning_modules.fedavg import FedAvgClient
from lightning_modules.fesem import FeSEMServer, nearest_centers
from lightning_modules.registry import METHODS, HyperparameterError
from ray_jobs.config import RunConfig


def rule(clusters=2, distance="weights", keys=("w",)) -> FeSEMServer:
    return FeSEMServer({"clusters": clusters, "distance": distance}, 10, 4, 5, list(keys))


def states(*values) -> dict[int, dict]:
    return {i: {"w": torch.tensor([float(v)])} for i, v in enumerate(values)}


def test_registry_entry():
    m = METHODS["fesem"]
    assert m.client is FedAvgClient and m.server is FeSEMServer and m.variant_of is None
    assert (m.defaults == {"clusters": 4, "distance": "weights"} and FeSEMServer.per_client
            and FeSEMServer.personal_models)
    with pytest.raises(HyperparameterError, match=r"^clusters must be an integer >= 1 \(got 2\.5\)\.$"):
        RunConfig(method="fesem", hparams={"clusters": 2.5})
    with pytest.raises(HyperparameterError,
                       match=r"^unknown distance value 'l1'; choose one of: weights, classifier\.$"):
        RunConfig(method="fesem", hparams={"distance": "l1"})


def test_fedprotos_protocol_keeps_two_centres_averaged_unweighted():
    """FedProto's protocol: K = 2 (its code's `average_weights_sem`: two groups, each its clients' unweighted mean);
    the clients are still assigned by the distance of their weights. Two rounds by hand with every weight 1."""
    cfg = RunConfig.from_preset("fedproto-mnist-n3-s3", method="fesem")
    assert cfg.hparams == {"clusters": 2, "distance": "weights"} and cfg.aggregation == "uniform"
    r = rule(**cfg.hparams)
    weights = {i: aggregation_weight(cfg, r, n) for i, n in enumerate((200, 500, 300, 600, 200))}
    assert set(weights.values()) == {1.0}
    r.aggregate_clients(states(0, 1, 10, 11, 20), weights, 0)
    assert [c["w"].item() for c in r.centers] == pytest.approx([0.0, 42 / 4])  # (1 + 10 + 11 + 20) / 4


def test_two_rounds_by_hand():
    """Round 0: the centres start from clients 0 and 1 (w = 0 and 1); 10, 11 and 20 are nearer to 1, so centre 1 is
    (1 + 10 + 2 x 11 + 20) / 5 = 10.6 with weights 1, 1, 2, 1. Round 1 (w = 0.5, 1, 10, 11, 20): 0.5 and 1 go to
    centre 0 (0), the rest to 10.6; centre 0 = (0.5 + 1) / 2, centre 1 = (10 + 22 + 20) / 4 = 13."""
    r = rule()
    weights = {0: 1.0, 1: 1.0, 2: 1.0, 3: 2.0, 4: 1.0}
    starts = r.aggregate_clients(states(0, 1, 10, 11, 20), weights, 0)
    assert r.assignment == {0: 0, 1: 1, 2: 1, 3: 1, 4: 1}
    assert [c["w"].item() for c in r.centers] == pytest.approx([0.0, 10.6])
    assert {i: s["w"].item() for i, s in starts.items()} == pytest.approx({0: 0.0, 1: 10.6, 2: 10.6, 3: 10.6, 4: 10.6})
    starts = r.aggregate_clients(states(0.5, 1, 10, 11, 20), weights, 1)
    assert r.assignment == {0: 0, 1: 0, 2: 1, 3: 1, 4: 1}
    assert [c["w"].item() for c in r.centers] == pytest.approx([0.75, 13.0])
    assert starts[1] is r.centers[0] and starts[4] is r.centers[1]  # each client gets its centre


def test_a_centre_without_clients_keeps_its_weights_and_the_state_is_checkpointed():
    r = rule(clusters=3)
    r.aggregate_clients(states(0, 5, 9, 1), {i: 1.0 for i in range(4)}, 0)  # centres 0, 5, 9
    assert r.assignment == {0: 0, 1: 1, 2: 2, 3: 0} and [c["w"].item() for c in r.centers] == [0.5, 5.0, 9.0]
    r.aggregate_clients(states(0, 1, 2, 3), {i: 1.0 for i in range(4)}, 1)  # nobody near 9 any more
    assert r.assignment == {0: 0, 1: 0, 2: 0, 3: 1} and [c["w"].item() for c in r.centers] == [1.0, 3.0, 9.0]
    again = rule(clusters=3)
    again.load_state_dict(r.state_dict())
    assert again.assignment == r.assignment and [c["w"].item() for c in again.centers] == [1.0, 3.0, 9.0]


def test_the_distance_compares_all_weights_or_the_classifier_only():
    """Client 2 is near centre 0 by its classifier, near centre 1 by its other weights (which dominate)."""
    centres = [{"conv.weight": torch.tensor([0.0, 0.0]), "classifier.weight": torch.tensor([[0.0]])},
               {"conv.weight": torch.tensor([10.0, 10.0]), "classifier.weight": torch.tensor([[5.0]])}]
    client = {"conv.weight": torch.tensor([9.0, 9.0]), "classifier.weight": torch.tensor([[1.0]])}
    keys = ["conv.weight", "classifier.weight"]
    assert nearest_centers([client], centres, keys) == [1]  # 81 + 81 + 1 = 163 vs 1 + 1 + 16 = 18
    assert nearest_centers([client], centres, ["classifier.weight"]) == [0]  # 1 vs 16
    assert rule(distance="classifier", keys=keys).compared_keys() == ["classifier.weight"]
    assert rule(keys=keys).compared_keys() == keys
    # L2, not L1: (1, 1) against (0, 0) and (2.6, 1): squared L2 2 vs 2.56 (centre 0); L1, 2 vs 1.6, picks centre 1
    two = [{"w": torch.tensor([0.0, 0.0])}, {"w": torch.tensor([2.6, 1.0])}]
    assert nearest_centers([{"w": torch.tensor([1.0, 1.0])}], two, ["w"]) == [0]
    tie = [{"w": torch.tensor([0.0])}, {"w": torch.tensor([2.0])}]
    assert nearest_centers([{"w": torch.tensor([1.0])}], tie, ["w"]) == [0]  # a tie goes to the lowest index


def test_the_centres_are_sample_weighted_means_of_whole_state_dicts():
    """Buffers too, integer ones rounded: clients of 1 and 3 samples in one centre give (a + 3 b) / 4."""
    r = rule(clusters=1, keys=("w",))
    a = {"w": torch.tensor([4.0]), "n": torch.tensor(2)}
    b = {"w": torch.tensor([8.0]), "n": torch.tensor(5)}
    r.aggregate_clients({0: a, 1: b}, {0: 1.0, 1: 3.0}, 0)
    assert r.centers[0]["w"].item() == 7.0 and r.centers[0]["n"].item() == 4 and r.centers[0]["n"].dtype == torch.int64


def test_more_clusters_than_clients_is_one_clear_error():
    with pytest.raises(ValueError, match=r"^FeSEM: 4 clusters for 3 clients trained in its first round; "
                                         r"use --hp clusters=3 or fewer "):
        rule(clusters=4).aggregate_clients(states(0, 1, 2), {i: 1.0 for i in range(3)}, 0)
