"""FedProto as published (AAAI 2022, PROTOCOL.md section 4): the n-way k-shot split, the MNIST CNN and
FedProto-mh's widths, prototype-only aggregation (no weights travel, each client keeps its own model),
both inference rules, and the mean over clients of their accuracies."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from benchmark.cnn import CNNMnist
from benchmark.data import eval_subset, load_domain, to_tensor_images
from benchmark.fewshot import nway_kshot_split
from benchmark.models import build_model
from benchmark.results import read_jsonl
from host_reads import HostReads
from lightning_modules.base import eval_batch, own_initialisation
from lightning_modules.clients import ClientGroup
from lightning_modules.fedavg import FedAvgClient
from lightning_modules.fedproto import FedProtoClient, FedProtoRound
from lightning_modules.fedproto_orig import FedProtoOrigServer, fedproto_mh_model
from lightning_modules.local import LocalServer
from lightning_modules.prototypes import nearest_prototype
from lightning_modules.registry import METHODS
from lightning_modules.server import LocalModelsRule
from ray_jobs.config import RunConfig
from ray_jobs.driver import Driver, client_mean_accuracy, domain_mean_accuracy
from ray_jobs.run import RunError
from ray_jobs.run import plan_run_clients as planned_clients
from ray_jobs.run import run

NAN = float("nan")


@pytest.fixture(scope="module")
def mnist_labels(data_root):
    with np.load(data_root / "digits/mnist_train.npz") as tr, np.load(data_root / "digits/mnist_test.npz") as te:
        return tr["y"].astype(np.int64), te["y"].astype(np.int64)


# --------------------------------------------------------------------- the split
@pytest.mark.parametrize("ways", [3, 4, 5])
def test_nway_kshot_split(mnist_labels, ways):
    train_y, test_y = mnist_labels
    split = nway_kshot_split(train_y, test_y, 20, ways, seed=7)
    assert len(split) == 20
    n_seen, k_seen = set(), set()
    for c in split:
        classes = c["classes"]
        assert classes == sorted(set(classes))
        n_seen.add(len(classes))
        # n ~ randint(max(2, ways - 2), min(10, ways + 3)): upper bound exclusive
        assert max(2, ways - 2) <= len(classes) <= min(9, ways + 2)
        per_class = np.bincount(train_y[c["indices"]], minlength=10)
        assert set(np.flatnonzero(per_class)) == set(classes)
        (k,) = set(per_class[classes])  # the same k for every class of the client
        k_seen.add(int(k))
        assert k in (99, 100)  # randint(100 - 2 + 1, 100 + 2 - 1)
        test_counts = np.bincount(test_y[c["test_indices"]], minlength=10)
        assert set(np.flatnonzero(test_counts)) == set(classes)  # test samples only of its own classes
        assert all(test_counts[classes] == 40)
    assert len(n_seen) > 1 and len(k_seen) == 2  # n and k vary across clients
    for part in ("indices", "test_indices"):
        all_idx = np.concatenate([c[part] for c in split])
        assert len(np.unique(all_idx)) == len(all_idx)  # no sample on two clients
    assert nway_kshot_split(train_y, test_y, 20, ways, seed=7) == split  # same seed, same split
    assert nway_kshot_split(train_y, test_y, 20, ways, seed=8) != split


@pytest.mark.parametrize("ways", [3, 5])
def test_stdev_3_split_class_counts_from_its_seed(data_root, mnist_labels, ways):
    """Table 2's second rows (preset fedproto-mnist-n<ways>-s3): each client's n and k are the seed's draws
    n ~ randint(max(2, ways - 3), min(10, ways + 4)), k ~ randint(100 - 3 + 1, 100 + 3 - 1) (upper bounds
    exclusive), drawn here again from the split's stream (seed, domain position 0); its classes hold k training
    and 40 test samples each."""
    train_y, test_y = mnist_labels
    cfg = RunConfig.from_preset(f"fedproto-mnist-n{ways}-s3", method="fedavg", seed=1, data_root=str(data_root))
    assert (cfg.split, cfg.ways, cfg.ways_stdev) == (f"{ways}way-s3", ways, 3)
    rng = np.random.default_rng([1, 0])
    n = rng.integers(max(2, ways - 3), min(10, ways + 4), size=20)
    k = rng.integers(98, 102, size=20)
    clients = planned_clients(cfg)
    assert [len(c["classes"]) for c in clients] == n.tolist()
    for c, kc in zip(clients, k):
        assert np.bincount(train_y[c["indices"]], minlength=10)[c["classes"]].tolist() == [kc] * len(c["classes"])
        assert np.bincount(test_y[c["test_indices"]], minlength=10)[c["classes"]].tolist() == [40] * len(c["classes"])
    assert set(k.tolist()) == {98, 99, 100, 101}  # wider than stdev 2's 99 or 100
    assert max(n) > min(9, ways + 2) or min(n) < max(2, ways - 2)  # n beyond stdev 2's range
    assert planned_clients(dataclasses.replace(cfg, split=f"{ways}way")) != clients


@pytest.mark.parametrize("shots", [10, 60])
def test_figure_3_split_takes_k_samples_per_class_from_its_seed(data_root, mnist_labels, shots):
    """Figure 3's splits (preset fedproto-mnist-n3-k<shots>): n ~ randint(max(2, 3 - 2), min(10, 3 + 3)) and
    k ~ randint(shots - 1, shots + 1), drawn here again from the split's stream (seed, domain position 0); its
    classes hold k training and 40 test samples each; the same n and classes as Table 1's n = 3 split, fewer
    samples."""
    train_y, test_y = mnist_labels
    cfg = RunConfig.from_preset(f"fedproto-mnist-n3-k{shots}", method="fedproto_orig", seed=2, data_root=str(data_root))
    assert (cfg.split, cfg.ways, cfg.ways_stdev, cfg.ways_shots) == (f"3way-k{shots}", 3, 2, shots)
    rng = np.random.default_rng([2, 0])
    n = rng.integers(2, 6, size=20)
    k = rng.integers(shots - 1, shots + 1, size=20)
    clients = planned_clients(cfg)
    assert [len(c["classes"]) for c in clients] == n.tolist()
    for c, kc in zip(clients, k):
        assert np.bincount(train_y[c["indices"]], minlength=10)[c["classes"]].tolist() == [kc] * len(c["classes"])
        assert np.bincount(test_y[c["test_indices"]], minlength=10)[c["classes"]].tolist() == [40] * len(c["classes"])
    assert set(k.tolist()) == {shots - 1, shots}
    table1 = planned_clients(dataclasses.replace(cfg, split="3way"))
    assert [c["classes"] for c in table1] == [c["classes"] for c in clients]
    assert sum(c["num_samples"] for c in clients) < sum(c["num_samples"] for c in table1)


def test_split_refuses_too_many_clients_for_a_class(mnist_labels):
    train_y, test_y = mnist_labels
    with pytest.raises(ValueError, match="too few for"):
        nway_kshot_split(train_y, test_y, 200, 9, seed=0)


# --------------------------------------------------------------------- models
def test_cnn_shapes_and_mh_widths():
    assert [fedproto_mh_model(i)["conv2_channels"] for i in (0, 6, 7, 13, 14, 19)] == [18, 18, 20, 20, 22, 22]
    for width in (18, 20, 22):
        net = CNNMnist(10, conv2_channels=width)
        assert net.conv2.weight.shape == (width, 10, 5, 5) and net.fc1.weight.shape == (50, 16 * width)
        logits, z = net.eval()(torch.rand(3, 1, 28, 28))
        assert logits.shape == (3, 10) and z.shape == (3, 50) and bool((z >= 0).all())  # prototype after ReLU(fc1)
    # conv1 260 + conv2 5020 + fc1 16050 + fc2 510: the paper's "21,500" (x 20 clients: FedAvg's 430k per round)
    assert sum(p.numel() for p in CNNMnist(10).parameters()) == 21840


# --------------------------------------------------------------------- server and inference
def test_registry():
    for name in ("fedproto_orig", "fedproto_mh"):
        m = METHODS[name]
        assert m.client is FedProtoClient and m.server is FedProtoOrigServer
        assert m.defaults == {"mu": 1.0, "double_forward": False}
    assert METHODS["fedproto_mh"].client_model is fedproto_mh_model and METHODS["fedproto_orig"].client_model is None
    assert METHODS["local"].client is FedAvgClient and METHODS["local"].server is LocalServer
    assert not FedProtoOrigServer.averages_weights and not LocalServer.averages_weights
    assert METHODS["fedavg"].server.averages_weights and METHODS["fedproto"].server.averages_weights


def test_server_averages_prototypes_of_the_holders_and_no_weights():
    rule = FedProtoOrigServer(METHODS["fedproto_orig"].defaults, 4, 2, 5, [])
    protos = {
        0: {0: torch.tensor([1.0, 1.0]), 1: torch.tensor([2.0, 0.0])},
        1: {1: torch.tensor([4.0, 2.0])},
        2: {0: torch.tensor([3.0, 5.0]), 1: torch.tensor([0.0, 4.0]), 3: torch.tensor([9.0, 9.0])},
    }
    g = rule.payload(protos, 0).global_protos
    expected = torch.tensor([[2.0, 3.0], [2.0, 2.0], [NAN, NAN], [9.0, 9.0]])  # class 1: (2+4+0)/3, (0+2+4)/3
    torch.testing.assert_close(g, expected, equal_nan=True)
    assert isinstance(rule, LocalModelsRule)
    with pytest.raises(TypeError, match="averages no weights"):
        rule.aggregate({}, {}, 0)
    assert LocalServer({}, 4, 2, 5, []).payload(protos, 0) is None


def test_nearest_prototype_among_own_classes():
    protos = torch.tensor([[0.0, 0.0], [4.0, 0.0], [NAN, NAN], [0.0, 4.0]])
    z = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 3.5], [1.0, 3.0]])
    own = torch.tensor([0, 1, 2])  # class 3 is not the client's; class 2 has no global prototype
    # sample 3: nearest overall is class 3 (dist 1), among its own classes class 0 (3.5) before class 1 (5.3)
    assert nearest_prototype(z, protos, own).tolist() == [0, 1, 0, 0]
    assert nearest_prototype(z, protos, torch.tensor([0, 1, 2, 3])).tolist() == [0, 1, 3, 3]
    assert nearest_prototype(z, protos, torch.tensor([2])).tolist() == [-1] * 4  # no class with a prototype


def test_classifier_rule_and_prototype_rule_on_a_constructed_model():
    """Both rules through a FedProtoClient's net: the classifier's argmax and the nearest own-class prototype."""
    net = CNNMnist(3)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.fc1.bias.copy_(torch.arange(50.0))  # every image's feature is 0, 1, ..., 49
        net.classifier.bias.copy_(torch.tensor([0.0, 2.0, 1.0]))
    logits, z = net.eval()(torch.rand(2, 1, 28, 28))
    assert logits.argmax(1).tolist() == [1, 1]
    protos = torch.stack([torch.arange(50.0) + 1, torch.arange(50.0) - 3, torch.arange(50.0) + 0.5])
    assert nearest_prototype(z, protos, torch.tensor([0, 1, 2])).tolist() == [2, 2]
    assert nearest_prototype(z, protos, torch.tensor([0, 1])).tolist() == [0, 0]


def test_accuracy_is_the_mean_over_clients_not_pooled():
    per_client = {0: {"n": 10, "classifier": 9, "prototype": 10}, 1: {"n": 40, "classifier": 20, "prototype": 30}}
    acc = client_mean_accuracy(per_client)
    # (90 + 50) / 2, not the pooled 29 / 50 = 58; (100 + 75) / 2, not 40 / 50 = 80
    assert acc == {"classifier": 70.0, "prototype": 87.5, "AVG": 87.5}
    no_protos = {c: {"n": r["n"], "classifier": r["classifier"]} for c, r in per_client.items()}
    assert client_mean_accuracy(no_protos) == {"classifier": 70.0, "AVG": 70.0}


def test_mse_term_is_the_reference_mse_with_own_features_for_classes_without_prototype():
    """The official loss2: MSELoss(proto_new, z) with proto_new the global prototype of y where it exists, z itself
    elsewhere (its term 0), averaged over batch x dimensions; times ld = mu = 1."""
    module = FedProtoClient(CNNMnist(10), METHODS["fedproto_orig"].defaults)
    g = torch.full((10, 50), NAN)
    g[2], g[5] = torch.randn(50), torch.randn(50)
    module.start_round(1, FedProtoRound(global_protos=g), module.net.state_dict())
    z, y = torch.randn(6, 50), torch.tensor([2, 5, 7, 2, 0, 5])
    target = z.clone()
    for i, label in enumerate(y.tolist()):
        if not torch.isnan(g[label]).any():
            target[i] = g[label]
    expected = torch.nn.functional.mse_loss(z, target)
    torch.testing.assert_close(module.extra_loss(None, y, None, z), expected)


# --------------------------------------------------------------------- clients keep their own models
def fedproto_config(data_root, method="fedproto_mh", **kw) -> RunConfig:
    return RunConfig.from_preset("fedproto-mnist-n3", method=method, **{
        "rounds": 2, "client_fraction": 0.05, "data_root": str(data_root), "executor": "local", **kw})


def conv2_widths(states: dict) -> dict[int, int]:
    return {cid: s["net.conv2.weight"].shape[0] if "net.conv2.weight" in s else s["conv2.weight"].shape[0]
            for cid, s in states.items()}


def test_group_trains_each_client_from_its_own_model(data_root):
    """In one group (sequential): round 0 starts every client from its own seeded initialisation of its own
    architecture (lr 0: the weights must stay exactly those), round 2 from its own model trained in round 1 (lr 0
    again); no sum. Each client is tested on its own test samples, by the nearest prototype among its own classes."""
    cfg = fedproto_config(data_root, lr=0.0)
    clients = planned_clients(cfg)[:16:3]  # ids 0, 3, 6, 9, 12, 15: widths 18, 18, 18, 20, 20, 22
    group = ClientGroup(cfg, clients, str(data_root))
    assert ({c["id"]: group.module_for(c).net.conv2.out_channels for c in clients}
            == {0: 18, 3: 18, 6: 18, 9: 20, 12: 20, 15: 22})
    res = group.train(None, None, 0)
    assert res["sum"] is None and res["weight"] == 0 and sorted(res["protos"]) == [c["id"] for c in clients]
    for c in clients:
        init = own_initialisation(CNNMnist, 10, cfg.seed, c["id"], **fedproto_mh_model(c["id"]))
        for k, v in init.items():
            torch.testing.assert_close(group.own_models[c["id"]][k], v, rtol=0, atol=0)
    assert conv2_widths(group.own_model_states()) == {0: 18, 3: 18, 6: 18, 9: 20, 12: 20, 15: 22}
    payload = METHODS[cfg.method].server(cfg.hparams, 10, 50, 2, []).payload(res["protos"], 0)
    modules = [group.module, *group.arch_modules.values()]  # (`configure_optimizers` reads their lr)
    before = group.own_model_states()
    for m in modules:
        m.lr = 0.01
    group.train(None, payload, 1)
    trained = group.own_model_states()
    for cid, state in before.items():  # round 1 trained every client: not its initialisation any more
        assert any(not torch.equal(v, trained[cid][k]) for k, v in state.items() if v.is_floating_point())
    for m in modules:
        m.lr = 0.0
    group.train(None, payload, 2)
    for cid, state in group.own_model_states().items():  # round 2 started from each one's round-1 model
        for k, v in state.items():
            torch.testing.assert_close(v, trained[cid][k], rtol=0, atol=0)
    # evaluation: every client on its own test samples (40 per class it holds), both rules
    ev = group.evaluate(None, payload)
    assert {cid: r["n"] for cid, r in ev.items()} == {c["id"]: 40 * len(c["classes"]) for c in clients}
    assert all(0 <= r["classifier"] <= r["n"] and 0 <= r["prototype"] <= r["n"] for r in ev.values())
    outside = 0  # samples whose nearest prototype over every class is not one of their client's classes
    for c in clients:  # both counts by hand: its own model's logits, and per sample the nearest (L2) global
        # prototype among the client's own classes, in a loop over them
        x, y, classes = group.fetch([c["id"]], group.test_data)[0]
        module = group.tested_module(c, None)
        assert not module.training
        with torch.no_grad():
            logits, z = module.net(module.transform.eval(x))
        protos = payload.global_protos
        own = [k for k in classes if not torch.isnan(protos[k]).any()]
        nearest = [own[min(range(len(own)), key=lambda j: float(((f - protos[own[j]]) ** 2).sum()))] for f in z]
        assert ev[c["id"]]["classifier"] == int((logits.argmax(1) == y).sum())
        assert ev[c["id"]]["prototype"] == sum(int(k == t) for k, t in zip(nearest, y.tolist()))
        every = [k for k in range(10) if not torch.isnan(protos[k]).any()]
        outside += sum(min(every, key=lambda k: float(((f - protos[k]) ** 2).sum())) not in classes for f in z)
    assert outside > 0  # so the counts above tell the restriction to a client's classes from no restriction
    # the device's batch (64 on the CPU) and others count the same: one pass of 1,000, and batches of 7, with one
    # read of the counts back to the host for every client at once (a GPU waits once, not once a batch)
    assert eval_batch("cpu") == 64 and group.evaluate(None, payload, batch_size=1000) == ev
    with HostReads() as reads:
        assert group.evaluate(None, payload, batch_size=7) == ev
    assert reads.reads == ["tolist"]


def test_fused_subgroups_never_mix_architectures(data_root):
    cfg = fedproto_config(data_root, engine="fused")
    clients = planned_clients(cfg)
    group = ClientGroup(cfg, clients, str(data_root))
    subgroups = group.subgroups()
    assert sorted(c["id"] for g in subgroups for c in g) == list(range(20))
    # one stack per architecture (clients 0-6, 7-13, 14-19), whatever the clients' sizes
    assert [[c["id"] for c in g] for g in subgroups] == [list(range(7)), list(range(7, 14)), list(range(14, 20))]
    assert all(len({group.arch(c) for c in g}) == 1 for g in subgroups)
    assert any(len({len(group.data[c["id"]][1]) for c in g}) > 1 for g in subgroups)  # sizes differ in a stack
    res = group.train(None, None, 0)  # the CNN's dropout under vmap: each client its own masks
    assert res["sum"] is None and all(np.isfinite(v) for v in res["losses"].values())
    assert conv2_widths(group.own_model_states()) == {c: fedproto_mh_model(c)["conv2_channels"] for c in range(20)}


def test_fused_fedproto_mh_trains_as_the_sequential_loop_without_dropout(data_root, monkeypatch):
    """FedProto-mh under the fused engine (one stack per architecture, clients of several sizes in a stack) trains
    as the sequential loop: 2 rounds in float64, the second from the first's prototypes, every client's own model,
    loss and prototypes equal within relative 1e-9. The CNN's dropout is off here: under vmap each client draws
    its masks from torch's global stream, not from its own generator, so with dropout the engines draw apart."""
    import torch.nn.functional as F
    from test_fused import max_rel_diff

    monkeypatch.setattr(F, "dropout", lambda x, *args, **kwargs: x)
    monkeypatch.setattr(F, "dropout2d", lambda x, *args, **kwargs: x)
    groups = []
    for engine in ("sequential", "fused"):
        cfg = fedproto_config(data_root, engine=engine)
        group = ClientGroup(cfg, planned_clients(cfg), str(data_root))
        for module in (group.module, *group.arch_modules.values()):
            module.double()
        groups.append(group)
    assert [len(g.subgroups()) for g in groups] == [20, 3]
    rule = METHODS[cfg.method].server(cfg.hparams, 10, 50, 2, [])
    start = {c["id"]: {k: v.clone() for k, v in groups[0].own_model(c).items()} for c in groups[0].clients}
    payload = None
    for r in range(2):
        seq, fused = (g.train(None, payload, r) for g in groups)
        assert sorted(fused["losses"]) == list(range(20)) and sorted(fused["protos"]) == list(range(20))
        assert max_rel_diff(fused["losses"], seq["losses"]) < 1e-9
        assert max_rel_diff(fused["protos"], seq["protos"]) < 1e-9
        own = [g.own_model_states() for g in groups]
        assert all(v.dtype == torch.float64 for v in own[1][0].values() if v.is_floating_point())
        assert max_rel_diff(own[1], own[0]) < 1e-9
        payload = rule.payload(seq["protos"], r)
    assert max_rel_diff(own[1], start) > 1e-3  # they trained


@pytest.mark.slow
def test_heterogeneous_run_through_ray_keeps_own_models(ray_cluster, data_root):
    """FedProto-mh for 2 rounds through Ray with 2 client actors: no global model, only prototypes; at the end
    every client holds its own trained model of its own width, and every client was tested with it."""
    cfg = fedproto_config(data_root, executor="ray", num_actors=2, cpus_per_actor=1)
    clients = planned_clients(cfg)
    driver = Driver(cfg, clients, str(data_root))
    assert driver.global_state is None and driver.final_state() is None
    records = [driver.run_round(r) for r in range(2)]
    states = {cid: s for part in driver.executor.map("own_model_states") for cid, s in part.items()}
    assert conv2_widths(states) == {c: fedproto_mh_model(c)["conv2_channels"] for c in range(20)}
    for cid, state in states.items():  # trained: no longer its initialisation
        init = own_initialisation(CNNMnist, 10, cfg.seed, cid, **fedproto_mh_model(cid))
        assert any(not torch.equal(state[k], init[k]) for k in init)
    assert driver.payload.global_protos.shape == (10, 50)
    for rec in records:
        assert (set(rec["accuracy"]) == {"classifier", "prototype", "AVG"}
                and rec["accuracy"]["AVG"] == rec["accuracy"]["prototype"])
        assert sorted(rec["client_accuracy"], key=int) == [str(c) for c in range(20)]
        assert rec["accuracy"]["classifier"] == pytest.approx(
            np.mean([a["classifier"] for a in rec["client_accuracy"].values()]))


@pytest.mark.slow
def test_resumed_run_keeps_the_clients_own_models(data_root, tmp_path):
    """The own models are the clients' persistent state: a run stopped after round 1 (a non-finite loss in
    round 2) and resumed from its checkpoint ends with the metrics of the uninterrupted run."""
    kw = dict(rounds=3, out=str(tmp_path / "ref"))
    ref = run(fedproto_config(data_root, **kw), quiet=True)
    out = tmp_path / "resumed"
    with pytest.raises(RunError, match="non-finite loss in round 2, client 5"):
        run(fedproto_config(data_root, rounds=3, out=str(out), test_faults={"nan_loss": [2, 5]}), quiet=True)
    resumed = run(fedproto_config(data_root, rounds=3, out=str(out)), quiet=True, resume=True)
    strip = lambda rows: [(r["round"], r["accuracy"], r["client_accuracy"], r["client_loss"])  # noqa: E731
                          for r in rows]
    assert strip(read_jsonl(out / "metrics.jsonl")) == strip(read_jsonl(tmp_path / "ref" / "metrics.jsonl"))
    assert resumed["final"] == ref["final"]


def test_domain_mean_accuracy_by_hand():
    """Own models on domain test sets: a domain's accuracy is the mean over its clients, AVG the mean over domains."""
    per_client = {0: {"n": 10, "classifier": 9, "prototype": 10}, 1: {"n": 10, "classifier": 5, "prototype": 6},
                  2: {"n": 4, "classifier": 1, "prototype": 3}}
    domain_of = {0: "mnist", 1: "mnist", 2: "usps"}
    # mnist (100 + 60) / 2 = 80 by prototypes, usps 75; AVG (80 + 75) / 2, not the mean over the three clients
    assert domain_mean_accuracy(per_client, domain_of, ["mnist", "usps"]) == {"mnist": 80.0, "usps": 75.0, "AVG": 77.5}
    no_protos = {c: {"n": r["n"], "classifier": r["classifier"]} for c, r in per_client.items()}
    assert domain_mean_accuracy(no_protos, domain_of, ["usps", "mnist"]) == {"usps": 25.0, "mnist": 70.0, "AVG": 47.5}


@pytest.mark.slow
def test_own_models_on_a_domain_protocol(data_root):
    """FedProto as published under FPL's Office-Caltech protocol (make table-all): each client's own model is
    tested on its domain's test set (as capped by eval_max); a client's recorded prototype accuracy equals its
    model's nearest-global-prototype accuracy computed here, and the domain accuracies are the means over
    their clients."""
    cfg = RunConfig.from_preset("fpl-office", method="fedproto_orig", rounds=1, local_epochs=1, eval_max=30,
                                data_root=str(data_root), executor="local")
    clients = planned_clients(cfg)
    driver = Driver(cfg, clients, str(data_root))
    assert driver.global_state is None and driver.test_sets == {}
    assert driver.test_sizes() == {d: 30 for d in cfg.domains}
    rec = driver.run_round(0)
    per = rec["client_accuracy"]
    assert sorted(per, key=int) == [str(c["id"]) for c in clients]
    domain_of = {str(c["id"]): c["domain"] for c in clients}
    for d in cfg.domains:
        assert rec["accuracy"][d] == pytest.approx(np.mean([a["prototype"] for c, a in per.items()
                                                            if domain_of[c] == d]))
    assert rec["accuracy"]["AVG"] == pytest.approx(np.mean([rec["accuracy"][d] for d in cfg.domains]))
    # client 0 (caltech), recomputed from its own model
    states = {cid: s for part in driver.executor.map("own_model_states") for cid, s in part.items()}
    spec = cfg.dataset_spec
    net = build_model(spec.model, spec.num_classes)
    net.load_state_dict(states[0])
    net.eval()
    dom = load_domain(data_root, "office_caltech", clients[0]["domain"], need_train=False)
    keep = eval_subset(len(dom.test_y), 30)
    x = spec.transform.eval(to_tensor_images(dom.test_x[keep], spec.image_size, spec.channels))
    with torch.no_grad():
        logits, z = net(x)
    y = torch.from_numpy(dom.test_y[keep])
    pred = nearest_prototype(z, driver.payload.global_protos, torch.arange(spec.num_classes))
    assert per["0"]["prototype"] == pytest.approx(100.0 * float((pred == y).float().mean()))
    assert per["0"]["classifier"] == pytest.approx(100.0 * float((logits.argmax(1) == y).float().mean()))
