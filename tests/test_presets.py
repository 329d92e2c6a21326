"""Protocol presets: a paper's protocol is data (DatasetSpec + PRESETS), reached with --preset; FedPLVM's
Digit-5 / Office-10 data protocol (first k per class, 64x64, its transform) and its ResNet-10 variant."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmark.data import first_per_class, load_domain, shuffled_split, to_tensor_images
from benchmark.models import build_model
from benchmark.partition import plan_clients
from benchmark.protocols import DATASET_SPECS, PRESETS, ConfigError
from benchmark.transforms import Transform, augment, normalize
from lightning_modules.base import batches
from ray_jobs.config import RunConfig
from ray_jobs.run import build_parser, config_from_args


def _first_k_by_loop(labels: np.ndarray, k: int) -> list[int]:
    seen: dict[int, int] = {}
    out = []
    for i, y in enumerate(labels):
        if seen.get(int(y), 0) < k:
            seen[int(y)] = seen.get(int(y), 0) + 1
            out.append(i)
    return out


def test_first_per_class_against_a_loop():
    labels = np.array([3, 1, 3, 3, 0, 1, 2, 3, 0, 2, 2, 1])
    assert first_per_class(labels, 2).tolist() == _first_k_by_loop(labels, 2) == [0, 1, 2, 4, 5, 6, 8, 9]
    assert first_per_class(labels[:0], 2).tolist() == []


@pytest.mark.slow
def test_digit5_clients_and_test_sets_on_the_real_data(data_root):
    spec = DATASET_SPECS["digit5"]
    doms = ["mnist", "usps", "syn", "mnistm"]  # the shared data has no full SVHN
    clients = plan_clients(data_root, "digit5", {d: 1 for d in doms}, spec.client_pct, seed=0, per_class=spec.per_class)
    assert [c["domain"] for c in clients] == doms
    for c in clients:
        dom = load_domain(data_root, "digit5", c["domain"], per_class=spec.per_class)
        full = load_domain(data_root, "digit5", c["domain"])
        # train: the first 10 of each class of the domain's training set (FedBN's re-split of the pooled archives,
        # tests/test_digit5_split.py), in its order; test: the first 100 of each class of its test part
        assert np.array_equal(dom.train_y, full.train_y[_first_k_by_loop(full.train_y, 10)])
        assert np.array_equal(dom.train_x, full.train_x[_first_k_by_loop(full.train_y, 10)])
        assert np.array_equal(dom.test_y, full.test_y[_first_k_by_loop(full.test_y, 100)])
        assert c["num_samples"] == 100 and np.bincount(dom.train_y[c["indices"]]).tolist() == [10] * 10
        assert np.bincount(dom.test_y).tolist() == [100] * 10


@pytest.mark.parametrize("domain", ["dslr", "webcam"])
def test_office10_takes_the_first_ten_per_class_of_a_stratified_shuffled_split(data_root, domain):
    """FedBN's files (FedPLVM's Office-10) are a shuffled ~4:1 split: ours is one fixed stratified shuffle, 20% test,
    both parts in shuffled order; a client takes the first 10 of each class of that order; the test set is the
    first 100 of each class of the test part (all of it: no class has 100)."""
    spec = DATASET_SPECS["office10"]
    dom = load_domain(data_root, "office10", domain, per_class=spec.per_class)
    with np.load(data_root / f"office_caltech10/{domain}.npz") as z:
        x, y = z["x"], z["y"].astype(np.int64)
    tr, te = shuffled_split(y)
    assert len(set(tr) | set(te)) == len(y) and not set(tr) & set(te)  # every image once
    assert abs(len(te) - 0.2 * len(y)) <= 1
    for k in range(10):  # stratified: each class about 20% in test
        assert abs(int((y[te] == k).sum()) - 0.2 * int((y == k).sum())) <= 1.5
    assert not np.array_equal(np.sort(tr), tr)  # shuffled order, not file order
    assert np.array_equal(shuffled_split(y)[0], tr)  # one fixed draw
    first = tr[_first_k_by_loop(y[tr], 10)]
    assert np.array_equal(dom.train_y, y[first]) and np.array_equal(dom.train_x, x[first])
    assert np.array_equal(dom.test_y, y[te]) and np.array_equal(dom.test_x, x[te])
    assert np.bincount(dom.train_y, minlength=10).tolist() == np.minimum(np.bincount(y[tr], minlength=10), 10).tolist()
    # FPL's Office-Caltech keeps its position split
    fpl = load_domain(data_root, "office_caltech", domain)
    assert np.array_equal(fpl.test_y, y[np.arange(len(y)) % 10 > 7])


def test_client_fraction_scales_the_per_class_count(data_root):
    spec = DATASET_SPECS["digit5"]
    (c,) = plan_clients(data_root, "digit5", {"usps": 1}, None, seed=0, fraction=0.35, per_class=spec.per_class)
    assert c["num_samples"] == 30  # int(0.35 * 10) = 3 per class
    # several clients of a domain (FedPLVM's Table 10): the first 10 of each class, then the next 10
    two = plan_clients(data_root, "digit5", {"usps": 2}, None, seed=0, per_class=spec.per_class)
    y = load_domain(data_root, "digit5", "usps", need_test=False, per_class=((20,) * 10, 0)).train_y
    assert [c["num_samples"] for c in two] == [100, 100] and not set(two[0]["indices"]) & set(two[1]["indices"])
    for i, c in enumerate(two):
        assert c["indices"] == sorted(j for k in range(10) for j in np.flatnonzero(y == k)[10 * i:10 * i + 10].tolist())


def test_images_resized_to_the_protocol_size(data_root):
    """FedPLVM's 64 x 64 (its `Resize((64, 64))` on a PIL image, bilinear, then `Grayscale(3)`): USPS's 16 x 16 grey
    digits within 1 grey level of PIL's bilinear resize (rounding), the grey repeated to three channels."""
    from PIL import Image

    with np.load(data_root / "digits/usps_test.npz") as z:
        x = z["x"][:3]
    t = to_tensor_images(x, 64)
    assert t.shape == (3, 3, 64, 64) and t.dtype == torch.uint8
    pil = np.stack([np.asarray(Image.fromarray(img[:, :, 0]).resize((64, 64), Image.BILINEAR)) for img in x])
    assert np.abs(t[:, 0].numpy().astype(int) - pil).max() <= 1
    assert torch.equal(t[:, 0], t[:, 1]) and torch.equal(t[:, 0], t[:, 2])


def test_transforms():
    x = torch.randint(0, 256, (5, 3, 8, 8), dtype=torch.uint8)
    half = Transform(mean=(0.5,) * 3, std=(0.5,) * 3, augment=False)
    expected = x.float() / 255 * 2 - 1  # (v - 0.5) / 0.5 by hand
    torch.testing.assert_close(half.train(x, torch.Generator().manual_seed(0)), expected)
    torch.testing.assert_close(half.eval(x), expected)
    plain = Transform(mean=(0.0,) * 3, std=(1.0,) * 3, augment=False)
    torch.testing.assert_close(plain.eval(x), x.float() / 255)
    # the default is FPL's: the same draws and values as augment / normalize
    fpl = Transform()
    torch.testing.assert_close(fpl.train(x, torch.Generator().manual_seed(3)),
                               augment(x, torch.Generator().manual_seed(3)))
    torch.testing.assert_close(fpl.eval(x), normalize(x))


def test_drop_last_batches():
    g = torch.Generator().manual_seed(0)
    out = batches(100, 32, g, drop_last=True)
    assert [len(b) for b in out] == [32, 32, 32]
    assert len(torch.cat(out).unique()) == 96
    assert [len(b) for b in batches(100, 32, torch.Generator().manual_seed(0))] == [32, 32, 32, 4]


def test_plvm_resnet10_shape_and_parameter_count():
    net = build_model("resnet10_plvm", 10)
    fpl = build_model("resnet10", 10)
    # only the stem differs: a 5x5 instead of a 3x3 convolution, 3 * 64 * (25 - 9) more weights
    assert sum(p.numel() for p in net.parameters()) - sum(p.numel() for p in fpl.parameters()) == 3 * 64 * 16
    # 64 -> conv5 s2 p1: 31 -> max-pool 3/2/1: 16 -> stages 16, 8, 4, 2 -> pooled 512-d features
    stem = net.pool(torch.relu(net.bn1(net.conv1(torch.zeros(1, 3, 64, 64)))))
    assert stem.shape == (1, 64, 16, 16)
    logits, z = net(torch.randn(2, 3, 64, 64))
    assert logits.shape == (2, 10) and z.shape == (2, 512) and (z >= 0).all()


def test_presets_are_the_protocols():
    plvm = RunConfig.from_preset("fedplvm-digit5", seed=4)
    assert (plvm.dataset, plvm.rounds, plvm.local_epochs, plvm.batch_size, plvm.momentum, plvm.drop_last,
            plvm.seed) == ("digit5", 50, 2, 32, 0.5, True, 4)
    assert RunConfig.from_preset("fedplvm-office10").rounds == 80
    assert plvm.dataset_spec.image_size == 64 and plvm.dataset_spec.model == "resnet10_plvm"
    # FPL's presets are RunConfig's defaults
    assert RunConfig.from_preset("fpl-office") == RunConfig(dataset="office_caltech", preset="fpl-office")
    assert set(PRESETS) >= {"fpl-digits", "fpl-office", "fedplvm-digit5", "fedplvm-office10"}
    with pytest.raises(ConfigError, match="unknown preset 'fedplvm'.*fedplvm-digit5"):
        RunConfig.from_preset("fedplvm")


def test_command_line_flags_override_the_preset():
    parse = lambda *a: config_from_args(build_parser().parse_args(list(a)))  # noqa: E731
    cfg = parse("--preset", "fedplvm-digit5", "--rounds", "3", "--momentum", "0.9", "--method", "fedavg")
    assert (cfg.preset, cfg.dataset, cfg.rounds, cfg.momentum, cfg.batch_size, cfg.local_epochs) == \
        ("fedplvm-digit5", "digit5", 3, 0.9, 32, 2)
    plain = parse("--dataset", "office_caltech")
    assert plain == RunConfig(dataset="office_caltech")
    # a preset's split stays unless --split is given (it was the dataset's default split before)
    assert parse("--preset", "fedproto-mnist-n4-s3", "--method", "fedavg").split == "4way-s3"
    assert parse("--preset", "fedapc-office", "--method", "fedavg").split == "fedapc"
    assert parse("--preset", "fedproto-mnist-n4", "--method", "fedavg", "--split", "5way").split == "5way"


def test_drop_last_with_a_client_smaller_than_a_batch_is_refused(data_root, tmp_path):
    from ray_jobs.run import run

    cfg = RunConfig.from_preset("fedplvm-digit5", method="fedavg", domains=["usps"], client_fraction=0.2,
                                executor="local", data_root=str(data_root), out=str(tmp_path / "r"))
    with pytest.raises(ConfigError, match=r"20 samples, no full batch of 32 with drop_last; use a smaller "
                                          r"--batch-size or a larger --client-fraction\.$"):
        run(cfg, quiet=True)
    assert not (tmp_path / "r").exists()
    # at the whole share, only a smaller batch helps
    office = RunConfig.from_preset("fedplvm-office10", method="fedavg", dataset="office_caltech", executor="local",
                                   data_root=str(data_root), out=str(tmp_path / "r"))
    with pytest.raises(ConfigError, match=r"no full batch of 32 with drop_last; use a smaller --batch-size\.$"):
        run(office, quiet=True)
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_fedplvm_protocol_starts_each_client_from_its_own_model_and_averages_them_alike(data_root):
    """FedPLVM's main.py builds one model per client and its `average_weights` is a plain mean: round 0 of a
    FedPLVM-protocol run, redone client by client from each client's own initialisation, must give the plain
    mean of their trained weights (Office-10's DSLR client has 94 images, Webcam's 100: a sample-weighted
    mean differs)."""
    from lightning_modules.base import fit_local, own_initialisation
    from lightning_modules.clients import client_generator
    from lightning_modules.registry import METHODS
    from ray_jobs.driver import Driver
    from ray_jobs.run import plan_run_clients

    cfg = RunConfig.from_preset("fedplvm-office10", method="fedavg", domains=["dslr", "webcam"], rounds=1,
                                local_epochs=1, eval_max=10, executor="local", num_actors=1, device="cpu",
                                data_root=str(data_root))
    assert (cfg.aggregation, cfg.client_init) == ("uniform", "own")
    clients = plan_run_clients(cfg)
    assert sorted(c["num_samples"] for c in clients) == [94, 100]
    driver = Driver(cfg, clients, str(data_root))
    initial = {k: v.clone() for k, v in driver.global_state.items()}
    rec = driver.run_round(0)
    assert all(c["down_weights"] == 0 for c in rec["communication"]["per_client"].values())  # nothing sent in round 0

    group = driver.executor.groups[0]
    trained, sizes = [], []
    for c in clients:
        module = METHODS["fedavg"].client(build_model("resnet10_plvm", 10), {}, lr=cfg.lr, momentum=cfg.momentum,
                                          weight_decay=cfg.weight_decay)
        module.transform = cfg.dataset_spec.transform
        start = own_initialisation(type(module.net), 10, cfg.seed, c["id"])
        assert any(not torch.equal(start[k], initial[k]) for k in start)
        module.start_round(0, None, start)
        x, y = group.data[c["id"]]
        fit_local(module, x, y, cfg.local_epochs, cfg.batch_size, client_generator(cfg.seed, 0, c["id"]), cfg.drop_last)
        trained.append({k: v.detach().clone() for k, v in module.net.state_dict().items()})
        sizes.append(len(y))
    plain = {k: sum(t[k].double() for t in trained) / len(trained) for k in trained[0]}
    by_samples = {k: sum(n * t[k].double() for n, t in zip(sizes, trained)) / sum(sizes) for k in trained[0]}
    got = driver.global_state
    for k, v in got.items():
        if v.is_floating_point():
            assert torch.allclose(v.double(), plain[k], rtol=0, atol=1e-6), k
    assert max((got[k].double() - by_samples[k]).abs().max().item() for k in got if got[k].is_floating_point()) > 1e-4


def test_erasing_is_part_of_a_runs_protocol_and_name():
    """`--erasing` (training batches erased, FedAPC's reading): the run's transform erases, its folder name and
    protocol say so; a run recorded before the key did not erase (LATER_KEYS)."""
    from benchmark.results import protocol

    cfg = RunConfig.from_preset("fedapc-office", method="fedavg", erasing=True)
    assert cfg.transform.erase and not RunConfig.from_preset("fedapc-office", method="fedavg").transform.erase
    assert cfg.run_name == "fedavg-office_caltech-fedapc-erasing-seed0"
    old = {k: v for k, v in RunConfig.from_preset("fedapc-office", method="fedavg").to_dict().items() if k != "erasing"}
    assert protocol(old)["erasing"] is False and protocol(cfg)["erasing"] is True
