"""Entry point: `python -m ray_jobs.run --method fpl --dataset digits ...`.

Works locally (starts a Ray cluster of its own, or joins the one --address or RAY_ADDRESS names) and as a
`ray job submit` entrypoint. Defaults are the paper's protocol. Bad input
stops before any training with one message saying what is wrong and how to fix it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import pandas as pd

from benchmark import checkpoint
from benchmark.checkpoint import CheckpointError
from benchmark.data import DataError, check_domains_present, resolve_data_root
from benchmark.figures import plot_curves
from benchmark.partition import plan_clients
from benchmark.protocols import AUTO_PRECISION, DATASET_SPECS, PRESETS, ConfigError, client_share, splits_of
from benchmark.provenance import run_provenance
from benchmark.results import TEMP_FILES, Recorder, WriteError, protocol
from lightning_modules.privacy import model_options
from lightning_modules.registry import METHODS, HyperparameterError
from ray_jobs.cli import OneLineParser
from ray_jobs.config import RunConfig
from ray_jobs.progress import RunProgress

DEFAULT_OUT = Path("results") / "runs"


class RunError(RuntimeError):
    """A run cannot start or had to stop; the message says why."""


def parse_hp(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--hp takes name=value (got {item!r}).")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


class DefaultsFormatter(argparse.RawDescriptionHelpFormatter):
    """Each option's help ends with its default, unless the help already says it or there is none to say (None:
    the preset's value, which the help names; a switch's False; --hp's empty list). The description and the list
    of methods after the options keep their lines."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default == [] \
                or action.default == argparse.SUPPRESS or "default" in (action.help or ""):
            return action.help
        return f"{action.help} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    width = max(map(len, METHODS)) + 2
    methods = "\n".join(f"  {name:{width}}{m.description}" for name, m in METHODS.items())
    p = OneLineParser(prog="python -m ray_jobs.run", description=__doc__, formatter_class=DefaultsFormatter,
                      epilog=f"methods (--method):\n{methods}")
    d = RunConfig.__dataclass_fields__
    p.add_argument("--preset", default=None,
                   help=f"a paper's protocol, one of {', '.join(PRESETS)}; the flags below override its values "
                        "(without a preset: FPL's protocol, the defaults shown)")
    p.add_argument("--method", default=d["method"].default, help="one of the methods listed below")
    p.add_argument("--dataset", default=None,
                   help=f"one of {', '.join(DATASET_SPECS)} (default: the preset's, else digits)")
    p.add_argument("--split", default=None,
                   help="the clients' layout (default: the preset's, else the dataset's first): "
                        + "; ".join(f"{ds}: {', '.join(splits_of(ds))}" for ds in DATASET_SPECS)
                        + f". {DIRICHLET}: the default layout with FedPLVM's Dirichlet label skew "
                        f"(--dirichlet-alpha, default {DIRICHLET_ALPHA})"),
    p.add_argument("--dirichlet-alpha", type=float, default=None,
                   help="FedPLVM's label skew: each client's class counts drawn from Dirichlet(alpha) (with any split)")
    p.add_argument("--dirichlet-seed", type=int, default=d["dirichlet_seed"].default,
                   help="the seed of that draw (default 0, FedPLVM's code's draw in every run: the seeds then vary "
                        "the training over one draw, as the paper's runs; another value draws other class counts)")
    p.add_argument("--domains", default=None, help="comma-separated subset of the dataset's domains")
    for flag, kind in (("rounds", int), ("local_epochs", int), ("batch_size", int), ("lr", float), ("momentum", float)):
        p.add_argument(f"--{flag.replace('_', '-')}", type=kind, default=None,
                       help=f"default: the preset's, else {d[flag].default}")
    p.add_argument("--seed", type=int, default=d["seed"].default,
                   help="the run's seed: model initialisation, client shares, batch order, augmentation")
    p.add_argument("--aggregation", default=None,
                   help="how the clients' weights are averaged: samples (by sample count, FPL's) or uniform "
                        "(FedPLVM's)")
    p.add_argument("--client-init", default=None,
                   help="round 0's start: shared (one initialisation, FPL's) or own (one per client, FedPLVM's)")
    p.add_argument("--hp", action="append", default=[], metavar="NAME=VALUE",
                   help="method hyperparameter, e.g. tau=0.02")
    p.add_argument("--client-fraction", type=float, default=1.0,
                   help="scales every client's sample count, in (0, 1]")
    p.add_argument("--participation", type=float, default=None,
                   help="the share F of the clients that train in each round: max(1, round(F x N)) drawn from (seed, "
                        "round), the same for every method and executor (default: the preset's, else 1: every client)")
    p.add_argument("--erasing", action="store_true",
                   help="training batches also get torchvision's RandomErasing after crop and flip (a reading of "
                        "FedAPC's augmentation, docs/fedapc.md); part of the run's protocol and its folder's name")
    p.add_argument("--eval-max", type=int, default=None, help="caps each domain's test set")
    p.add_argument("--eval-every", type=int, default=d["eval_every"].default,
                   help="test after every K-th round (0: none) and after each of the last 5, which the final and "
                        "last-5 metrics read; training is the same whatever K")
    p.add_argument("--executor", default="ray", choices=["ray", "local"],
                   help="ray: client actors and a driver actor on a Ray cluster; local: all in this process")
    p.add_argument("--address", default=None, help=ADDRESS_HELP)
    p.add_argument("--num-actors", type=int, default=d["num_actors"].default,
                   help="client groups: Ray's client actors; with --executor local the groups in this process")
    p.add_argument("--spread", action="store_true",
                   help="Ray: place the client actors over as many nodes as possible (SPREAD); default: Ray's "
                        "default scheduling, which fills a node before the next")
    p.add_argument("--cpus-per-actor", type=float, default=d["cpus_per_actor"].default,
                   help="each client group's CPU threads (torch's; its whole CPUs, at least 1). Ray: the CPUs each "
                        "client actor reserves, its process's threads. --executor local: each group's calls in a "
                        "thread of this process with that many threads, the groups at the same time on the CPU with "
                        "the sequential engine and no dropout (else one after another): the kernels, and so the "
                        "numbers, of either executor; --num-actors x this is the CPU threads a round trains on")
    p.add_argument("--gpus-per-actor", type=float, default=d["gpus_per_actor"].default,
                   help="Ray: GPUs each client actor reserves (fractions share a GPU)")
    p.add_argument("--driver-cpus", type=float, default=d["driver_cpus"].default,
                   help="the driver's CPU threads (torch's: aggregation, clustering, the global model's evaluation). "
                        "Ray: the CPUs the driver actor reserves, its process's threads. --executor local: the "
                        "threads of this process's own thread, beside the groups' (--cpus-per-actor)")
    p.add_argument("--driver-gpus", type=float, default=d["driver_gpus"].default,
                   help="Ray: GPUs the driver actor reserves")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--engine", default=d["engine"].default,
                   help="client training: sequential (one client after another), fused (a client group as one "
                        "batched computation) or auto (sequential on the CPU, fused on CUDA)")
    p.add_argument("--client-memory", default=d["client_memory"].default,
                   help="where a client group keeps the clients it is not training: device, host (moved to the "
                        "device when drawn), disk (as host, their persistent states and own models in files) or "
                        "auto (host under --participation below 1)")
    p.add_argument("--compile", action="store_true",
                   help="the fused engine's step through torch.compile (compiles once per shape of stack and batch)")
    p.add_argument("--cudnn-benchmark", action=argparse.BooleanOptionalAction, default=d["cudnn_benchmark"].default,
                   help="CUDA: cuDNN times each convolution shape's algorithms once and keeps the fastest "
                        "(torch.backends.cudnn.benchmark; on by default, --no-cudnn-benchmark for cuDNN's heuristics); "
                        "not part of a run's protocol")
    p.add_argument("--precision", default=None,
                   help="32-true (float32, as the references), bf16-mixed (bfloat16 autocast, Lightning's plugin) or "
                        f"{AUTO_PRECISION}: bf16-mixed on a CPU whose processor has native bfloat16 (AVX512-BF16 or "
                        "AMX-BF16 in its flags), else 32-true, and 32-true on CUDA (default: the preset's, 32-true, on "
                        "any processor); the run records its pick (config.json, its protocol), and one away from the "
                        "preset's says so in its name (-bf16-mixed)")
    p.add_argument("--data-root", default=None, help="default: $BENCH_DATA_ROOT, ./data, ../shared/data")
    p.add_argument("--out", default=None,
                   help=f"run folder (default {DEFAULT_OUT}/<run-name>; one holding a finished run is never replaced)")
    p.add_argument("--name", default=None,
                   help="run name (default method-dataset-split-seed; before -seed each --hp away from the method's "
                        "default, '-alpha0.5', and each protocol value away from the preset's, '-rounds2-bf16-mixed')")
    p.add_argument("--wandb-project", default=d["wandb_project"].default, help="the W&B project of the run")
    p.add_argument("--wandb-group", default=None, help="its W&B group (default: the dataset)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-round lines")
    p.add_argument("--resume", action="store_true",
                   help="continue from the run folder's last checkpoint (a fresh start when it has none)")
    p.add_argument("--actor-restarts", type=int, default=d["actor_restarts"].default,
                   help="restarts of one client actor (process killed, out of memory) before the run stops")
    p.add_argument("--checkpoint-every", type=int, default=d["checkpoint_every"].default,
                   help="write the run folder's checkpoint every N rounds (and after the last); a resume redoes "
                        "at most N-1 rounds; 0: none, a stopped run starts again from round 0. MOON's and FedDyn's "
                        "checkpoints hold a model per client")
    return p


DIRICHLET, DIRICHLET_ALPHA = "dirichlet", 0.5  # --split dirichlet: FedPLVM's label skew at its alpha (appendix D)


def config_from_args(args) -> RunConfig:
    """The preset's protocol (FPL's defaults without one), with every flag given on the command line over it."""
    split = None if args.split == DIRICHLET else args.split  # --split dirichlet: the preset's clients, skewed
    given = {k: v for k, v in dict(dataset=args.dataset, split=split, rounds=args.rounds,
                                   local_epochs=args.local_epochs, batch_size=args.batch_size, lr=args.lr,
                                   momentum=args.momentum, aggregation=args.aggregation, client_init=args.client_init,
                                   participation=args.participation, erasing=args.erasing or None,
                                   precision=args.precision).items()
             if v is not None}
    if args.split == DIRICHLET or args.dirichlet_alpha is not None:
        given["dirichlet_alpha"] = DIRICHLET_ALPHA if args.dirichlet_alpha is None else args.dirichlet_alpha
    make = (lambda **kw: RunConfig.from_preset(args.preset, **kw)) if args.preset else RunConfig
    return make(
        **given, method=args.method,
        domains=args.domains.split(",") if args.domains is not None else None,
        seed=args.seed, dirichlet_seed=args.dirichlet_seed, hparams=parse_hp(args.hp),
        client_fraction=args.client_fraction, eval_max=args.eval_max, eval_every=args.eval_every,
        executor=args.executor, num_actors=args.num_actors, spread=args.spread, cpus_per_actor=args.cpus_per_actor,
        gpus_per_actor=args.gpus_per_actor, driver_cpus=args.driver_cpus, driver_gpus=args.driver_gpus,
        device=args.device, actor_restarts=args.actor_restarts,
        checkpoint_every=args.checkpoint_every, engine=args.engine, compile=args.compile,
        cudnn_benchmark=args.cudnn_benchmark,
        client_memory=args.client_memory, data_root=args.data_root, out=args.out, name=args.name,
        wandb_project=args.wandb_project, wandb_group=args.wandb_group,
    )


ADDRESS_HELP = ("Ray: the running cluster to join, host:port of its head or auto (the one `ray start` started on this "
                "machine); default RAY_ADDRESS, else a Ray cluster of the run's own, whatever other clusters run here")


def check_ray_address(address: str | None, named: str) -> str | None:
    """The host:port of the cluster to join (`named`: how the user gave it; auto: the head `ray start` last started
    on this machine, as Ray's own `find_bootstrap_address` reads it from ray_current_cluster, never another cluster
    found running), None for none; fails fast (5 s) when it does not answer."""
    if not address or address == "local":
        return None
    if address == "auto":
        from ray._common.utils import get_ray_address_file
        from ray._private.services import find_bootstrap_address

        pointer, address = get_ray_address_file(None), find_bootstrap_address(None)
        if not address:
            raise RunError(f"{named}: no Ray cluster was started with `ray start` on this machine ({pointer} is "
                           "absent); start one with `ray start --head`, give its host:port, or give none to start a "
                           "Ray cluster of this run's own.")
        named = f"{named} (the head {pointer} names, {address})"
    url = urlparse(address if "://" in address else f"tcp://{address}")
    host, port = url.hostname, url.port
    if not host or not port:
        raise RunError(f"{named} is not host:port; give the head's GCS address (e.g. 10.0.0.1:6379), auto for the "
                       "cluster `ray start` started on this machine, or none to start a Ray cluster of this run's own.")
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as e:
        raise RunError(
            f"{named} is unreachable ({e.strerror or e}). Start the head with `ray start --head`, fix the address, "
            "or give none (no --address, RAY_ADDRESS unset) to start a Ray cluster of this run's own."
        ) from None
    return address


def check_device(cfg: RunConfig) -> None:
    """--device cuda needs a GPU where the model runs: this machine (local executor) or a GPU share for the
    driver and every actor (a process under Ray uses CUDA only with a share, `resolve_device`)."""
    if not cfg.device.startswith("cuda"):
        return
    if cfg.executor == "local":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"--device {cfg.device} but this machine has no CUDA GPU (torch.cuda.is_available() is "
                              "False); use --device cpu or --device auto.")
    elif cfg.device != "cuda":
        raise ConfigError(f"--device {cfg.device} picks a GPU of this machine, but under Ray each process sees only "
                          "the GPUs Ray reserved for it, numbered from cuda:0; use --device cuda with --driver-gpus "
                          "and --gpus-per-actor (Ray picks the GPUs), or --executor local.")
    elif cfg.driver_gpus <= 0 or cfg.gpus_per_actor <= 0:
        raise ConfigError(f"--device {cfg.device} with the Ray executor needs a GPU share for the driver and every "
                          f"actor (got --driver-gpus {cfg.driver_gpus:g}, --gpus-per-actor {cfg.gpus_per_actor:g}); "
                          "give both (fractions share a GPU) or use --device auto.")


def gpus_needed(shares: list[float]) -> int:
    """The fewest GPUs that hold these per-process GPU shares as Ray places them: a share of 1 or more takes that
    many whole GPUs, a fraction must fit on one GPU beside the others there (first fit, largest first)."""
    whole = sum(math.ceil(g - 1e-9) for g in shares if g >= 1)
    free: list[float] = []  # what is left on each GPU holding fractions
    for g in sorted((g for g in shares if 0 < g < 1), reverse=True):
        i = next((i for i, f in enumerate(free) if f >= g - 1e-9), None)
        if i is None:
            free.append(1 - g)
        else:
            free[i] -= g
    return whole + len(free)


def run_gpu_shares(cfg: RunConfig) -> list[float]:
    """The GPU share of each process of a run: its driver and every client actor."""
    return [cfg.driver_gpus, *[cfg.gpus_per_actor] * cfg.num_actors]


def unused_gpus_note(cfg: RunConfig, have: dict) -> str | None:
    """A note when the Ray cluster has GPUs and the run reserves none: its processes then train on CPUs (a process
    uses a GPU only with a share of one, `resolve_device`)."""
    if have.get("GPU", 0) > 0 and not any(run_gpu_shares(cfg)) and cfg.device in ("auto", "cpu"):
        return (f"note: the Ray cluster has {have['GPU']:g} GPUs but this run reserves none, so it trains on CPUs; "
                "give --gpus-per-actor and --driver-gpus (fractions share a GPU) to use them.")
    return None


def ray_only_note(cfg: RunConfig) -> str | None:
    """A note when a run without Ray is given what only Ray reads: where its actors go and the GPUs they reserve
    (--cpus-per-actor and --driver-cpus are read in process too: the groups' and the driver's CPU threads)."""
    defaults = RunConfig.__dataclass_fields__
    given = [f"--{name.replace('_', '-')}" for name in ("spread", "gpus_per_actor", "driver_gpus")
             if getattr(cfg, name) != defaults[name].default]
    if cfg.executor != "local" or not given:
        return None
    return (f"note: {', '.join(given)} place{'s' if len(given) == 1 else ''} Ray's actors; the local executor runs "
            "every client group in this process and ignores " + ("it" if len(given) == 1 else "them")
            + " (--device picks its device).")


_NOTES_SAID: set[str] = set()  # each note once per process (a sweep checks every run)


def init_ray(cfg: RunConfig, address: str | None = None):
    """Ray for this process, once: a cluster of its own (Ray's address "local", with logical CPUs enough for the
    driver and every actor), whatever other Ray clusters run on the machine; or, when `address` (--address) or else
    RAY_ADDRESS names one (host:port, or auto: the one `ray start` started here), that cluster, joined on purpose and
    asked for nothing (Ray refuses num_cpus and num_gpus from a driver that joins). Either way the run's resources
    are checked against the cluster's before anything starts."""
    import ray

    named = f"--address {address}" if address else f"RAY_ADDRESS={os.environ.get('RAY_ADDRESS')}"
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    need_cpu = cfg.driver_cpus + cfg.num_actors * cfg.cpus_per_actor
    need_gpu = gpus_needed(run_gpu_shares(cfg))
    if not ray.is_initialized():
        if address == "local":
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, math.ceil(need_cpu)), logging_level="WARNING")
        else:
            join_ray(ray, address, named)
    have = ray.cluster_resources()
    if need_cpu > have.get("CPU", 0) or need_gpu > have.get("GPU", 0):
        raise RunError(
            f"the run asks for {need_cpu:g} CPUs and {need_gpu:g} GPUs (driver plus {cfg.num_actors} actors; a GPU "
            f"holds fractions up to 1) but the Ray cluster has {have.get('CPU', 0):g} CPUs and {have.get('GPU', 0):g} "
            "GPUs; lower --num-actors, --cpus-per-actor or --gpus-per-actor (fractions share a GPU)."
        )
    note = unused_gpus_note(cfg, have)
    if note and note not in _NOTES_SAID:
        _NOTES_SAID.add(note)
        print(note, file=sys.stderr, flush=True)
    return ray


def join_ray(ray, address: str, named: str) -> None:
    """Join the running cluster at `address` and say which it is (GCS address, dashboard, resources)."""
    address = check_ray_address(address, named)
    token = (f"the Ray cluster at {address} needs its token and this driver has none or a wrong one; set "
             "RAY_AUTH_MODE=token and give the cluster's token with RAY_AUTH_TOKEN_PATH=<file> (or RAY_AUTH_TOKEN).")
    try:
        context = ray.init(address=address, logging_level="WARNING")
    except ray.exceptions.AuthenticationError:
        raise RunError(token) from None
    except ConnectionError as e:
        if "InvalidAuthToken" in str(e.__cause__):
            raise RunError(token) from None
        raise RunError(f"{named}: no Ray cluster to join ({str(e).strip().splitlines()[0]}) Start one with "
                       "`ray start --head`, or give no address to start a Ray cluster of this run's own.") from None
    have, nodes = ray.cluster_resources(), sum(n["Alive"] for n in ray.nodes())
    dashboard = f", dashboard http://{context.dashboard_url}" if context.dashboard_url else ""
    print(f"note: joined the Ray cluster at {context.address_info['gcs_address']} ({named}{dashboard}; {nodes} "
          f"node(s), {have.get('CPU', 0):g} CPUs, {have.get('GPU', 0):g} GPUs)", flush=True)


def run_folder(cfg: RunConfig) -> Path:
    """Where a run writes: its `out`, else results/runs/<run name>."""
    return Path(cfg.out) if cfg.out else DEFAULT_OUT / cfg.run_name


def check_writable(out: Path) -> None:
    """Fail before any work when the run folder cannot be made: it is made, and what did not exist removed again."""
    missing = [p for p in [out, *out.parents] if not p.exists()]  # the deepest first
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"the run folder {out} cannot be made ({e.strerror}); name a folder you can write to with "
                          "--out.") from None
    for p in missing:
        try:
            p.rmdir()
        except OSError:  # another run (a parallel sweep's) made its own folder in it meanwhile: it stays
            break


def plan_run_clients(cfg: RunConfig, root: Path | None = None) -> list[dict]:
    """Every client of the run (id, domain, training indices, sample count; under an n-way k-shot split also
    its classes and test indices), as the dataset's protocol partitions it."""
    spec = cfg.dataset_spec
    return plan_clients(root or resolve_data_root(cfg.data_root), cfg.dataset, cfg.clients_per_domain,
                        client_share(cfg.dataset, cfg.split, spec), cfg.seed, cfg.client_fraction, spec.per_class,
                        cfg.ways, cfg.label_skew, cfg.ways_stdev, cfg.ways_shots)


def run(cfg: RunConfig, quiet: bool = False, resume: bool = False,
        resume_hint: str = "run the same command again with --resume", on_round=None,
        address: str | None = None) -> dict:
    """Run one experiment end to end; returns summary.json's content. `on_round(record)`, if given, gets each
    round's metrics.jsonl record once it is logged (a sweep's progress). `address`: the Ray cluster to join
    (`init_ray`; default RAY_ADDRESS, else a cluster of the run's own).

    Every `checkpoint_every` rounds (never when 0) the run folder gets a checkpoint (`benchmark.checkpoint`); with
    `resume` the run continues from the newest readable one (a fresh start, said so, when there is none).
    `resume_hint` is how to resume, for the messages of a run that stopped."""
    check_device(cfg)
    root = resolve_data_root(cfg.data_root)
    checksums = check_domains_present(root, cfg.dataset, cfg.domains)
    clients = plan_run_clients(cfg, root)
    short = [c for c in clients if cfg.drop_last and c["num_samples"] < cfg.batch_size]
    if short:
        raise ConfigError(f"client {short[0]['id']} ({short[0]['domain']}) has {short[0]['num_samples']} samples, no "
                          f"full batch of {cfg.batch_size} with drop_last; use a smaller --batch-size"
                          + (" or a larger --client-fraction." if cfg.client_fraction < 1 else "."))
    out = run_folder(cfg)
    check_writable(out)
    ckpt_dir = out / checkpoint.DIR
    for stale in [*out.glob(TEMP_FILES), *ckpt_dir.glob(TEMP_FILES)]:  # of a write that a kill interrupted
        stale.unlink(missing_ok=True)
    start = None
    if resume:
        start = checkpoint.load_latest(ckpt_dir, protocol(cfg))
        print(f"note: no checkpoint in {ckpt_dir}; starting {cfg.run_name} from round 0" if start is None else
              f"note: resuming {cfg.run_name} after round {start['round']} of {cfg.rounds}", flush=True)
    elif checkpoint.listing(ckpt_dir):
        print(f"note: {out} holds checkpoints of an earlier run; starting afresh (pass --resume to continue it)",
              flush=True)
    first = 0 if start is None else start["round"] + 1
    record_cfg = {**cfg.to_dict(), "run_name": cfg.run_name, "departures": cfg.departures,
                  "dropped_domains": cfg.dropped_domains,
                  "model_options": model_options(cfg.hparams),
                  "data_root": str(root), "out": str(out),
                  "resumed_after_round": None if start is None else start["round"]}
    from ray_jobs.driver import Driver

    if cfg.executor == "ray":
        ray = init_ray(cfg, address)
        driver = ray.remote(Driver).options(num_cpus=cfg.driver_cpus,
                                            num_gpus=cfg.driver_gpus).remote(cfg, clients, str(root))
        call = lambda name, *a: ray.get(getattr(driver, name).remote(*a))  # noqa: E731
    else:
        driver = Driver(cfg, clients, str(root))
        call = lambda name, *a: getattr(driver, name)(*a)  # noqa: E731

    public_clients = [{k: c[k] for k in ("id", "domain", "num_samples", "classes", "class_counts", "test_class_counts")
                       if k in c} for c in clients]
    progress = recorder = None
    try:
        record_cfg["provenance"] = run_provenance(checksums, call("describe"))
        if start is not None:
            call("restore", start["driver"])
        else:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        recorder = Recorder(out, record_cfg, public_clients, call("test_sizes"),
                            [] if start is None else start["metrics"])
        if cfg.dropped_domains:
            print(f"note: domains left out of this run: {', '.join(cfg.dropped_domains)} (their clients are dropped)")
        progress = None if quiet else RunProgress(cfg.run_name, cfg.rounds, first=first)
        hold = cfg.test_faults.get("hold_before_round")  # test-only: [round, path]: wait for the file before it
        for r in range(first, cfg.rounds):
            while hold and r == hold[0] and not Path(hold[1]).exists():
                time.sleep(0.05)
            rec = call("run_round", r)
            for note in rec.pop("notes"):
                print(f"note: round {r}: {note}", flush=True)
            recorder.log_round(rec)
            if cfg.checkpoint_every and ((r + 1) % cfg.checkpoint_every == 0 or r == cfg.rounds - 1):
                checkpoint.save(ckpt_dir, r, {"protocol": protocol(cfg), "round": r, "driver": call("checkpoint"),
                                              "metrics": recorder.rounds})
            if progress:
                progress.update(rec)
            if on_round:
                on_round(rec)
        final = call("final_state")
        if final is not None:  # None: no global model (each client kept its own)
            recorder.save_model(final)
        features = call("final_features")
        if features is not None:  # per-client test samples (FedProto's protocol): its Figure 2's t-SNE reads them
            recorder.save_features(features)
        memory = call("peak_memory")
        plot_curves([out], out / "curves", f"{cfg.run_name}: accuracy over rounds", formats=("png",))
        summary = recorder.finish(images={"curves": out / "curves.png"}, peak_memory=memory)
    except (Exception, KeyboardInterrupt) as e:  # the run stops; the folder keeps what it has, without summary.json
        if isinstance(e, KeyboardInterrupt):
            msg = "interrupted (Ctrl-C)."
        elif cfg.executor == "ray" and isinstance(e, ray.exceptions.RayActorError):  # (a client actor's death reaches
            # this process as the driver's task error, RayTaskError, once the driver gives up on it: ActorFailed)
            msg = (f"the run's driver actor was lost ({str(e).strip().splitlines()[-1].strip()}): its process or its "
                   "node died, and the run stopped.")
        else:
            msg = str(getattr(e, "cause", None) or e).strip().splitlines()[-1] if str(e) else repr(e)
        done = checkpoint.newest_round(ckpt_dir)
        msg += (f" The run folder keeps its rounds up to {done} (checkpoint); to continue, {resume_hint}."
                if done is not None else "")
        if recorder:  # error.txt, and the W&B run finished as failed
            recorder.fail(msg)
        if cfg.executor == "ray":  # free its resources now: the traceback would keep the actors alive
            ray.kill(driver)  # (its client actors go with it)
        if isinstance(e, KeyboardInterrupt):
            raise
        raise RunError(msg) from e
    finally:
        if progress:
            progress.close()
    shutil.rmtree(ckpt_dir, ignore_errors=True)  # a complete run needs no resume (and a sweep's would fill disks)
    return summary


def format_table(summary: dict, departures: dict | None = None) -> str:
    """The printed summary: its title (the run's precision always, and its `departures` from the preset's protocol:
    `RunConfig.departures`) and its final (and last-5) accuracy per domain."""
    df = pd.DataFrame({"final": summary["final"], **({"last5": summary["last5"]} if summary["last5"] else {})}).T
    title = (f"{summary['method']} on {summary['dataset']} ({summary['split']} split, seed {summary['seed']}, "
             f"{summary['rounds']} rounds, {summary['protocol']['precision']})")
    if summary.get("dropped_domains"):
        title += f"; without {', '.join(summary['dropped_domains'])}"
    if departures:
        title += "; away from the preset's protocol: " + ", ".join(f"{k} {v}" for k, v in departures.items())
    return f"{title}\n{df.to_string(float_format=lambda v: f'{v:6.2f}')}"


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # bad flags (one line printed, code 2) or --help (code 0)
        return e.code
    t0 = time.time()
    argv = sys.argv[1:] if argv is None else list(argv)
    hint = "run: python -m ray_jobs.run " + shlex.join(argv if "--resume" in argv else [*argv, "--resume"])
    try:
        cfg = config_from_args(args)
        out = run_folder(cfg)
        if (out / "summary.json").exists():  # a finished run (a table's, committed): never replaced from here
            raise ConfigError(f"{out} holds a finished run (its summary.json), which this run would replace; name "
                              "another folder with --out, or delete that one to run it again.")
        last = checkpoint.newest_round(out / checkpoint.DIR)
        if last is not None and not args.resume:  # an interrupted run: its checkpoints are never deleted from here
            raise ConfigError(f"{out} holds an interrupted run (its newest checkpoint after round {last}); continue "
                              f"it with --resume, or start it afresh by deleting {out / checkpoint.DIR} (or name "
                              "another folder with --out).")
        if note := ray_only_note(cfg):
            print(note, flush=True)
        summary = run(cfg, quiet=args.quiet, resume=args.resume, resume_hint=hint, address=args.address)
    except (ConfigError, HyperparameterError, DataError, RunError, CheckpointError, WriteError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"error: interrupted; the run folder keeps every complete round (checkpoint). To continue, {hint}",
              file=sys.stderr)
        return 130
    print(format_table(summary, cfg.departures))
    print(f"run folder: {out}  ({time.time() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
