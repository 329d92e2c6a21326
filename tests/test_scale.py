"""Hundreds of clients (docs/scale.md): the scaled Digits presets (100 and 500 clients, a tenth drawn a round) and
host residency (`--client-memory`): a client group keeps its clients' images and persistent states in host memory
and holds on its device only the client it is training or testing, by its own bookkeeping, with the numbers of a
group that holds them all there. The groups' device is `auto`: on a machine with a GPU (the GPU window runs this
file, tools/gpu/on-device.sh) the device-placement checks test CUDA residency and pinned host memory; on a CPU the
device is the host and they hold by construction."""
from __future__ import annotations

import collections
import dataclasses
import gc

import pytest
import torch

from benchmark import checkpoint
from benchmark.models import build_model
from benchmark.results import read_jsonl
from benchmark.spill import DiskStore
from lightning_modules.clients import ClientGroup, resolve_client_memory
from ray_jobs.config import ConfigError, RunConfig
from ray_jobs.run import RunError, plan_run_clients, run


@pytest.fixture(autouse=True)
def deterministic_cudnn(monkeypatch):
    """On CUDA (the GPU window runs this file) the groups' equalities here are exact: cuDNN's deterministic
    algorithms (no effect on a CPU)."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)


def per_domain(clients: list[dict]) -> dict:
    """Per domain: (clients, samples of each client (all equal), samples in all)."""
    sizes = collections.defaultdict(list)
    for c in clients:
        sizes[c["domain"]].append(c["num_samples"])
    assert all(len(set(v)) == 1 for v in sizes.values())
    return {d: (len(v), v[0], sum(v)) for d, v in sizes.items()}


def test_scaled_digits_presets_multiply_the_clients_and_divide_their_share(data_root):
    """FPL's code split (MNIST 6, USPS 4, SYN 7 clients, 1% each) times 5 and 25, each client 1/5 and 1/25 of
    1%: int(0.002 x 60,000) = 120, int(0.0004 x 60,000) = 24; USPS int(0.002 x 7,291) = 14, int(0.0004 x 7,291) = 2;
    SYN (10,000 training images) 20 and 4."""
    cfgs = {p: RunConfig.from_preset(p, domains=["mnist", "usps", "syn"], data_root=str(data_root))
            for p in ("fpl-digits", "scale-digits-100", "scale-digits-500")}
    got = {p: per_domain(plan_run_clients(c)) for p, c in cfgs.items()}
    assert got["fpl-digits"] == {"mnist": (6, 600, 3600), "usps": (4, 72, 288), "syn": (7, 100, 700)}
    assert got["scale-digits-100"] == {"mnist": (30, 120, 3600), "usps": (20, 14, 280), "syn": (35, 20, 700)}
    assert got["scale-digits-500"] == {"mnist": (150, 24, 3600), "usps": (100, 2, 200), "syn": (175, 4, 700)}
    cfg = cfgs["scale-digits-500"]
    assert (cfg.participation, cfg.rounds, cfg.local_epochs) == (0.1, 100, 10)  # FPL's protocol, a tenth drawn
    assert sum(cfg.layout.values()) == 500 and len(cfg.participants(3, list(range(425)))) == 42
    assert cfg.run_name == "fpl-digits-no_svhn-500clients-part0.1-seed0"


def test_client_memory_auto_is_host_below_full_participation_and_a_bad_value_is_refused():
    assert [resolve_client_memory("auto", p) for p in (1.0, 0.5)] == ["device", "host"]
    assert resolve_client_memory("device", 0.1) == "device" and resolve_client_memory("host", 1.0) == "host"
    assert resolve_client_memory("disk", 1.0) == "disk"
    with pytest.raises(ConfigError, match=r"^unknown client memory 'ssd'; choose one of: auto, device, host, disk\.$"):
        RunConfig(client_memory="ssd")


# 250 tiny clients (scale-digits-500 on MNIST and USPS, 1 to 12 images each), MOON (a model per client kept between
# rounds), a tenth drawn each round
MANY = dict(domains=["mnist", "usps"], local_epochs=1, client_fraction=0.5, batch_size=8, method="moon",
            engine="sequential", eval_max=50)


@pytest.mark.slow
def test_a_group_of_250_clients_holds_one_on_its_device_at_a_time_with_the_numbers_of_one_holding_all(data_root):
    cfg = RunConfig.from_preset("scale-digits-500", **MANY, executor="local", data_root=str(data_root),
                                participation=0.02)  # 5 a round (holding one at a time needs no more)
    clients = plan_run_clients(cfg)
    assert len(clients) == 250
    groups = {m: ClientGroup(dataclasses.replace(cfg, client_memory=m), clients, str(data_root))
              for m in ("host", "device", "disk")}
    host, device, disk = groups["host"], groups["device"], groups["disk"]
    assert host.on_device == set() and device.on_device == {c["id"] for c in clients}
    # the bookkeeping above against where the images are: all on the run's device, or in host memory (pinned on CUDA
    # for asynchronous copies)
    where = torch.empty(0, device=device.device).device  # with its index: a tensor on "cuda" is on "cuda:0"
    assert all(x.device == where and y.device == where for x, y in device.data.values())
    assert all(t.device.type == "cpu" and t.is_pinned() == (where.type == "cuda")
               for xy in host.data.values() for t in xy)
    global_state = build_model("resnet10", 10).state_dict()
    results = {m: [] for m in groups}
    for r in range(2):
        drawn = cfg.participants(r, [c["id"] for c in clients])
        assert len(drawn) == 5
        for m, g in groups.items():
            results[m].append(g.train(global_state, None, r, drawn))
        assert host.on_device == set() and disk.on_device == set()  # every drawn client left the device after its fit
    assert host.peak_on_device == disk.peak_on_device == 1 and device.peak_on_device == 250
    for m in ("device", "disk"):
        for a, b in zip(results["host"], results[m]):
            assert a["losses"] == b["losses"] and a["weight"] == b["weight"]
            assert all(torch.equal(a["sum"][k], b["sum"][k]) for k in a["sum"])
    # MOON's previous models of the clients drawn in either round, kept in host memory, or on disk: one file per
    # client, the same tensors, none of them held by the group
    trained = set(cfg.participants(0, list(range(250)))) | set(cfg.participants(1, list(range(250))))
    assert set(host.client_states) == trained and type(host.client_states) is dict
    assert all(v.device.type == "cpu" for s in host.client_states.values() for v in s.values())
    store = disk.client_states
    assert isinstance(store, DiskStore) and set(store) == trained
    assert sorted(p.name for p in store.folder.iterdir()) == sorted(f"{c}.pt" for c in trained)
    assert not any(torch.is_tensor(v) for v in vars(store).values())
    for cid in trained:
        assert host.client_states[cid].keys() == store[cid].keys()
        assert all(torch.equal(v, store[cid][k]) for k, v in host.client_states[cid].items())
    model_bytes = sum(v.numel() * v.element_size() for v in host.client_states[min(trained)].values())
    assert model_bytes * len(trained) <= store.nbytes() < 1.1 * model_bytes * len(trained)
    folder = store.folder
    del groups, disk, store, g  # (g: the last group of the loop above, the disk one)
    gc.collect()
    assert not folder.exists()  # the group's folder goes with it


@pytest.mark.slow
def test_a_run_of_the_500_client_preset_trains_a_tenth_of_its_clients_each_round(data_root, tmp_path):
    out = tmp_path / "run"
    cfg = RunConfig.from_preset("scale-digits-500", **{**MANY, "method": "fedavg"}, rounds=2, executor="local",
                                data_root=str(data_root), out=str(out))
    summary = run(cfg, quiet=True)
    rows = read_jsonl(out / "metrics.jsonl")
    assert [len(r["trained_clients"]) for r in rows] == [25, 25]
    assert [r["trained_clients"] for r in rows] == [cfg.participants(r, list(range(250))) for r in range(2)]
    assert summary["complete"] and set(summary["final"]) == {"mnist", "usps", "AVG"}


@pytest.mark.slow
def test_own_models_and_own_test_samples_stay_in_host_memory_and_test_as_on_the_device(data_root):
    """FedProto as published on its MNIST protocol: each client's own model and own test samples; a group in host
    memory trains half of its 20 clients and tests every one of them, one on the device at a time, with the
    counts of a group that holds them all there."""
    cfg = RunConfig.from_preset("fedproto-mnist-n3", method="fedproto_orig", rounds=1, client_fraction=0.2,
                                participation=0.5, executor="local", data_root=str(data_root))
    clients = plan_run_clients(cfg)
    groups = {m: ClientGroup(dataclasses.replace(cfg, client_memory=m), clients, str(data_root))
              for m in ("host", "device", "disk")}
    drawn = cfg.participants(0, [c["id"] for c in clients])
    assert len(drawn) == 10
    losses = {m: g.train(None, None, 0, drawn)["losses"] for m, g in groups.items()}
    assert losses["host"] == losses["device"] == losses["disk"]
    counts = {m: g.evaluate(None, None) for m, g in groups.items()}
    assert counts["host"] == counts["device"] == counts["disk"] and len(counts["host"]) == 20
    # on disk: every own model in a file of its own, the host group's tensors
    on_disk = groups["disk"].own_models
    assert isinstance(on_disk, DiskStore) and len(list(on_disk.folder.glob("*.pt"))) == 20
    assert all(torch.equal(v, on_disk[c][k]) for c, m in groups["host"].own_models.items() for k, v in m.items())
    host = groups["host"]
    assert host.peak_on_device == 1 and host.on_device == set()
    # the trained clients' own models and, made when they were tested, the others' initialisations
    assert set(host.own_models) == {c["id"] for c in clients}
    assert all(v.device.type == "cpu" for m in host.own_models.values() for v in m.values())


@pytest.mark.slow
def test_a_sweep_gives_every_run_its_client_memory_and_spread(data_root, tmp_path, monkeypatch, capsys):
    """`make table-fedproto CLIENT_MEMORY=host SPREAD=1 CUDNN_BENCHMARK=0` (here Local's smoke rows, in process):
    every run records them, outside its protocol (the same runs at the default are complete); a bad value is one
    line."""
    import json

    from ray_jobs.sweep import main

    monkeypatch.setenv("WANDB_MODE", "disabled")
    args = ["--table", "fedproto", "--profile", "smoke", "--methods", "local", "--executor", "local",
            "--results-dir", str(tmp_path), "--data-root", str(data_root)]
    assert main([*args, "--client-memory", "host", "--spread", "--no-cudnn-benchmark"]) == 0
    configs = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/config.json")]
    assert len(configs) == 6
    assert {(c["client_memory"], c["spread"], c["cudnn_benchmark"]) for c in configs} == {("host", True, False)}
    capsys.readouterr()
    assert main(args) == 0  # nothing to run again: neither is part of a run's protocol
    assert "6 of 6 runs already complete; running 0" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*args, "--client-memory", "ssd"])
    assert "argument --client-memory: unknown choice 'ssd'; choose one of: auto, device, host, disk" in \
        capsys.readouterr().err


@pytest.mark.slow
def test_a_run_with_its_client_states_on_disk_stopped_and_resumed_ends_as_one_in_host_memory(data_root, tmp_path):
    """MOON (a model per client) on 250 clients, 10 a round: `--client-memory disk` keeps the previous models in
    files; a run that stops in round 1 resumes from its round-0 checkpoint (holding the previous models of the
    clients drawn in round 0) and ends with the metrics of the run in host memory."""
    def cfg(memory, out, **kw):
        return RunConfig.from_preset("scale-digits-500", **MANY, rounds=2, executor="local", participation=0.04,
                                     data_root=str(data_root), out=str(out), client_memory=memory, seed=2, **kw)

    def metrics(out):
        return [(r["round"], r["trained_clients"], r["client_loss"], r.get("accuracy"))
                for r in read_jsonl(out / "metrics.jsonl")]

    host = run(cfg("host", tmp_path / "host"), quiet=True)
    ids = list(range(250))
    out = tmp_path / "disk"
    with pytest.raises(RunError, match="non-finite"):
        run(cfg("disk", out, test_faults={"nan_loss": [1, cfg("disk", out).participants(1, ids)[0]]}), quiet=True)
    ckpt = checkpoint.read(checkpoint.checkpoint_path(out / checkpoint.DIR, 0))["driver"]
    drawn = set(cfg("disk", out).participants(0, ids))
    assert len(drawn & set(cfg("disk", out).participants(1, ids))) == 1  # (seed 2) one starts round 1 from its state
    assert set(ckpt["client_states"]) == drawn
    assert all(torch.is_tensor(v) for s in ckpt["client_states"].values() for v in s.values())
    disk = run(cfg("disk", out), quiet=True, resume=True)
    assert disk["final"] == host["final"] and metrics(out) == metrics(tmp_path / "host")
