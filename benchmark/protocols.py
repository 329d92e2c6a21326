"""The papers' protocols as data: what a dataset fixes (`DatasetSpec`: domains' clients, samples, model, input size,
transform), the client splits, and each paper's run protocol by name (`PRESETS`: rounds, local epochs, batch,
optimiser, how weights are averaged and where clients start).

A protocol is data, never a code path: `ray_jobs.config.RunConfig.from_preset("fedplvm-digit5", seed=1)` is that
protocol, any field given beside the preset overriding it; tests and smoke profiles change only its numbers.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

import numpy as np

from benchmark.data import DATASETS, IMAGE_SIZE
from benchmark.fewshot import SHOTS
from benchmark.transforms import Transform

# how a protocol averages the clients' weights (rules that weight by sample count: FedAvg and those built on it):
# by sample count (FPL's RethinkFL code) or each client alike (FedPLVM's `average_weights`)
AGGREGATIONS = ("samples", "uniform")
# where clients start round 0: one initialisation for all (FPL's code) or each its own, seeded from (seed, client
# id) (FedPLVM's main.py builds one model per client; they meet at the first average)
CLIENT_INITS = ("shared", "own")
PRECISIONS = ("32-true", "bf16-mixed")  # Lightning's precision names (lightning_modules.base.precision_context)
# --precision auto: one of PRECISIONS picked for the machine (`ray_jobs.config.auto_precision`); a run records the pick
AUTO_PRECISION = "auto"

# FedProto's n-way k-shot splits of MNIST (PROTOCOL.md section 4, benchmark.fewshot): name -> (mean n, stdev of n,
# mean k). Table 1: n = 3, 4, 5 with stdev 2, k = 100; Table 2's second rows: stdev 3 (-s3); Figure 3: n = 3 (stdev 2)
# with k samples per class, FEDPROTO_FIGURE3_SHOTS (-k<k>; k = 100 is Table 1's 3way). The figure is an image whose axis
# values the text does not give: these are our choice (docs/fedproto.md)
FEDPROTO_FIGURE3_SHOTS = (10, 20, 40, 60, 80, SHOTS)
FEDPROTO_SPLITS: dict[str, tuple[int, int, int]] = {
    **{f"{n}way{s}": (n, sd, SHOTS) for n in (3, 4, 5) for s, sd in (("", 2), ("-s3", 3))},
    **{f"3way-k{k}": (3, 2, k) for k in FEDPROTO_FIGURE3_SHOTS if k != SHOTS},
}

# Client splits per dataset (clients per domain, in domain order). PROTOCOL.md sections 1 and 3.
SPLITS: dict[str, dict[str, dict[str, int]]] = {
    "digits": {
        "code": {"mnist": 6, "usps": 4, "svhn": 3, "syn": 7},  # RethinkFL's code: the paper's numbers
        "paper": {"mnist": 3, "usps": 7, "svhn": 6, "syn": 4},  # the paper's text
        "fedapc": {"mnist": 2, "usps": 1, "svhn": 2, "syn": 3},  # FedAPC's 8 clients
    },
    "office_caltech": {
        "default": {"caltech": 3, "amazon": 2, "webcam": 1, "dslr": 4},
        "fedapc": {"caltech": 3, "amazon": 2, "webcam": 2, "dslr": 1},  # FedAPC's 8 clients
    },
    # FedPLVM: one client per domain; its Table 10: 10 clients, unbalanced (each the next 10 images of each class)
    "digit5": {"default": {d: 1 for d in DATASETS["digit5"]},
               "unbalanced": {"mnist": 1, "svhn": 4, "usps": 2, "syn": 2, "mnistm": 1}},
    # FedProto: 20 MNIST clients, n-way k-shot (FEDPROTO_SPLITS, DatasetSpec.ways)
    "mnist": {name: {"mnist": 20} for name in FEDPROTO_SPLITS},
    "office10": {"default": {d: 1 for d in DATASETS["office10"]}},
}
# FPL's Digits at scale (docs/scale.md): each domain's clients of the code split times 5 (100 clients) or 25 (500),
# each client's share of its domain divided by the same factor, so the run holds the same number of images; the
# presets scale-digits-100 and scale-digits-500 run them at --participation 0.1
SCALED_DIGITS = {"100clients": 5, "500clients": 25}
SPLITS["digits"] |= {name: {d: n * k for d, n in SPLITS["digits"]["code"].items()} for name, k in SCALED_DIGITS.items()}
DEFAULT_SPLIT = {"digits": "code", "office_caltech": "default", "digit5": "default", "office10": "default",
                 "mnist": "3way"}
RANDOM_SPLIT = "random"  # the split drawn from the seed, as RethinkFL's --rand_dataset does (`reference_random_split`)


@dataclass(frozen=True)
class DatasetSpec:
    """What a dataset's protocol fixes besides its domains and splits: classes, model, input size,
    transform, and how clients get their samples: a share `client_pct` of their domain's training set
    drawn at random (FPL), or, with `per_class` = (k_train, k_test), the first k_train samples of each
    class to train and the first k_test of each class of the test set to test (FedPLVM)."""

    num_classes: int
    model: str  # a name in benchmark.models.MODELS
    image_size: int  # images are resized to image_size x image_size at load time
    transform: Transform = Transform()  # FPL's: crop + flip, ImageNet normalisation
    client_pct: float | None = None
    per_class: tuple[int, int] | None = None
    channels: int = 3  # image channels the model takes: grey images are repeated to 3, or kept as 1
    # FedProto's n-way k-shot split (benchmark.fewshot): split name -> (mean n, stdev of n, mean k); each client gets
    # its own test samples (40 of each of its classes) and is evaluated on them in its client group
    ways: dict[str, tuple[int, int, int]] | None = None
    # FedPLVM's Dirichlet label skew (`RunConfig.dirichlet_alpha`, `benchmark.partition.LabelSkew`): how a drawn
    # share becomes a count: its code rounds Digit-5's up (np.ceil) and truncates Office-10's (astype(int))
    skew_rounding: str = "ceil"


DATASET_SPECS: dict[str, DatasetSpec] = {
    "digits": DatasetSpec(num_classes=10, model="resnet10", image_size=IMAGE_SIZE, client_pct=0.01),
    "office_caltech": DatasetSpec(num_classes=10, model="resnet10", image_size=IMAGE_SIZE, client_pct=0.2),
    # FedPLVM (its utils/data_util.py): Resize(64), no augmentation; Digit-5 normalised with mean = std = 0.5,
    # Office-10 not normalised (ToTensor only)
    "digit5": DatasetSpec(num_classes=10, model="resnet10_plvm", image_size=64, per_class=(10, 100),
                          transform=Transform(mean=(0.5,) * 3, std=(0.5,) * 3, augment=False)),
    "office10": DatasetSpec(num_classes=10, model="resnet10_plvm", image_size=64, per_class=(10, 100),
                            transform=Transform(mean=(0.0,) * 3, std=(1.0,) * 3, augment=False), skew_rounding="floor"),
    # FedProto (its lib/utils.py): MNIST 1 x 28 x 28, ToTensor + Normalize((0.1307,), (0.3081,)), no augmentation
    "mnist": DatasetSpec(num_classes=10, model="cnn_mnist", image_size=28, channels=1, ways=FEDPROTO_SPLITS,
                         transform=Transform(mean=(0.1307,), std=(0.3081,), augment=False)),
}


def splits_of(dataset: str) -> list[str]:
    """The client splits a dataset takes: its layouts (SPLITS), the first its default, and "random" (RethinkFL's
    --rand_dataset) except under an n-way k-shot protocol."""
    return [*SPLITS[dataset]] + ([] if DATASET_SPECS[dataset].ways else [RANDOM_SPLIT])


def client_share(dataset: str, split: str, spec: DatasetSpec) -> float | None:
    """Each client's share of its domain's training set under a share protocol (FPL's): the dataset's `client_pct`,
    divided by the split's scale factor (`SCALED_DIGITS`)."""
    if spec.client_pct is None:
        return None
    return spec.client_pct / (SCALED_DIGITS.get(split, 1) if dataset == "digits" else 1)


# A paper's run protocol by name: RunConfig field values (the dataset's own protocol is its DatasetSpec).
_FPL = dict(rounds=100, local_epochs=10, batch_size=64, lr=0.01, momentum=0.9, weight_decay=1e-5)
_FEDPLVM = dict(local_epochs=2, batch_size=32, lr=0.01, momentum=0.5, weight_decay=1e-5, drop_last=True,
                aggregation="uniform", client_init="own")
# FedAPC states its 8-client split, batch 32, lr 0.01 and 100 rounds; momentum, weight decay and local epochs
# are RethinkFL's, whose data protocol it uses (docs/fedapc.md)
_FEDAPC = dict(split="fedapc", rounds=100, local_epochs=10, batch_size=32, lr=0.01, momentum=0.9, weight_decay=1e-5)
PRESETS: dict[str, dict] = {
    "fpl-digits": dict(dataset="digits", **_FPL),  # FPL (CVPR 2023), PROTOCOL.md section 1
    "fpl-office": dict(dataset="office_caltech", **_FPL),
    "fedplvm-digit5": dict(dataset="digit5", rounds=50, **_FEDPLVM),  # FedPLVM (NeurIPS 2024), section 2
    "fedplvm-office10": dict(dataset="office10", rounds=80, **_FEDPLVM),
    # FedPLVM's Tables 7 and 8 (appendix D): its label skew, Dirichlet alpha 0.5 (Office-10: 1.0, the concentration
    # whose test sets the paper's Table 8 means are multiples of: docs/deviations.md, 32), under which its code
    # averages the weights by sample count (`average_weights_noniid`)
    "fedplvm-digit5-skew": dict(dataset="digit5", rounds=50, **{**_FEDPLVM, "aggregation": "samples"},
                                dirichlet_alpha=0.5),
    "fedplvm-office10-skew": dict(dataset="office10", rounds=80, **{**_FEDPLVM, "aggregation": "samples"},
                                  dirichlet_alpha=1.0),
    # FedProto (AAAI 2022), section 4: SGD lr 0.01 momentum 0.5 (no weight decay), batch 4 with the
    # DataLoader's drop_last, 1 local epoch, 100 rounds; weights averaged unweighted, as its code's helpers
    # (`average_weights`, `average_weights_per`, `average_weights_sem` in its lib/utils.py); a preset per split of
    # FEDPROTO_SPLITS: fedproto-mnist-n3 (split 3way), -n3-s3 (3way-s3), -n3-k10 (3way-k10), ...
    **{f"fedproto-mnist-n{name.replace('way', '')}": dict(dataset="mnist", split=name, rounds=100, local_epochs=1,
                                                         batch_size=4, lr=0.01, momentum=0.5, weight_decay=0.0,
                                                         drop_last=True, aggregation="uniform")
       for name in FEDPROTO_SPLITS},
    # FPL's protocol with 100 or 500 Digits clients, a tenth of them drawn each round (docs/scale.md)
    **{f"scale-digits-{name[:-7]}": dict(dataset="digits", split=name, participation=0.1, **_FPL)
       for name in SCALED_DIGITS},
    "fedapc-digits": dict(dataset="digits", **_FEDAPC),  # FedAPC (2025), section 3
    "fedapc-office": dict(dataset="office_caltech", **_FEDAPC),
}

# Method hyperparameters a protocol sets over the method's defaults: preset -> method -> hparams. FedOpt's default
# step is RethinkFL's (from the clients' mean: FPL's protocol, also the protocol of a run without a preset); the other
# papers' protocols take Reddi et al.'s (from the global model) (docs/deviations.md, 10). FedProto's protocol: FedPer
# and FedRep share the convolutional body only (its code's `average_weights_per` averages the keys not starting with
# `fc`; its paper's 106k parameters a round are 20 x the CNN's 5,280 convolution weights), FeSEM keeps 2 centres (its
# code's `average_weights_sem`) (docs/deviations.md, 40-42)
FEDPROTO_HPARAMS = {"fedper": {"head": "fc"}, "fedrep": {"head": "fc"}, "fesem": {"clusters": 2}}
PRESET_HPARAMS: dict[str, dict[str, dict]] = {
    p: {"fedopt": {"step_from": "global"}, **(FEDPROTO_HPARAMS if p.startswith("fedproto-") else {})}
    for p in PRESETS if p.startswith(("fedplvm-", "fedproto-", "fedapc-"))
}


def reference_random_split(dataset: str, seed: int, max_per_domain: int = 10) -> dict[str, int]:
    """Clients per domain drawn from the seed as RethinkFL's `utils/training.py` does with `--rand_dataset`.

    There, after `np.random.seed(seed)` and before any other draw from numpy's
    global stream, every client's domain is `np.random.choice(domains)`, redrawn
    whole while a domain gets more than 10 clients: Digits draws all 20 clients;
    Office-Caltech draws 6 and adds one client of each domain. Seed 0 gives the
    `code` / `default` presets.
    """
    domains = list(DATASETS[dataset])
    total = sum(SPLITS[dataset][DEFAULT_SPLIT[dataset]].values())
    each = 0 if dataset == "digits" else 1  # Office: one client of every domain on top of the draw
    rng = np.random.RandomState(seed)  # numpy's legacy stream, as np.random.seed(seed) sets it
    while True:
        counts = np.bincount(rng.choice(len(domains), size=total - each * len(domains)), minlength=len(domains)) + each
        if counts.max() <= max_per_domain:
            return dict(zip(domains, counts.tolist()))


class ConfigError(ValueError):
    """A configuration value is unknown or impossible."""


def unknown_name(kind: str, names, choices, where: str = "") -> str:
    """The one line for a name (or a list of names, `kind(s)`) that is not among `choices`: each with the nearest
    choices, if any, then every choice: "unknown method 'fedavgg' (did you mean fedavg?); choose one of: ...",
    "unknown dataset 'office' (did you mean office_caltech, office10?); ...". `where` follows the names (" for
    digits")."""
    choices = [str(c) for c in choices]

    def nearest(name: str) -> list[str]:  # at most 3, whatever the case: those that start with it or hold it
        lower = {c.lower(): c for c in choices}  # (office: office_caltech), difflib's closest (a typo), those it
        typed = name.lower()  # holds (table2: 2); none for an empty name
        found = [*(c for c in lower if c.startswith(typed)), *(c for c in lower if typed in c),
                 *difflib.get_close_matches(typed, lower, n=3, cutoff=0.75), *(c for c in lower if c in typed)]
        return [lower[c] for c in dict.fromkeys(found)][:3] if typed else []

    def shown(name) -> str:
        near = nearest(str(name))
        return f"{name!r}" + (f" (did you mean {', '.join(near)}?)" if near else "")

    many = isinstance(names, (list, tuple))
    listed = ", ".join(map(shown, names)) if many else shown(names)
    return (f"unknown {kind}{'(s)' if many else ''} {listed}{where}; "
            + (f"choose one of: {', '.join(choices)}." if choices else f"there is no {kind} to choose."))
