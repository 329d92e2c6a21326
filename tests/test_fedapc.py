"""FedAPC (PROTOCOL.md section 3): augmented features are means over their views, local prototypes
class means of them, global prototypes the mean over clients, L_APC the CPCL-form InfoNCE; its
8-client split on the real data."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from benchmark.data import to_tensor_images
from benchmark.partition import partition_domain, plan_clients
from benchmark.transforms import augment, normalize, random_erasing
from lightning_modules.fedapc import FedAPCClient, FedAPCRound, FedAPCServer
from lightning_modules.registry import METHODS
from ray_jobs.config import RunConfig
from ray_jobs.tables import TABLES

from tiny_net import TinyNet

NAN = float("nan")
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def usps(data_root):
    with np.load(data_root / "digits/usps_test.npz") as z:
        return to_tensor_images(z["x"][:40]), torch.from_numpy(z["y"][:40]).long()


def make_client(method="fedapc", **hp):
    torch.manual_seed(0)
    module = FedAPCClient(TinyNet(10), {**METHODS[method].defaults, **hp}).double()
    module.train()
    with torch.no_grad():  # BatchNorm statistics away from their defaults, so eval mode matters
        module.net(normalize(torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)).double())
    return module


def test_registry():
    m, v = METHODS["fedapc"], METHODS["fedapc_noaug"]
    assert m.client is v.client is FedAPCClient and m.server is v.server is FedAPCServer
    assert m.defaults == {"n_views": 4, "tau": 0.02, "augment": True, "prototypes": "after"} and m.variant_of is None
    assert v.defaults == {**m.defaults, "augment": False} and v.variant_of == "fedapc"


@pytest.mark.parametrize("name,value", [("n_views", 0), ("n_views", 2.5), ("n_views", True), ("tau", 0),
                                        ("tau", "abc"), ("augment", "yes"), ("prototypes", "eval")])
def test_bad_hyperparameter_is_refused_naming_it(name, value):
    for method in ("fedapc", "fedapc_noaug"):
        with pytest.raises(ValueError, match=name):
            RunConfig(method=method, hparams={name: value})


@pytest.mark.parametrize("method, hp", [("fedapc_noaug", {}), ("fedapc", {"augment": False}),
                                       ("fedapc", {"n_views": 2})])
def test_prototypes_of_the_last_epoch_refuse_the_after_pass_settings(method, hp):
    with pytest.raises(ValueError, match="leave augment and n_views at their defaults"):
        RunConfig(method=method, hparams={**hp, "prototypes": "last_epoch"})


def test_prototypes_of_the_last_epoch_are_its_training_mode_class_means(usps):
    """`prototypes=last_epoch`: the class means of the train-mode features the last epoch's batches gave (here two
    batches, computed again by hand), no pass over the data after training: the generator draws nothing."""
    x, y = usps
    module = make_client(prototypes="last_epoch")
    module.on_train_epoch_start()
    batches = [normalize(x[:25]).double(), normalize(x[25:]).double()]
    features = []
    for b, labels in zip(batches, (y[:25], y[25:])):
        with torch.no_grad():
            features.append(module.net(b)[1])  # training_step's own (it takes no optimizer step)
        module.training_step((b, labels), 0)
    z = torch.cat(features)
    g = torch.Generator().manual_seed(0)
    protos = module.local_prototypes(x, y, g)
    assert torch.equal(g.get_state(), torch.Generator().manual_seed(0).get_state())
    assert sorted(protos) == sorted(set(y.tolist()))
    for k, p in protos.items():
        torch.testing.assert_close(p, z[y == k].mean(dim=0), rtol=1e-12, atol=1e-12)


def test_the_committed_runs_made_their_prototypes_after_training():
    """The FedAPC runs recorded before `prototypes` existed (seeds 0 and 1, as committed) are complete for "after",
    the only pass there was, and not for "last_epoch"."""
    from benchmark.results import is_complete, protocol

    protocols = {run: json.loads((run / "summary.json").read_text())["protocol"]
                 for run in sorted(ROOT.glob("results/runs/fedapc-office_caltech-fedapc-seed*"))}
    old = {run: p for run, p in protocols.items() if "prototypes" not in p["hparams"]}
    assert len(old) >= 2
    for run, recorded in old.items():
        cfg = RunConfig.from_preset("fedapc-office", method="fedapc", seed=recorded["seed"])
        assert is_complete(run, protocol(cfg))
        assert not is_complete(run, protocol(RunConfig.from_preset("fedapc-office", method="fedapc",
                                                                   seed=recorded["seed"],
                                                                   hparams={"prototypes": "last_epoch"})))


def test_augmented_feature_is_the_mean_over_its_views(usps):
    """Eq. 2 on real images: each image's feature is the mean of the eval-mode features of its n views,
    each view crop + flip + erasing drawn in order from the client's generator; the views differ."""
    x, y = usps
    module = make_client(n_views=3)
    module.eval()
    got = module.augmented_features(x, torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(7)
    views = [random_erasing(augment(x, g), g).double() for _ in range(3)]
    assert not torch.equal(views[0], views[1]) and all((v == 0).any() for v in views)  # erased pixels are exactly 0
    with torch.no_grad():
        per_view = torch.stack([torch.stack([module.net.features(v[i:i + 1])[0] for i in range(len(x))])
                                for v in views])
    assert (per_view[0] - per_view[1]).abs().max() > 1e-3  # the augmentation changes the features
    torch.testing.assert_close(got, per_view.mean(dim=0), rtol=1e-12, atol=1e-12)


def test_local_prototypes_are_class_means_of_augmented_features_in_eval_mode(usps):
    x, y = usps
    module = make_client(n_views=2)
    before = {k: v.clone() for k, v in module.net.state_dict().items()}
    protos = module.local_prototypes(x, y, torch.Generator().manual_seed(3))
    assert module.training  # the mode is given back
    for k, v in module.net.state_dict().items():  # no BatchNorm statistic moved
        assert torch.equal(v, before[k]), k
    module.eval()
    z = module.augmented_features(x, torch.Generator().manual_seed(3))
    assert sorted(protos) == sorted(set(y.tolist()))
    for k, p in protos.items():
        torch.testing.assert_close(p, z[y == k].mean(dim=0), rtol=1e-12, atol=1e-12)


def test_without_augmentation_the_prototypes_are_plain_eval_class_means(usps):
    x, y = usps
    module = make_client("fedapc_noaug")
    g = torch.Generator().manual_seed(0)
    protos = module.local_prototypes(x, y, g)
    assert torch.equal(g.get_state(), torch.Generator().manual_seed(0).get_state())  # no view was drawn
    module.eval()
    with torch.no_grad():
        z = torch.stack([module.net.features(normalize(x[i:i + 1]).double())[0] for i in range(len(x))])
    assert sorted(protos) == sorted(set(y.tolist()))
    for k, p in protos.items():
        torch.testing.assert_close(p, z[y == k].mean(dim=0), rtol=1e-12, atol=1e-12)


def test_apc_loss_is_the_cpcl_form_against_the_global_prototypes():
    """One prototype per class: -log(e^{cos(z,G_y)/tau} / sum_k e^{cos(z,G_k)/tau}), classes without a
    global prototype left out of the sum, a sample of such a class contributing 0; round 0: no term."""
    module = make_client(tau=0.5)
    module.start_round(0, None, module.net.state_dict())
    assert module.extra_loss(None, torch.tensor([0]), None, torch.ones(1, 2)) is None
    protos = torch.tensor([[1.0, 0.0], [0.0, 2.0], [NAN, NAN], [-1.0, -1.0]])
    module.start_round(1, FedAPCRound(global_protos=protos), module.net.state_dict())
    z = torch.tensor([[3.0, 4.0], [1.0, 0.0], [2.0, 2.0]], dtype=torch.float64)
    y = torch.tensor([1, 0, 2])
    # per sample by hand: cosines to classes 0, 1, 3
    s = 1 / 2 ** 0.5
    cos = torch.tensor([[0.6, 0.8, -(0.6 + 0.8) * s], [1.0, 0.0, -s]], dtype=torch.float64)
    per = F.cross_entropy(cos / 0.5, torch.tensor([1, 0]), reduction="none")
    expected = (per.sum() + 0.0) / 3
    torch.testing.assert_close(module.extra_loss(None, y, None, z), expected)


def test_server_global_prototypes_are_unweighted_means_over_holders():
    rule = FedAPCServer(METHODS["fedapc"].defaults, 3, 2, 5, [])
    client_protos = {0: {0: torch.tensor([1.0, 1.0]), 1: torch.tensor([2.0, 0.0])},
                     1: {0: torch.tensor([3.0, 5.0])}, 2: {0: torch.tensor([2.0, 0.0])}}
    p = rule.payload(client_protos, 0).global_protos
    torch.testing.assert_close(p[:2], torch.tensor([[2.0, 2.0], [2.0, 0.0]]))
    assert torch.isnan(p[2]).all()


def test_fedapc_presets_and_their_client_counts_on_the_real_data(data_root):
    """The presets: batch 32, lr 0.01, 100 rounds (the paper), momentum 0.9, 10 local epochs (ours); 8 clients:
    Digits MNIST 2 / USPS 1 / SVHN 2 / SYN 3 at 1 %, Office Caltech 3 / Amazon 2 / Webcam 2 / DSLR 1 at 20 % of
    the training split."""
    cfgs = {p: RunConfig.from_preset(p, method="fedapc") for p in ("fedapc-digits", "fedapc-office")}
    for p, cfg in cfgs.items():
        assert (cfg.preset, cfg.split, cfg.batch_size, cfg.lr, cfg.rounds, cfg.momentum, cfg.local_epochs,
                cfg.weight_decay, cfg.drop_last) == (p, "fedapc", 32, 0.01, 100, 0.9, 10, 1e-5, False)
    assert RunConfig.from_preset("fedapc-digits", method="fedapc", local_epochs=2).local_epochs == 2  # overridable
    digits, office = cfgs["fedapc-digits"], cfgs["fedapc-office"]
    assert (digits.dataset, office.dataset) == ("digits", "office_caltech")
    assert (digits.dataset_spec.client_pct, office.dataset_spec.client_pct) == (0.01, 0.2)
    digits, office = digits.clients_per_domain, office.clients_per_domain
    assert digits == {"mnist": 2, "usps": 1, "svhn": 2, "syn": 3}
    assert office == {"caltech": 3, "amazon": 2, "webcam": 2, "dslr": 1}
    no_svhn = {d: n for d, n in digits.items() if d != "svhn"}  # no full SVHN in the shared data
    counts = {}
    for c in plan_clients(data_root, "digits", no_svhn, 0.01, seed=0):
        counts.setdefault(c["domain"], []).append(c["num_samples"])
    assert counts == {"mnist": [600, 600], "usps": [72], "syn": [100, 100, 100]}  # int(0.01 x 60000, 7291, 10000)
    assert [len(s) for s in partition_domain(np.zeros(73_257, dtype=np.int64), 2, 0.01, [0, 2])] == [732, 732]
    counts = {}
    for c in plan_clients(data_root, "office_caltech", office, 0.2, seed=0):
        counts.setdefault(c["domain"], []).append(c["num_samples"])
    # int(0.2 x 899, 768, 237, 127): the training split of 1123, 958, 295, 157 images
    assert counts == {"caltech": [179] * 3, "amazon": [153] * 2, "webcam": [47] * 2, "dslr": [25]}


# --------------------------------------------------------------------------- make table-fedapc PROFILE=smoke

TABLE_METHODS = ["fedavg", "moon", "fedproto", "fedapc", "fedapc_noaug"]
SMOKE_METHODS = ["fedavg", "fedapc", "fedapc_noaug"]  # the smoke profile's rows (MOON's, FedProto's: Table 2's)
# what the smoke profile's run names carry of its departures from the presets (`RunConfig.departures`)
SMOKE = RunConfig.from_preset("fedapc-office", **TABLES["fedapc"].overrides("smoke")).departures_name


@pytest.fixture(scope="module")
def table(slow_setup, data_root, tmp_path_factory):
    from ray_jobs.sweep import main

    out = tmp_path_factory.mktemp("table-fedapc")  # in process: table2's smoke sweep is the one through Ray
    assert main(["--table", "fedapc", "--profile", "smoke", "--domains", "mnist,usps,syn", "--results-dir", str(out),
                 "--data-root", str(data_root), "--executor", "local"]) == 0
    return out


@pytest.mark.slow
def test_table_fedapc_smoke_report_beside_tables_1_and_2(table, data_root, capsys):
    import pandas as pd

    from ray_jobs.sweep import main

    df = pd.read_csv(table / "tablefedapc.csv")
    assert set(df.table) == {"fedapc"} and set(df.profile) == {"smoke"}
    assert TABLES["fedapc"].communication  # what a client uploads and receives: the report's MB columns, checked below
    assert sorted(set(zip(df.method, df.dataset))) == sorted((m, d) for m in SMOKE_METHODS
                                                             for d in ("digits", "office_caltech"))
    full = TABLES["fedapc"].row_list("full")  # the table itself: every row of Tables I and II, both datasets
    assert sorted(full) == sorted((m, p) for m in TABLE_METHODS for p in ("fedapc-digits", "fedapc-office"))
    cell = lambda m, d, dom: df[(df.method == m) & (df.dataset == d) & (df.domain == dom)].iloc[0]  # noqa: E731
    assert cell("fedapc", "office_caltech", "dslr")["paper"] == 60.00  # Table I
    assert cell("fedavg", "office_caltech", "AVG")["paper"] == 60.52
    assert cell("fedapc_noaug", "office_caltech", "caltech")["paper"] == 64.17  # Table II
    assert cell("fedapc_noaug", "digits", "AVG of 3")["paper"] == pytest.approx((94.26 + 84.34 + 55.83) / 3)
    for m in SMOKE_METHODS:
        for ds, n_clients in (("digits", 6), ("office_caltech", 8)):
            run = table / "runs" / f"{m}-{ds}{'-no_svhn' if ds == 'digits' else ''}-fedapc{SMOKE}-seed0"
            config = json.loads((run / "config.json").read_text())
            summary = json.loads((run / "summary.json").read_text())
            assert (config["split"], config["batch_size"], len(config["clients"])) == ("fedapc", 32, n_clients)
            assert (config["preset"], config["rounds"], config["local_epochs"]) == (
                "fedapc-digits" if ds == "digits" else "fedapc-office", 2, 1)
            for dom, v in summary["last5"].items():
                c = cell(m, ds, dom if dom != "AVG" or ds == "office_caltech" else "AVG of 3")
                assert c["ours_mean"] == pytest.approx(v, abs=1e-4)
            comm = summary["communication"]["per_client_per_round"]
            assert (c["up_bytes"] == pytest.approx(comm["up_bytes"])
                    and c["down_bytes"] == pytest.approx(comm["down_bytes"]))
            assert (comm["up_prototypes"] > 0) == (m not in ("fedavg", "moon"))
    capsys.readouterr()
    assert main(["--table", "fedapc", "--profile", "smoke", "--domains", "mnist,usps,syn", "--results-dir", str(table),
                 "--data-root", str(data_root), "--executor", "local"]) == 0  # resumable: nothing runs again
    assert "6 of 6 runs already complete; running 0" in capsys.readouterr().out
