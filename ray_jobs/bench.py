"""`make bench`: where the time goes, measured in one run on this machine; not a test.

(1) Overhead of the LightningModule client loop (`fit_local`) over a plain
    PyTorch loop on the same batches, per step and per client-round, with a
    model small enough that the overhead is visible; Lightning's own Trainer
    (checkpoint, logger, progress bar, model summary all off) for comparison.
(2) ResNet-10 training images per second through both loops, and their ratio (target >= 0.98); both loops in
    bf16-mixed (autocast) over 32-true, and whether the processor has native bfloat16 (`native_bf16`).
(3) One small FPL round through Ray, split into its phases (share of the round in %).
(4) The client engines: images per second of a group of equal-size clients trained
    one after another (`--engine sequential`) and as one batched computation
    (`--engine fused`), and their ratio, in 32-true and bf16-mixed (each engine's
    bf16-mixed / 32-true); clients of unequal (Digits-like) sizes trained as one stack,
    in one stack per size (the fused engine before it took them all) and one after
    another; `--cudnn-benchmark` and `--compile` (torch.compile, CUDA graphs on CUDA) on
    over off, and the compiled round's first call (its compilation); the ceiling of a stack's
    step (one model on the stack's images in one batch). Also the fused step's input: the
    clients' augmented batches built one client at a time vs with one gather for all.
(5) On a GPU: per-phase round times with each engine (in-process executor) and,
    with --full-runs, the wall time of one full FPL run on Office-Caltech and on Digits
    with each engine (the paper's protocol, in-process executor, the domains whose files
    the data root holds); with --full-rounds K only K rounds of each, and a whole run
    estimated from the last round's phases (a short GPU window).
(6) Writing a run's checkpoint (`benchmark.checkpoint.save`: serialise, sha256, fsync, in
    the report's folder) with the global ResNet-10 only (FedAvg, FPL) and with a model
    per client beside it (MOON's previous models, 20 clients on Digits): what
    `--checkpoint-every` saves per round.
(7) ResNet-10 training (fit_local) and evaluation images per second with the convolution
    weights contiguous (NCHW) and channels_last (NHWC, as `build_model` makes them); evaluation
    in the runs' testing batches on this device (`eval_batch`: 64 on a CPU) against one pass of 1,000.
(8) One FedPLVM round on Digit-5 (preset fedplvm-digit5, the domains the data root holds,
    in process) without and with evaluation, both from one run evaluated on a schedule
    (`--eval-every`), and what a full run of the preset costs at each schedule (an estimate
    from these two rounds).
(9) Many clients (docs/scale.md): FPL's Digits with 20, 100 and 500 clients (presets fpl-digits,
    scale-digits-100, scale-digits-500), a tenth drawn each round, one FedAvg client group in process with
    its clients in host memory (`--client-memory host`): building the group, one round's training (the
    second), the process's peak host memory over both above its memory before, and on a GPU the device's
    peak; and what a model per client (MOON's previous model) would add in host memory at each size.
(10) On the CPU: one FedAvg round in process with the default 2 client groups of 1 CPU thread each, the groups one
    after another (as before 2026-11-29) and at the same time (`LocalExecutor`), interleaved.
`--profile small` runs every section, (5) included, on any device with small
settings (rounds, clients, samples): the test of this script's code paths.
Prints a report and saves it to results/perf/bench-<device>.txt (on a GPU, <device>
is its name, e.g. bench-nvidia-h100-80gb-hbm3.txt).
"""
from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import time
import warnings
from contextlib import redirect_stdout
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from benchmark.protocols import PRECISIONS, PRESETS
from benchmark.provenance import NATIVE_BF16_FLAGS, cpu_flags, native_bf16
from benchmark.results import LAST_K
from benchmark.transforms import augment
from lightning_modules import fused as fused_engine
from lightning_modules.base import batches, eval_batch, fit_local, precision_context
from lightning_modules.clients import resolve_device
from lightning_modules.fedavg import FedAvgClient
from ray_jobs.cli import OneLineParser
from ray_jobs.config import DEVICES


class TinyNet(nn.Module):
    """A model whose step costs well under a millisecond, so loop overhead shows."""

    feature_dim = 16
    num_classes = 10

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=4)
        self.fc = nn.Linear(8, 16)
        self.classifier = nn.Linear(16, 10)

    def features(self, x):
        return F.relu(self.fc(F.adaptive_avg_pool2d(F.relu(self.conv(x)), 1).flatten(1)))

    def forward(self, x):
        z = self.features(x)
        return self.classifier(z), z


def plain_loop(net, x, y, epochs, batch_size, gen, lr=0.01):
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, weight_decay=1e-5)
    net.train()
    for _ in range(epochs):
        for idx in batches(len(y), batch_size, gen):
            idx = idx.to(x.device)
            logits, _ = net(augment(x[idx], gen))
            loss = F.cross_entropy(logits, y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fns, device, repeats):
    """Best of `repeats` wall times (seconds) of each function, the functions interleaved so
    that a slow spell of the machine hits all of them alike."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            best[i] = min(best[i], time.perf_counter() - t)
    return best


def kernels(fn) -> int:
    """The operators `fn` dispatches that are not views: each is a kernel launch on a GPU, whose small steps are
    bound by launches (a count, the same on every device, so the CPU can compare two engines' launches)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += not func.is_view
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def client_module(net_factory, device, cls=FedAvgClient):
    return cls(net_factory()).to(device)


class TrainerClient(FedAvgClient):
    """The same client module for lightning.Trainer: raw batches from a DataLoader, augmented here."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return super().training_step((augment(x), y), batch_idx)


def trainer_fit(module, x, y, epochs, batch_size):
    """The same client round through lightning.Trainer.fit, every per-fit extra off."""
    import logging

    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)
    devices = [x.device.index or 0] if x.device.type == "cuda" else 1  # the bench's GPU, not always cuda:0
    trainer = L.Trainer(max_epochs=epochs, accelerator=x.device.type, devices=devices, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    with warnings.catch_warnings(), redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        trainer.fit(module, loader)


def loop_overhead(device, n=640, epochs=5, repeats=15):
    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, device=device)
    y = torch.randint(0, 10, (n,), device=device)
    steps = epochs * ((n + 63) // 64)
    torch.manual_seed(0)
    net = TinyNet().to(device)
    module = client_module(TinyNet, device)
    t_plain, t_ours, t_trainer = timed([
        lambda: plain_loop(net, x, y, epochs, 64, torch.Generator().manual_seed(0)),
        lambda: fit_local(module, x, y, epochs, 64, torch.Generator().manual_seed(0)),
        lambda: trainer_fit(client_module(TinyNet, device, TrainerClient), x, y, epochs, 64),
    ], device, repeats)
    return steps, t_plain, t_ours, t_trainer


def resnet_loops(device, n, batch=64, ours=True, precision="32-true") -> list:
    """ResNet-10 (channels_last, as the runs') training on n random images in batches of `batch` in `precision`:
    functions of the epochs running the plain loop (under the runs' autocast context) and (`ours`) fit_local on a
    client module, each on its own model."""
    from benchmark.models import build_model

    resnet10 = lambda: build_model("resnet10", 10)  # noqa: E731
    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, device=device)
    y = torch.randint(0, 10, (n,), device=device)
    net = resnet10().to(device)

    def plain(epochs):
        with precision_context(precision, device):
            plain_loop(net, x, y, epochs, batch, torch.Generator().manual_seed(0))

    loops = [plain]
    if ours:
        module = client_module(resnet10, device)
        module.precision_mode = precision
        loops.append(lambda epochs: fit_local(module, x, y, epochs, batch, torch.Generator().manual_seed(0)))
    return loops


def resnet_throughput(device, n, epochs, repeats, batch=64, ours=True, precisions=("32-true",)):
    """Images/s of ResNet-10 training on n images in batches of `batch`: the plain loop's and (`ours`) fit_local's,
    in each of `precisions` in turn (all interleaved)."""
    loops = [f for p in precisions for f in resnet_loops(device, n, batch, ours, p)]
    return tuple(n * epochs / t for t in timed([lambda f=f: f(epochs) for f in loops], device, repeats))


def local_rounds(repeats: int, **settings) -> dict[str, dict]:
    """(10): the phases of the second round of a 2-round FedAvg run on Office-Caltech in process (`settings` over
    FPL's protocol; the default 2 client groups and CPU threads), its groups one after another
    (`LocalExecutor.concurrent` off, as before 2026-11-29) and at the same time, interleaved: each way's fastest
    round of `repeats`."""
    from ray_jobs.executors import LocalExecutor

    best = {}
    for _ in range(repeats):
        for way, together in (("one after another", False), ("at the same time", True)):
            LocalExecutor.concurrent = together
            try:
                _, phases, _ = round_phases("local", "auto", "fedavg", **settings)
            finally:
                LocalExecutor.concurrent = True
            if way not in best or phases["round"] < best[way]["round"]:
                best[way] = phases
    return best


def resnet_kernels(device, n, batch=64) -> tuple[float, float]:
    """Kernels (`kernels`) per ResNet-10 step on n images of the plain loop and of fit_local: the difference between
    two epochs and one, after one fit that allocates what a module keeps, so what a fit launches once does not
    count. On the CPU fit_local adds one a step (its running loss sum) and two an epoch (zeroing its class sums); on
    a GPU the plain loop also copies each step's indices to it (fit_local draws them there, once an epoch)."""
    loops = resnet_loops(device, n, batch)
    loops[1](1)
    steps = (n + batch - 1) // batch
    return tuple((kernels(lambda: loop(2)) - kernels(lambda: loop(1))) / steps for loop in loops)


def engine_throughput(device, method: str, sizes: list[int], epochs: int, repeats: int, precision: str = "32-true",
                      batch: int = 64, count_kernels: bool = False, compile: bool = False) -> dict[str, float]:
    """Images/s of ResNet-10 clients of the given sizes: `sequential` (fit_local one after another), `fused` (one
    stack, fit_fused) and, for clients of unequal sizes, `per-size stacks` (one fit_fused per size, a size's lone
    client with fit_local: the fused engine before it trained a group as one stack); `count_kernels`: also each
    engine's kernels (`<engine> kernels`, one more run of each under the counter). `compile`: the fused engine
    only, through torch.compile (`--compile`), and `fused first s`, the wall time of its first call (which
    compiles the round's shapes; not among the timed repeats)."""
    from benchmark.models import ResNet10, build_model
    from lightning_modules.fused import fit_fused
    from lightning_modules.registry import METHODS

    spec = METHODS[method]
    torch.manual_seed(0)
    data = [(torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, device=device),
             torch.randint(0, 10, (n,), device=device)) for n in sizes]
    module = spec.client(build_model("resnet10", 10), spec.defaults).to(device)
    module.precision_mode = precision
    start = {k: v.clone() for k, v in ResNet10().state_dict().items()}

    def start_client(i):
        module.start_round(0, None, start, client_state=None)

    def sequential(clients):
        for i in clients:
            start_client(i)
            fit_local(module, *data[i], epochs, batch, torch.Generator().manual_seed(i))

    def fused(clients):
        fit_fused(module, start_client, [data[i] for i in clients], epochs, batch,
                  [torch.Generator().manual_seed(i) for i in clients], compile=compile)

    def per_size():
        for n in sorted(set(sizes)):
            clients = [i for i, m in enumerate(sizes) if m == n]
            (sequential if len(clients) == 1 else fused)(clients)

    everyone = list(range(len(sizes)))
    engines = {"sequential": lambda: sequential(everyone), "fused": lambda: fused(everyone)}
    if len(set(sizes)) > 1:
        engines["per-size stacks"] = per_size
    first = {}
    if compile:
        engines = {"fused": engines["fused"]}
        first["fused first s"] = timed([engines["fused"]], device, 1)[0]
    times = timed(list(engines.values()), device, repeats)
    out = {**first, **{name: sum(sizes) * epochs / t for name, t in zip(engines, times)}}
    if count_kernels:  # and the kernels each engine launches
        out.update({f"{name} kernels": kernels(fn) for name, fn in engines.items()})
    return out


def input_batches(device, clients: int, n: int, repeats: int) -> tuple[float, float]:
    """Seconds per step to build the fused engine's input, `clients` batches of 64 augmented images: one
    `augmented_batch` per client (a gather and host-to-device copies each) vs `Transform.train_stacked` (one
    gather, one copy of every client's draws); the same images."""
    from benchmark.transforms import Transform
    from lightning_modules.base import augmented_batch

    x = torch.randint(0, 256, (clients * n, 3, 32, 32), dtype=torch.uint8, device=device)  # client i: rows i n...
    idx = torch.stack([torch.randperm(n, device=device)[:64] + i * n for i in range(clients)])
    t, gens = Transform(), [torch.Generator().manual_seed(i) for i in range(clients)]
    per_client = lambda: torch.stack([augmented_batch(x, x[:, 0, 0, 0], idx[i], g, torch.float32, t)[0]  # noqa: E731
                                      for i, g in enumerate(gens)])
    stacked = lambda: t.train_stacked(x, idx, gens)  # noqa: E731
    steps = 20
    return tuple(s / steps for s in timed([lambda: [per_client() for _ in range(steps)],
                                          lambda: [stacked() for _ in range(steps)]], device, repeats))


def memory_format_throughput(device, n: int, eval_n: int, repeats: int) -> dict:
    """{(training|evaluation, contiguous|channels_last): images/s} of ResNet-10 (fit_local, 1 epoch of n
    images, batch 64; one no-grad forward pass of eval_n images), its weights in either memory format; and
    (evaluation, eval_batch): the eval_n images in the runs' testing batches on this device (channels_last)."""
    from benchmark.models import build_model

    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, device=device)
    y = torch.randint(0, 10, (n,), device=device)
    xe = torch.randn(eval_n, 3, 32, 32, device=device)
    formats = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}
    modules = {k: client_module(lambda: build_model("resnet10", 10).to(memory_format=f), device)
               for k, f in formats.items()}

    def evaluate(module, batch=eval_n):
        module.net.eval()
        with torch.no_grad():
            for i in range(0, eval_n, batch):
                module.net(xe[i:i + batch])
        module.net.train()

    fns = {("training", k): (lambda m=m: fit_local(m, x, y, 1, 64, torch.Generator().manual_seed(0)))
           for k, m in modules.items()}
    fns |= {("evaluation", k): (lambda m=m: evaluate(m)) for k, m in modules.items()}
    # the testing batch the runs use on this device (`eval_batch`), channels_last as build_model makes them
    fns[("evaluation", "eval_batch")] = lambda: evaluate(modules["channels_last"], eval_batch(device))
    times = dict(zip(fns, timed(list(fns.values()), device, repeats)))
    return {key: (n if key[0] == "training" else eval_n) / t for key, t in times.items()}


def checkpoint_write(folder: Path, clients: int, repeats: int) -> tuple[float, float]:
    """Best-of-`repeats` seconds to write a checkpoint holding the global ResNet-10 and `clients` per-client
    models (as MOON's `client_state()`: the model's state_dict), and its size in MB."""
    import tempfile

    from benchmark import checkpoint
    from benchmark.models import ResNet10

    state = {k: v.detach().clone() for k, v in ResNet10().state_dict().items()}
    obj = {"driver": {"global_state": state,
                      "client_states": {c: {k: v.clone() for k, v in state.items()} for c in range(clients)}}}
    with tempfile.TemporaryDirectory(dir=folder) as d:
        path = checkpoint.save(d, 0, obj)  # (once untimed: the first write of a process allocates)
        best = timed([lambda: checkpoint.save(d, 0, obj)], torch.device("cpu"), repeats)[0]
        return best, path.stat().st_size / 1e6


def present_domains(dataset: str) -> tuple[list[str], list[str]]:
    """The dataset's domains whose files the data root holds (verified), and those it lacks."""
    from benchmark.data import DATASETS, DataError, check_domains_present, resolve_data_root

    root, have, lack = resolve_data_root(None), [], []
    for d in DATASETS[dataset]:
        try:
            check_domains_present(root, dataset, [d])
            have.append(d)
        except DataError:
            lack.append(d)
    return have, lack


def round_phases(executor="ray", engine="auto", method="fpl", dataset="office_caltech", **settings):
    """The phases of the last round of a run (`settings` over the paper's protocol): returns (cfg, phases, wall_s)."""
    import tempfile

    from ray_jobs.config import RunConfig
    from ray_jobs.run import run

    os.environ.setdefault("WANDB_MODE", "disabled")
    with tempfile.TemporaryDirectory() as out:
        cfg = RunConfig(method=method, dataset=dataset, out=out, num_actors=2, executor=executor, engine=engine,
                        **settings)
        t = time.perf_counter()
        run(cfg, quiet=True)
        wall = time.perf_counter() - t
        from benchmark.results import read_jsonl

        return cfg, read_jsonl(Path(out) / "metrics.jsonl")[-1]["time_s"], wall


def evaluation_rounds(device, **settings) -> tuple:
    """(8): one run of the fedplvm-digit5 preset (`settings` over it) of LAST_K + 2 rounds evaluated every
    LAST_K + 2-th round: rounds 0 and 1 are not evaluated, rounds 2 on are (the last LAST_K). Returns (cfg, the
    domains lacking, round 1's phases (no evaluation), round 2's (evaluated)): two warm rounds of one process."""
    import tempfile

    from benchmark.results import LAST_K, read_jsonl
    from ray_jobs.config import RunConfig
    from ray_jobs.run import run

    os.environ.setdefault("WANDB_MODE", "disabled")
    domains, lacking = present_domains("digit5")
    with tempfile.TemporaryDirectory() as out:
        cfg = RunConfig.from_preset("fedplvm-digit5", **{**settings, "rounds": LAST_K + 2, "eval_every": LAST_K + 2,
                                                          "domains": domains, "out": out, "executor": "local",
                                                          "device": str(device)})
        run(cfg, quiet=True)
        rows = read_jsonl(Path(out) / "metrics.jsonl")
    assert [r["evaluated"] for r in rows[:3]] == [False, False, True], "the schedule of (8) changed"
    return cfg, lacking, rows[1]["time_s"], rows[2]["time_s"]


SCALE_PRESETS = {20: "fpl-digits", 100: "scale-digits-100", 500: "scale-digits-500"}


def scale_round(device, clients: int, **settings) -> dict:
    """(9): a FedAvg client group of the preset with `clients` clients (the domains the data root holds), at
    participation 0.1, in host memory: seconds to build it and to train round 1's drawn clients, the MB of the
    clients' tensors it holds in host memory (images, states, own models), the device's peak (MB, on a GPU) and the
    images it holds."""
    from benchmark.communication import count
    from benchmark.data import resolve_data_root
    from benchmark.models import build_model
    from lightning_modules.clients import ClientGroup
    from ray_jobs.config import RunConfig
    from ray_jobs.run import plan_run_clients

    domains, _ = present_domains("digits")
    cfg = RunConfig.from_preset(SCALE_PRESETS[clients], **{**settings, "method": "fedavg", "participation": 0.1,
                                "client_memory": "host", "executor": "local", "domains": domains,
                                "device": str(device)})
    planned = plan_run_clients(cfg)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t = time.perf_counter()
    group = ClientGroup(cfg, planned, str(resolve_data_root(None)))
    build = time.perf_counter() - t
    state = build_model(cfg.dataset_spec.model, cfg.dataset_spec.num_classes).state_dict()
    ids = [c["id"] for c in planned]
    group.train(state, None, 0, cfg.participants(0, ids))
    sync(device)
    t = time.perf_counter()
    drawn = cfg.participants(1, ids)
    group.train(state, None, 1, drawn)
    sync(device)
    train = time.perf_counter() - t
    return dict(clients=len(planned), drawn=len(drawn), build_s=build, train_s=train,
                trained_images=cfg.local_epochs * sum(len(group.data[cid][1]) for cid in drawn),
                images=sum(len(y) for _, y in group.data.values()), peak_on_device=group.peak_on_device,
                host_mb=count([group.data, group.test_data, group.client_states, group.own_models])[1] / 2**20,
                device_mb=torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
                model_mb=count(state)[1] / 1e6)


def evaluated_rounds(rounds: int, eval_every: int, eval_last: int = 1) -> int:
    """How many of `rounds` rounds a run evaluates at `eval_every` (RunConfig.evaluates), the last `eval_last` always
    (1: FedPLVM's tables read the final round)."""
    from ray_jobs.config import RunConfig

    cfg = RunConfig(rounds=rounds, eval_every=eval_every, eval_last=eval_last)
    return sum(cfg.evaluates(r) for r in range(rounds))


def shares(phases: dict) -> str:
    """Each phase's seconds and its share of the round."""
    return "  ".join(f"{k} {v:.3f}s ({100 * v / phases['round']:.0f}%)" for k, v in phases.items() if k != "round") + \
        f"  round {phases['round']:.3f}s"


SMALL_RUN = dict(rounds=2, local_epochs=1, eval_max=None)  # (3) and (5): the second round of this run is measured
# sizes per profile: (1) the tiny model's images, epochs and repeats, (2) images, epochs and repeats (kernels: the
# images and batch of its kernel count, 2 steps an epoch), (4) clients/samples/epochs/repeats, methods and precisions,
# and clients of unequal sizes (stacks: clients of each size, the sizes (Digits' MNIST, USPS, SYN shares: 600, 72,
# 100; on the CPU scaled down with the batch, so that the clients take as many steps), batch, epochs, repeats), (5)
# the small runs (phases: on top of SMALL_RUN) and the full runs (full: on top of the preset), (6) per-client models
# and repeats, (7) training images, evaluation images and repeats, (8) the settings over the fedplvm-digit5 preset
# (none: the paper's protocol), (9) the settings over the scale presets, (10) the settings over SMALL_RUN and the
# repeats. The small profile (a test of every section's code path) trains as few images as each line allows (on a CPU
# without native bfloat16 its bf16-mixed lines train at 2-3 images/s) and its runs test 10 images a domain: an
# evaluation phase that is still timed, at a fifth of the 50 before (2026-12-02)
PROFILES = {
    "cpu": dict(loop=(640, 5, 15), resnet=(192, 1, 3), kernels=(128, 64), engines=(3, 128, 1, 2),
                methods=("fedavg",), precisions=("32-true", "bf16-mixed"),
                local=(dict(client_fraction=0.3, eval_max=None), 2),
                stacks=(2, (150, 18, 25), 16, 1, 2), phases=dict(client_fraction=0.3), checkpoint=(20, 3),
                memory=(192, 1000, 3), fedplvm=dict(), scale=dict(local_epochs=1)),
    "cuda": dict(loop=(640, 5, 15), resnet=(640, 2, 5), kernels=(128, 64), engines=(10, 600, 1, 3),
                 methods=("fedavg", "fpl"), precisions=("32-true", "bf16-mixed"), stacks=(2, (600, 72, 100), 64, 1, 3),
                 phases=dict(client_fraction=0.3), full=dict(eval_max=None), checkpoint=(20, 3), memory=(640, 1000, 5),
                 fedplvm=dict(), scale=dict()),
    "small": dict(loop=(128, 1, 2), resnet=(16, 1, 1), kernels=(16, 8), engines=(2, 16, 1, 1),
                  methods=("fedavg", "fpl"), local=(dict(client_fraction=0.05, eval_max=10), 1),
                  precisions=("32-true", "bf16-mixed"), stacks=(2, (8, 3, 5), 4, 1, 1),
                  phases=dict(client_fraction=0.05, eval_max=10),
                  full=dict(rounds=1, local_epochs=1, client_fraction=0.05, eval_max=10), checkpoint=(2, 1),
                  memory=(64, 100, 1), fedplvm=dict(local_epochs=1, batch_size=8, client_fraction=0.05, eval_max=10),
                  scale=dict(local_epochs=1, client_fraction=0.1)),
}
TARGETS_S = {"digits": 120, "office_caltech": 20}  # the GPU goal: a full FPL run on one H100 (docs/speed.md)


def device_slug(device: torch.device) -> str:
    if device.type != "cuda":
        return device.type
    return "-".join("".join(ch if ch.isalnum() else " " for ch in torch.cuda.get_device_name(device).lower()).split())


def build_parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m ray_jobs.bench", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto (cuda when there is a GPU), cpu, cuda or cuda:N")
    ap.add_argument("--skip-ray", action="store_true", help="skip (3), e.g. on a machine without Ray")
    ap.add_argument("--out-dir", default="results/perf")
    ap.add_argument("--full-runs", action="store_true",
                    help="on a GPU: also time full FPL runs on Office-Caltech and Digits (minutes)")
    ap.add_argument("--full-rounds", type=int, default=None,
                    help="with --full-runs: run K rounds of each full protocol and estimate the whole run from them "
                         "(a short GPU window: about a minute for K = 3)")
    ap.add_argument("--profile", default="auto", choices=["auto", "small"],
                    help="auto: the sizes for the device; small: every section with small settings (a test)")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    """The bench's arguments, refused with one line each where they cannot run here."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.device not in DEVICES and not args.device.startswith("cuda:"):
        ap.error(f"unknown device {args.device!r}; choose one of: {', '.join(DEVICES)} (or cuda:N)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device} but this machine has no CUDA GPU; use --device cpu or auto")
    if args.full_rounds is not None and args.full_rounds < 1:
        ap.error(f"--full-rounds must be at least 1 (got {args.full_rounds})")
    return args


def main(argv=None):
    args = parse_args(argv)
    device = resolve_device(args.device)
    prof = PROFILES["small" if args.profile == "small" else ("cuda" if device.type == "cuda" else "cpu")]
    small_run = {**SMALL_RUN, **prof["phases"]}
    lines = []
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench-{device_slug(device)}.txt"
    flags = " ".join(argv if argv is not None else sys.argv[1:])

    def say(s=""):
        """Print a line and rewrite the bench's file with every line so far: a bench stopped part-way (a GPU
        window's end) keeps the sections it finished."""
        print(s, flush=True)
        lines.append(s)
        path.write_text("\n".join(lines) + f"\n\ncommand: python -m ray_jobs.bench {flags}".rstrip() + "\n")

    hw = (torch.cuda.get_device_name(device) if device.type == "cuda"
          else f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    say(f"make bench  {time.strftime('%Y-%m-%d %H:%M')}  device: {device} ({hw}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f} at start, profile {args.profile}")
    say()
    n, epochs, repeats = prof["loop"]
    steps, t_plain, t_ours, t_trainer = loop_overhead(device, n, epochs, repeats)
    say(f"(1) client loop overhead, tiny model, {steps} steps of batch 64 per client-round (best of {repeats}, "
        "interleaved)")
    say(f"    plain PyTorch loop        {1e3 * t_plain:8.2f} ms per client-round  "
        f"{1e3 * t_plain / steps:7.3f} ms per step")
    say(f"    LightningModule fit_local {1e3 * t_ours:8.2f} ms per client-round  "
        f"{1e3 * t_ours / steps:7.3f} ms per step")
    say(f"    lightning.Trainer.fit     {1e3 * t_trainer:8.2f} ms per client-round  "
        f"{1e3 * t_trainer / steps:7.3f} ms per step")
    say(f"    overhead of fit_local: {1e3 * (t_ours - t_plain) / steps:+.3f} ms per step, "
        f"{1e3 * (t_ours - t_plain):+.2f} ms per client-round (target <= 0.1 ms and <= 5 ms)")
    say(f"    overhead of Trainer.fit: {1e3 * (t_trainer - t_plain):+.2f} ms per client-round")
    say()
    n, epochs, repeats = prof["resnet"]
    ips_plain, ips_ours, bf16_plain, bf16_ours = resnet_throughput(device, n, epochs, repeats, precisions=PRECISIONS)
    say(f"(2) ResNet-10 training throughput ({n * epochs} images per measurement, batch {min(64, n)}, best of "
        f"{repeats}, both "
        "precisions interleaved)")
    say(f"    plain PyTorch loop        {ips_plain:9.1f} images/s")
    say(f"    LightningModule fit_local {ips_ours:9.1f} images/s")
    say(f"    ratio fit_local / plain   {ips_ours / ips_plain:9.3f}   (target >= 0.98)")
    say(f"    bf16-mixed: plain {bf16_plain:.1f}, fit_local {bf16_ours:.1f} images/s; bf16-mixed / 32-true: plain "
        f"{bf16_plain / ips_plain:6.3f}, fit_local {bf16_ours / ips_ours:6.3f}")
    if device.type == "cpu":
        cpu = cpu_flags()  # (not `flags`: the command's, which every rewrite of the file ends with)
        mkldnn = torch.ops.mkldnn._is_mkldnn_bf16_supported()
        say(f"    native bfloat16 on this processor: {'yes' if native_bf16(cpu) else 'no'} ("
            + (", ".join(f for f in NATIVE_BF16_FLAGS if f in cpu) or f"neither {' nor '.join(NATIVE_BF16_FLAGS)}")
            + f" in /proc/cpuinfo's flags; torch's CPU capability {torch.backends.cpu.get_cpu_capability()}, "
            f"torch.ops.mkldnn._is_mkldnn_bf16_supported() {mkldnn}); --precision auto picks "
            f"{'bf16-mixed' if native_bf16(cpu) else '32-true'}")
    k_plain, k_ours = resnet_kernels(device, *prof["kernels"])
    say(f"    kernels per step (operators dispatched, views not counted): plain {k_plain:.1f}, fit_local {k_ours:.1f}")
    if not args.skip_ray:
        say()
        # on a GPU the driver and both actors share it (a process uses a GPU only with a share of one)
        gpu = dict(device="cuda", gpus_per_actor=1 / 3, driver_gpus=1 / 3) if device.type == "cuda" else {}
        cfg, phases, _ = round_phases(**small_run, **gpu)
        say(f"(3) one FPL round through Ray: Office-Caltech, {cfg.num_actors} client actors, 10 clients at "
            f"{cfg.client_fraction:g} of their data, 1 local epoch, "
            f"{'full test sets' if cfg.eval_max is None else f'test sets capped at {cfg.eval_max}'} (second round)")
        for k, v in phases.items():
            say(f"    {k:24s} {v:8.3f} s  {100 * v / phases['round']:5.1f}%")
    say()
    clients, n, epochs, repeats = prof["engines"]
    # (4) and (7) with cuDNN's heuristic algorithms unless a line says otherwise (the runs in process of (5), (8) and
    # (9) set torch.backends.cudnn.benchmark as their config says: on, the runs' default)
    torch.backends.cudnn.benchmark = False
    say(f"(4) client engines: {clients} clients of {n} samples, {epochs} local epoch, batch {min(64, n)}, ResNet-10 "
        f"(best of {repeats}, interleaved; cuDNN benchmark off but where a line says on)")
    plain = {}  # FedAvg in 32-true, for the --cudnn-benchmark line
    for method in prof["methods"]:
        rates = {}
        for precision in prof["precisions"]:
            ips = rates[precision] = engine_throughput(device, method, [n] * clients, epochs, repeats, precision)
            if (method, precision) == ("fedavg", "32-true"):
                plain["equal"] = ips
            say(f"    {method:8s} {precision:10s} sequential {ips['sequential']:9.1f} images/s   "
                f"fused {ips['fused']:9.1f} images/s   fused / sequential {ips['fused'] / ips['sequential']:6.3f}")
        if len(rates) == 2:
            say(f"    {method:8s} bf16-mixed / 32-true       " + "   ".join(
                f"{e} {rates['bf16-mixed'][e] / rates['32-true'][e]:6.3f}" for e in ("sequential", "fused")))
    # the ceiling of a stack's step: one model on the stack's images in one batch (the same images per step as the
    # fused engine's, without the clients' own weights: plain convolutions, not grouped ones)
    (ceiling,) = resnet_throughput(device, clients * n, epochs, repeats, batch=clients * 64, ours=False)
    say(f"    one model, the {clients} clients' images in batches of {clients * min(64, n)} (plain loop: a stack's "
        f"step without its clients' own weights) {ceiling:9.1f} images/s, "
        f"{ceiling / plain['equal']['fused']:6.3f} x the fused engine (FedAvg, 32-true)")
    per_size, sizes, batch, epochs, repeats = prof["stacks"]
    unequal = [m for m in sizes for _ in range(per_size)]
    ips = plain["unequal"] = engine_throughput(device, "fedavg", unequal, epochs, repeats, batch=batch,
                                               count_kernels=True)
    say(f"    clients of unequal sizes (FedAvg, {per_size} clients of each of {', '.join(map(str, sizes))} samples, "
        f"batch {batch}, 32-true): sequential {ips['sequential']:.1f}, one stack {ips['fused']:.1f}, per-size stacks "
        f"{ips['per-size stacks']:.1f} images/s; one stack / per-size stacks "
        f"{ips['fused'] / ips['per-size stacks']:6.3f}, one stack / sequential "
        f"{ips['fused'] / ips['sequential']:6.3f}; kernels launched (operators dispatched, views not counted): "
        f"sequential {ips['sequential kernels']}, one stack {ips['fused kernels']}, per-size stacks "
        f"{ips['per-size stacks kernels']}")
    # --cudnn-benchmark: cuDNN times each convolution shape's algorithms and keeps the fastest (the fused engine's
    # vmapped convolutions are grouped ones); the CPU has no cuDNN, where the line only shows the path runs
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        on = {"equal": engine_throughput(device, "fedavg", [n] * clients, epochs, repeats),
              "unequal": engine_throughput(device, "fedavg", unequal, epochs, repeats, batch=batch)}
    finally:
        torch.backends.cudnn.benchmark = before
    say(f"    --cudnn-benchmark on / off (FedAvg, 32-true{', no cuDNN on the CPU' if device.type == 'cpu' else ''}): "
        + ", ".join(f"{what} {engine} {on[what][engine] / plain[what][engine]:6.3f}"
                    for what in ("equal", "unequal") for engine in ("sequential", "fused")))
    # --compile: the fused engine's forward and backward through torch.compile (inductor, CUDA graphs on CUDA: the
    # launch-bound steps' lead); on the CPU through aot_eager, which generates no kernels: the line shows the path
    # runs. Clients of one size, whose round has few shapes to compile (each compiles once, on the first call)
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    before = fused_engine.COMPILE_BACKEND
    fused_engine.COMPILE_BACKEND = backend
    try:
        on = engine_throughput(device, "fedavg", [n] * clients, epochs, repeats, compile=True)
    finally:
        fused_engine.COMPILE_BACKEND = before
    say(f"    --compile on / off (fused, FedAvg, 32-true, {clients} clients of {n} samples, torch.compile backend "
        f"{backend}{', mode reduce-overhead: CUDA graphs' if device.type == 'cuda' else ', no kernel generation'}): "
        f"{on['fused']:.1f} against {plain['equal']['fused']:.1f} images/s, "
        f"{on['fused'] / plain['equal']['fused']:6.3f}; its first round (compiling) {on['fused first s']:.1f} s")
    t_each, t_one = input_batches(device, clients, n, repeats)
    say(f"    fused step input ({clients} clients x {min(64, n)} augmented images): one gather per client "
        f"{1e3 * t_each:7.2f} ms, one for all {1e3 * t_one:7.2f} ms per step, per client / one {t_each / t_one:6.2f}")
    if device.type == "cuda" or args.profile == "small":
        say()
        say(f"(5) one FPL round on Office-Caltech in process, per phase and share of the round (second round of a "
            f"2-round, 1-epoch run at {prof['phases']['client_fraction']:g} of the data; runs as configured by "
            f"default, --cudnn-benchmark on)")
        for engine in ("sequential", "fused"):
            _, phases, _ = round_phases("local", engine, **small_run, device=str(device))
            say(f"    {engine:10s} {shares(phases)}")
        if args.full_runs or args.profile == "small":
            full = {**prof["full"], **({"rounds": args.full_rounds} if args.full_rounds else {})}
            for dataset in ("office_caltech", "digits"):
                domains, lacking = present_domains(dataset)
                for engine in ("sequential", "fused"):
                    cfg, phases, wall = round_phases("local", engine, "fpl", dataset, domains=domains,
                                                     device=str(device), **full)
                    what = (f"    full FPL {dataset}{' without ' + ', '.join(lacking) if lacking else ''}: "
                            f"{cfg.rounds} rounds x {cfg.local_epochs} epochs, engine {engine}: wall {wall:.1f} s")
                    if args.full_rounds:  # the preset's whole run from the last round's phases (evaluated)
                        from ray_jobs.config import RunConfig

                        rounds = RunConfig(method="fpl", dataset=dataset).rounds  # the protocol's
                        e = evaluated_rounds(rounds, 5, LAST_K)  # Table 2's schedule: every 5th, the last 5
                        est = rounds * (phases["round"] - phases["evaluation"]) + e * phases["evaluation"]
                        what += (f"; a whole run of {rounds} rounds about {est:.0f} s (estimate: the last round's "
                                 f"training x {rounds}, its evaluation x the {e} rounds --eval-every 5 tests)")
                    say(f"{what} (target {TARGETS_S[dataset]} s); last round {shares(phases)}")
    clients, repeats = prof["checkpoint"]
    say()
    say(f"(6) writing a run's checkpoint (serialise, sha256, fsync; in {out}), best of {repeats}")
    for k, what in ((0, "global model only (FedAvg, FPL)"), (clients, f"and {clients} client models (MOON)")):
        secs, mb = checkpoint_write(out, k, repeats)
        say(f"    {what:36s} {mb:7.1f} MB {secs:8.3f} s {mb / secs:7.0f} MB/s   "
            f"--checkpoint-every 10 saves {0.9 * secs:.3f} s per round")
    n, eval_n, repeats = prof["memory"]
    torch.backends.cudnn.benchmark = False  # as (4): the runs of (5) left it on
    ips = memory_format_throughput(device, n, eval_n, repeats)
    say()
    say(f"(7) ResNet-10 convolution weights contiguous (NCHW) vs channels_last (NHWC, as build_model makes them), "
        f"best of {repeats}, interleaved, cuDNN benchmark off")
    for phase, what in (("training", f"training, fit_local on {n} images"),
                        ("evaluation", f"evaluation, {eval_n} images")):
        a, b = ips[(phase, "contiguous")], ips[(phase, "channels_last")]
        say(f"    {what:34s} contiguous {a:9.1f} images/s   channels_last {b:9.1f} images/s   "
            f"channels_last / contiguous {b / a:6.3f}")
    a, b = ips[("evaluation", "channels_last")], ips[("evaluation", "eval_batch")]
    say(f"    evaluation in batches of {eval_batch(device)} (the runs' on this device) {b:9.1f} images/s, one pass of "
        f"{eval_n} {a:9.1f} images/s: {b / a:6.3f}")
    cfg, lacking, plain, evaluated = evaluation_rounds(device, **prof["fedplvm"])
    say()
    say(f"(8) one FedPLVM round, Digit-5{' without ' + ', '.join(lacking) if lacking else ''} (preset fedplvm-digit5"
        f"{''.join(f', {k} {v}' for k, v in prof['fedplvm'].items())}; {len(cfg.domains)} domains, engine "
        f"{cfg.engine}, in process), rounds 1 and 2 of one {cfg.rounds}-round run with --eval-every {cfg.eval_every}")
    say(f"    without evaluation (round 1) {shares(plain)}")
    say(f"    with evaluation    (round 2) {shares(evaluated)}")
    say(f"    with / without {evaluated['round'] / plain['round']:6.2f}")
    rounds = PRESETS["fedplvm-digit5"]["rounds"]
    for k in (1, 5, rounds):
        e = evaluated_rounds(rounds, k)
        est = e * evaluated["round"] + (rounds - e) * plain["round"]
        say(f"    a full run ({rounds} rounds) at --eval-every {k:<3d}: {e:2d} rounds evaluated, about "
            f"{est / 60:6.1f} min (estimate: these two rounds' times; the final round always, as FedPLVM's tables "
            "read it)")
    say()
    settings = prof["scale"]
    say(f"(9) many clients: one FedAvg client group in process, FPL's Digits at participation 0.1, clients in host "
        f"memory ({', '.join(f'{k} {v}' for k, v in settings.items()) or 'the preset protocol'}); round 1's training")
    for n in SCALE_PRESETS:
        r = scale_round(device, n, **settings)
        device_mb = "" if r["device_mb"] is None else f", device peak {r['device_mb']:7.1f} MB"
        say(f"    {SCALE_PRESETS[n]:17s} {r['clients']:3d} clients ({r['images']} images), {r['drawn']:2d} drawn: "
            f"build {r['build_s']:6.2f} s, round {r['train_s']:7.2f} s "
            f"({r['trained_images'] / r['train_s']:6.1f} images/s), at most {r['peak_on_device']} client "
            f"on the device, host {r['host_mb']:6.1f} MB{device_mb}; a model per client (MOON) would add "
            f"{r['clients'] * r['model_mb']:7.1f} MB in host memory")
    if device.type == "cpu":
        settings, repeats = prof["local"]
        best = local_rounds(repeats, **{**SMALL_RUN, **settings})
        say()
        tests = "full test sets" if settings["eval_max"] is None else f"test sets capped at {settings['eval_max']}"
        say(f"(10) one FedAvg round in process: Office-Caltech, the default 2 client groups and 1 CPU thread each, 10 "
            f"clients at {settings['client_fraction']:g} of their data, 1 local epoch, {tests} (second round, best "
            f"of {repeats}, interleaved)")
        for way, phases in best.items():
            say(f"    groups {way:18s} {shares(phases)}")
        one, both = best["one after another"], best["at the same time"]
        say(f"    one after another / at the same time: local training "
            f"{one['local_training'] / both['local_training']:6.3f}, round {one['round'] / both['round']:6.3f}")
    print(f"\nsaved: {path}")
    return path


if __name__ == "__main__":
    main()
