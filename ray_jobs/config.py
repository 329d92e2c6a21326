"""A run's configuration: one frozen dataclass, FPL's protocol as defaults, each paper's protocol a named preset
(`benchmark.protocols`), and how the run is executed (executor, actors and their resources, engine, device,
checkpoints, evaluation schedule).

`RunConfig` goes as it is to the driver and to every client group (Ray pickles it); the client side
(`lightning_modules.clients`) reads its fields without importing it. It checks every value when made, the method
and its hyperparameters against the registry (`lightning_modules.registry`).
`RunConfig.from_preset("fedplvm-digit5", seed=1)` is that paper's protocol; any field given beside the preset
overrides it.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from benchmark.data import DATASETS, TWO_ARCHIVE_SPLIT
from benchmark.partition import LabelSkew, load_counts
from benchmark.protocols import (AGGREGATIONS, AUTO_PRECISION, CLIENT_INITS, DATASET_SPECS, DEFAULT_SPLIT, PRECISIONS,
                                 PRESET_HPARAMS, PRESETS, RANDOM_SPLIT, SPLITS, ConfigError, DatasetSpec,
                                 reference_random_split, splits_of, unknown_name)
from benchmark.provenance import cpu_flags, native_bf16
from benchmark.results import LAST_K
from benchmark.sampling import participants
from benchmark.transforms import Transform
from lightning_modules.clients import CLIENT_MEMORY, ENGINES, resolve_device
from lightning_modules.privacy import FUSED_REFUSAL, private
from lightning_modules.registry import METHODS

DEVICES = ("auto", "cpu", "cuda")  # --device (auto: cuda when the process sees a GPU)
# the protocol's fields that a run's default name carries where they depart from its preset's (RunConfig's defaults,
# FPL's protocol, without a preset), each with its label there (`RunConfig.departures`): a short run (2 rounds, 5% of
# the samples, a capped test set) or one in another precision never takes, or blocks, a protocol run's folder. The
# fields the name carries always (method, dataset, domains, split, label skew, hyperparameters, participation,
# erasing, seed) are not listed
DEPARTURE_LABELS = {"rounds": "rounds", "local_epochs": "epochs", "batch_size": "batch", "lr": "lr",
                    "momentum": "sgdmomentum", "weight_decay": "wd", "drop_last": "droplast", "aggregation": "agg",
                    "client_init": "init", "client_fraction": "fraction", "eval_max": "evalmax", "precision": ""}


def auto_precision(flags: set[str], cuda: bool) -> str:
    """`--precision auto`: bf16-mixed on a CPU whose processor has native bfloat16 (`native_bf16` of its `flags`),
    where autocast's convolutions run in it; 32-true elsewhere, and on CUDA (bf16-mixed unmeasured there against the
    seed spread: docs/running.md)."""
    return "bf16-mixed" if not cuda and native_bf16(flags) else "32-true"


@dataclass(frozen=True)
class RunConfig:
    method: str = "fpl"
    dataset: str = "digits"
    split: str | None = None  # None: the dataset's default preset
    domains: list[str] | None = None  # None: all domains of the dataset
    rounds: int = 100
    local_epochs: int = 10
    seed: int = 0
    batch_size: int = 64
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-5
    drop_last: bool = False  # drop each epoch's last short batch (FedPLVM)
    aggregation: str = "samples"  # samples | uniform (AGGREGATIONS)
    client_init: str = "shared"  # shared | own (CLIENT_INITS)
    # FedPLVM's label skew (its appendix D; its code's `prepare_data_digits_noniid`, `--beta`): each client's class
    # counts drawn from Dirichlet(alpha) (`benchmark.partition.LabelSkew`); None: the protocol's own split (label iid)
    dirichlet_alpha: float | None = None
    # the seed of that draw: FedPLVM's code draws with 0 in every run (its main() seeds numpy with 0 whatever the
    # run), so the paper's runs share one draw and a table's seeds vary the training over it; another value draws
    # other class counts (the run's folder name then says -draw<N>)
    dirichlet_seed: int = 0
    # the share of the clients that train in each round (`benchmark.sampling`: max(1, round(F * N)) drawn from
    # (seed, round)); 1: every client every round
    participation: float = 1.0
    # training batches also erased (torchvision's RandomErasing after crop and flip): a reading of FedAPC's
    # implementation details, which list erasing beside cropping and flipping (docs/fedapc.md); any method takes it,
    # so FedAvg with the same erasing is FedAPC's control
    erasing: bool = False
    preset: str | None = None  # the PRESETS entry this config came from (recorded; from_preset sets it)
    hparams: dict = field(default_factory=dict)  # the method's hyperparameters (defaults from the registry)
    client_fraction: float = 1.0  # scales every client's sample count (small settings)
    eval_max: int | None = None  # caps each domain's test set (small settings)
    # evaluate after round r when (r + 1) % eval_every == 0 (eval_every 0: never but the last rounds), and after
    # each of the last `eval_last` rounds: LAST_K (the final and the last-5 metrics) or 1 (the final only: a table
    # that reads the final round sets it; the summary's last5 is then null); not part of the protocol: training is
    # the same whatever the schedule
    eval_every: int = 1
    eval_last: int = LAST_K
    executor: str = "ray"
    num_actors: int = 2
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = 0.0
    driver_cpus: float = 1.0
    driver_gpus: float = 0.0
    device: str = "auto"  # auto: cuda when the process sees a GPU
    spread: bool = False  # Ray: client actors placed with the SPREAD strategy, over as many nodes as possible
    actor_restarts: int = 3  # restarts of one client actor in a run before the run stops (docs/reliability.md)
    checkpoint_every: int = 1  # rounds between the run folder's checkpoints, 0 none (docs/reliability.md)
    engine: str = "auto"  # client training: sequential | fused | auto (sequential on CPU and under DP-SGD, fused on
                          # CUDA)
    # 32-true | bf16-mixed (autocast for training and evaluation) | auto (`auto_precision` for this machine: the run
    # records its pick, never auto)
    precision: str = "32-true"
    compile: bool = False  # the fused engine's step through torch.compile (not part of the protocol: same training)
    # CUDA: cuDNN times the algorithms of each convolution shape once and keeps the fastest
    # (torch.backends.cudnn.benchmark); not part of the protocol: the same arithmetic, up to the algorithms' rounding.
    # On by default: 1.11 to 1.65 times the images/s of either engine on an H100 (docs/speed.md); no effect on a CPU
    cudnn_benchmark: bool = True
    # where a client group keeps its clients' images and persistent state between their rounds (CLIENT_MEMORY):
    # device (as loaded), host (host memory, moved to the device while the client trains or is tested), disk (as
    # host, and the persistent states and own models in files between rounds), auto (host under --participation
    # below 1); not part of the protocol: the same numbers either way (docs/scale.md)
    client_memory: str = "auto"
    data_root: str | None = None
    out: str | None = None
    name: str | None = None
    wandb_project: str = "fedproto-bench"
    wandb_group: str | None = None
    # test-only fault injection, never set by the command line: {"nan_loss": [round, client id]} starts that
    # client's training in that round from NaN weights (tests/test_reliability.py); {"hold_before_round": [round,
    # path]} waits before that round until the file exists (tests/test_sweep_parallel.py's Ctrl-C)
    test_faults: dict = field(default_factory=dict)
    # how the dataset's train and test sets are made when not as its archives are (`benchmark.data.TWO_ARCHIVE_SPLIT`:
    # "pooled" for digit5, FedBN's re-split; None otherwise); set from the dataset, never given; a protocol key, so a
    # run recorded before digit5's re-split (no such key: None) is not taken for one made after
    data_split: str | None = field(default=None, init=False)

    @classmethod
    def from_preset(cls, preset: str, /, **overrides) -> RunConfig:
        """The preset's protocol; fields in `overrides` (seed, method, a smaller setting...) win."""
        if preset not in PRESETS:
            raise ConfigError(unknown_name("preset", preset, PRESETS))
        base = PRESETS[preset]
        return cls(**{**base, **overrides, "preset": preset})

    def __post_init__(self):
        if self.method not in METHODS:
            raise ConfigError(unknown_name("method", self.method, sorted(METHODS)))
        if self.dataset not in DATASETS:
            raise ConfigError(unknown_name("dataset", self.dataset, DATASETS))
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        set_("data_split", TWO_ARCHIVE_SPLIT.get(self.dataset))
        if self.split is None:
            set_("split", DEFAULT_SPLIT[self.dataset])
        splits = splits_of(self.dataset)
        if self.split not in splits:
            preset = PRESETS.get(self.preset, {})
            if self.split == preset.get("split") and self.dataset != preset["dataset"]:  # the preset's, for its dataset
                raise ConfigError(f"preset {self.preset} is for {preset['dataset']} (split {self.split}), and "
                                  f"{self.dataset} has no split {self.split!r}; with --dataset {self.dataset} name one "
                                  f"of its splits with --split ({', '.join(splits)}), or leave --dataset out.")
            raise ConfigError(unknown_name("split", self.split, splits, f" for {self.dataset}"))
        all_domains = list(DATASETS[self.dataset])
        if self.domains is None:
            set_("domains", all_domains)
        unknown = [d for d in self.domains if d not in all_domains]
        if unknown or not self.domains:
            raise ConfigError(unknown_name("domain", unknown or [""], all_domains, f" for {self.dataset}"))
        set_("domains", [d for d in all_domains if d in self.domains])  # canonical order
        if self.rounds < 1:
            raise ConfigError(f"rounds must be at least 1 (got {self.rounds}).")
        if self.local_epochs < 1:
            raise ConfigError(f"local epochs must be at least 1 (got {self.local_epochs}).")
        if not 0 < self.client_fraction <= 1:
            raise ConfigError(f"client fraction must be in (0, 1] (got {self.client_fraction}).")
        if not 0 < self.participation <= 1:
            raise ConfigError(f"participation must be in (0, 1] (got {self.participation}).")
        if self.eval_max is not None and self.eval_max < 1:
            raise ConfigError(f"eval-max must be at least 1 (got {self.eval_max}).")
        if self.eval_every < 0:
            raise ConfigError(f"eval-every must be 0 (the last rounds alone) or more (got {self.eval_every}).")
        if self.eval_last not in (1, LAST_K):
            raise ConfigError(f"eval_last is 1 (the final round) or {LAST_K} (the last-{LAST_K} mean too), "
                              f"not {self.eval_last}.")
        if self.executor not in ("ray", "local"):
            raise ConfigError(unknown_name("executor", self.executor, ("ray", "local")))
        if self.engine not in ENGINES:
            raise ConfigError(unknown_name("engine", self.engine, ENGINES))
        if self.aggregation not in AGGREGATIONS:
            raise ConfigError(unknown_name("aggregation", self.aggregation, AGGREGATIONS))
        if self.client_init not in CLIENT_INITS:
            raise ConfigError(unknown_name("client initialisation", self.client_init, CLIENT_INITS))
        if self.dirichlet_alpha is not None:
            if not (self.dirichlet_alpha > 0 and math.isfinite(self.dirichlet_alpha)):
                raise ConfigError(f"dirichlet-alpha must be a finite number above 0 (got {self.dirichlet_alpha}).")
            if self.dataset_spec.ways:
                raise ConfigError(f"{self.dataset}'s n-way k-shot split draws its own classes; the Dirichlet label "
                                  "split is for the share (FPL) and per-class (FedPLVM) protocols.")
        if not (isinstance(self.dirichlet_seed, int) and self.dirichlet_seed >= 0):
            raise ConfigError(f"dirichlet-seed must be a whole number, 0 or more (got {self.dirichlet_seed!r}).")
        if self.dirichlet_seed and self.dirichlet_alpha is None:
            raise ConfigError(f"dirichlet-seed {self.dirichlet_seed} seeds the Dirichlet label skew, which this run "
                              "does not use; add --split dirichlet (or --dirichlet-alpha A), or leave it out.")
        if not isinstance(self.erasing, bool):
            raise ConfigError(f"erasing is true or false (got {self.erasing!r}).")
        if self.client_memory not in CLIENT_MEMORY:
            raise ConfigError(unknown_name("client memory", self.client_memory, CLIENT_MEMORY))
        if self.preset is not None and self.preset not in PRESETS:
            raise ConfigError(unknown_name("preset", self.preset, PRESETS))
        if self.batch_size < 1:
            raise ConfigError(f"batch size must be at least 1 (got {self.batch_size}).")
        for name in ("lr", "momentum"):
            if not (getattr(self, name) >= 0 and math.isfinite(getattr(self, name))):
                raise ConfigError(f"{name} must be a finite number, 0 or more (got {getattr(self, name)}).")
        if self.momentum >= 1:  # SGD's momentum buffer then never decays: the steps grow without bound
            raise ConfigError(f"momentum must be below 1 (got {self.momentum}); the papers use 0.9 (FPL, FedAPC) "
                              "or 0.5 (FedPLVM).")
        if self.out is not None and Path(self.out).exists() and not Path(self.out).is_dir():
            raise ConfigError(f"--out {self.out} is a file; a run writes a folder there: name a new folder (or the "
                              "run folder of a run to resume).")
        if self.num_actors < 1:
            raise ConfigError(f"num-actors must be at least 1 (got {self.num_actors}).")
        if self.actor_restarts < 0:
            raise ConfigError(f"actor-restarts must be 0 or more (got {self.actor_restarts}).")
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint-every must be 0 (no checkpoint) or more (got {self.checkpoint_every}).")
        if self.seed < 0:
            raise ConfigError(f"seed must be 0 or more (got {self.seed}).")
        for name in ("cpus_per_actor", "gpus_per_actor", "driver_cpus", "driver_gpus"):
            if not (getattr(self, name) >= 0 and math.isfinite(getattr(self, name))):
                raise ConfigError(f"{name.replace('_', '-')} must be a finite number, 0 or more "
                                  f"(got {getattr(self, name)}).")
        for name in ("gpus_per_actor", "driver_gpus"):
            g = getattr(self, name)
            if g > 1 and g != int(g):
                raise ConfigError(f"{name.replace('_', '-')} {g:g}: Ray gives a process a fraction of one GPU "
                                  f"(at most 1) or whole GPUs; use {math.floor(g)}, {math.ceil(g)} or a fraction "
                                  "below 1.")
        if self.device not in DEVICES and not self.device.startswith("cuda:"):
            raise ConfigError(f"unknown device {self.device!r}; choose one of: {', '.join(DEVICES)} (or cuda:N).")
        if self.precision == AUTO_PRECISION:  # picked where the run starts (a Ray cluster's nodes: as this one)
            cuda = resolve_device(self.device, self.gpus_per_actor if self.executor == "ray" else None).type == "cuda"
            set_("precision", auto_precision(cpu_flags(), cuda))
        if self.precision not in PRECISIONS:
            raise ConfigError(unknown_name("precision", self.precision, [*PRECISIONS, AUTO_PRECISION]))
        spec = METHODS[self.method]
        unknown_hp = sorted(set(self.hparams) - set(spec.defaults))
        if unknown_hp:
            raise ConfigError(unknown_name("hyperparameter", unknown_hp, sorted(spec.defaults), f" for {self.method}"))
        set_("hparams", {**self.hparam_defaults, **self.hparams})
        spec.validate(self.hparams)
        if self.engine == "fused" and private(self.hparams):
            raise ConfigError(FUSED_REFUSAL)
        if spec.client_model is not None and self.dataset_spec.model != "cnn_mnist":
            raise ConfigError(f"{self.method} varies the MNIST CNN's conv2 width per client; use --preset "
                              f"fedproto-mnist-n3 (or -n4, -n5), not {self.dataset} ({self.dataset_spec.model}).")

    @property
    def averages_weights(self) -> bool:
        """Whether the method's server rule averages weights (`ServerRule.averages_weights`); when it does not, the
        run's `aggregation` is moot and no part of its protocol (`benchmark.results.protocol`)."""
        return METHODS[self.method].server.averages_weights

    @property
    def hparam_defaults(self) -> dict:
        """The method's hyperparameters under this run's protocol: the registry's defaults and what its preset sets
        over them (`PRESET_HPARAMS`: FedOpt's step under the other papers' protocols, FedPer's, FedRep's and FeSEM's
        under FedProto's)."""
        return {**METHODS[self.method].defaults, **PRESET_HPARAMS.get(self.preset, {}).get(self.method, {})}

    def evaluates(self, round_idx: int) -> bool:
        """Whether the global model (or each client's) is tested after round `round_idx`: every `eval_every`-th
        round (none at 0) and each of the last `eval_last` rounds, which the final (and the last-5) metrics read."""
        return ((self.eval_every > 0 and (round_idx + 1) % self.eval_every == 0)
                or round_idx >= self.rounds - self.eval_last)

    def participants(self, round_idx: int, client_ids: list[int]) -> list[int]:
        """The clients that train in round `round_idx` (`benchmark.sampling.participants`)."""
        return participants(client_ids, self.participation, self.seed, round_idx)

    def starts_apart(self, round_idx: int) -> bool:
        """Whether the clients start round `round_idx` from their own initialisations, not from the global
        weights: round 0 under `client_init="own"` (FedPLVM's protocols)."""
        return round_idx == 0 and self.client_init == "own"

    @property
    def states_every_round(self) -> bool:
        """Whether the client groups send their clients' persistent states (MOON's previous models, FedDyn's h_k)
        to the driver with every round's results: only Ray actors that Ray may restart (`actor_restarts` > 0) and
        whose clients must then be rebuilt; otherwise the driver reads them only to write a checkpoint."""
        return self.executor == "ray" and self.actor_restarts > 0

    @property
    def dataset_spec(self) -> DatasetSpec:
        return DATASET_SPECS[self.dataset]

    @property
    def transform(self) -> Transform:
        """The training and test transform: the dataset's, its training batches erased under `erasing`."""
        spec = self.dataset_spec
        return dataclasses.replace(spec.transform, erase=True) if self.erasing else spec.transform

    @property
    def clients_per_domain(self) -> dict[str, int]:
        split = self.layout
        return {d: split[d] for d in self.domains}

    @property
    def layout(self) -> dict[str, int]:
        """Clients per domain of the whole split, the domains left out of the run included."""
        if self.split == RANDOM_SPLIT:
            return reference_random_split(self.dataset, self.seed)
        return dict(SPLITS[self.dataset][self.split])

    @property
    def label_skew(self) -> LabelSkew | None:
        """The Dirichlet label split's draw over the whole layout (None: label iid)."""
        if self.dirichlet_alpha is None:
            return None
        return LabelSkew(self.dirichlet_alpha, self.layout, self.dataset_spec.skew_rounding, self.dirichlet_seed)

    def domain_per_class(self, domain: str):
        """`load_domain`'s `per_class` for a domain of this run: what its clients train on and its test set keeps
        (None outside a per-class protocol); the plan, the client groups and the driver all read it."""
        counts = load_counts(self.dataset_spec.per_class, self.clients_per_domain, self.label_skew)
        return None if counts is None else counts[domain]

    @property
    def ways(self) -> int | None:
        """The mean n of an n-way k-shot split (FedProto's protocol); None for the other protocols."""
        return self.dataset_spec.ways[self.split][0] if self.dataset_spec.ways else None

    @property
    def ways_stdev(self) -> int | None:
        """The stdev of n of an n-way k-shot split (2 in FedProto's Table 1, 3 in Table 2's second rows)."""
        return self.dataset_spec.ways[self.split][1] if self.dataset_spec.ways else None

    @property
    def ways_shots(self) -> int | None:
        """The mean k (training samples per class) of an n-way k-shot split (100 but in FedProto's Figure 3)."""
        return self.dataset_spec.ways[self.split][2] if self.dataset_spec.ways else None

    @property
    def dropped_domains(self) -> list[str]:
        return [d for d in DATASETS[self.dataset] if d not in self.domains]

    @property
    def run_name(self) -> str:
        if self.name:
            return self.name
        dom = "" if not self.dropped_domains else "-no_" + "_".join(self.dropped_domains)
        skew = "" if self.dirichlet_alpha is None else (
            f"-dirichlet{self.dirichlet_alpha:g}" + (f"-draw{self.dirichlet_seed}" if self.dirichlet_seed else ""))
        part = "" if self.participation == 1 else f"-part{self.participation:g}"
        part += "-erasing" if self.erasing else ""
        # each hyperparameter away from the method's default (a grid's point, --hp): -alpha0.125; at the default none,
        # so a grid's default point is the method's plain run
        defaults = self.hparam_defaults
        hp = "".join(f"-{k}{v:g}" if isinstance(v, float) else f"-{k}{v}"
                     for k, v in self.hparams.items() if v != defaults[k])
        return f"{self.method}-{self.dataset}{dom}-{self.split}{skew}{hp}{part}{self.departures_name}-seed{self.seed}"

    @property
    def departures_name(self) -> str:
        """What the run's default name says of its `departures`: -rounds2-epochs1-fraction0.05-bf16-mixed ("" for
        none)."""
        return "".join(f"-{DEPARTURE_LABELS[k]}{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool)
                       else f"-{DEPARTURE_LABELS[k]}{str(v).lower()}" for k, v in self.departures.items())

    @property
    def departures(self) -> dict:
        """The fields of `DEPARTURE_LABELS` whose values depart from the preset's (RunConfig's defaults without one),
        with this run's values: what its default name carries (-rounds2-fraction0.05-bf16-mixed), its config.json
        records and its printed summary says; none for a table's full-protocol run. The aggregation of a method that
        averages no weights is moot (`benchmark.results.protocol`), never a departure."""
        fields = RunConfig.__dataclass_fields__
        base = {**{k: fields[k].default for k in DEPARTURE_LABELS}, **PRESETS.get(self.preset, {})}
        return {k: getattr(self, k) for k in DEPARTURE_LABELS if getattr(self, k) != base[k]
                and (k != "aggregation" or self.averages_weights)}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)
