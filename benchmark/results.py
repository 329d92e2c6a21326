"""Run records: config.json, metrics.jsonl, summary.json (written atomically) and the W&B run; a complete run's
metrics.jsonl also gzipped (metrics.jsonl.gz), the form the repository commits."""
from __future__ import annotations

import gzip
import io
import json
import os
from contextlib import suppress
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from benchmark import communication

LAST_K = 5  # the paper's metric: mean accuracy over the last 5 rounds
MODEL_FILE = "model.pt"  # the final global model of a complete run
# under per-client test samples (FedProto's protocol): every client's test features with the model it ends the run
# with, and the last round's local and global prototypes (FedProto's Figure 2, `benchmark.figures.plot_tsne`)
FEATURES_FILE = "features.npz"
# a complete run's metrics.jsonl gzipped (`pack_metrics`): what a repository commits of its rounds (a tenth of the
# size; the GPU machine receives the checkout, tracked files and all, 64 MiB a call), and what `read_jsonl` reads
# where the plain file is absent (a fresh clone). The plain file is the running log.
METRICS_ARCHIVE = "metrics.jsonl.gz"
TEMP_FILES = ".*.tmp*"  # (a glob) the temp files of `atomic_write`, `.<name>.tmp<pid>`


class WriteError(RuntimeError):
    """A file could not be written (a full disk, a file-size limit, ...); the message names it and what to do."""


def atomic_write(path: Path, *content: str | bytes | memoryview) -> None:
    """The one way a file of a run is written: `content` (text, or bytes, in parts) to a temp file beside `path`,
    fsynced, then renamed over `path`. When the write fails the temp file is removed, so `path` and its folder are
    left as they were, and the failure (OSError: no space left, file too large, ...) is raised as WriteError naming
    `path`. A file another library makes (torch.save, np.savez_compressed, savefig) is made in memory first
    (`in_memory`), so that this write is the only one that touches the disk."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w" if isinstance(content[0], str) else "wb") as f:
            for part in content:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise WriteError(f"cannot write {path} ({e.strerror or e}); free space on its disk (or lift the "
                             "file-size limit, `ulimit -f`), or write elsewhere (a run: --out; a sweep: "
                             "--results-dir).") from None
        raise


def in_memory(save) -> memoryview:
    """The bytes `save(file)` writes to a file object (`lambda f: torch.save(state, f)`), for `atomic_write`."""
    buf = io.BytesIO()
    save(buf)
    return buf.getbuffer()


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file; of `path`.gz where `path` is absent (a committed run's metrics.jsonl)."""
    path = Path(path)
    packed = path.with_name(path.name + ".gz")
    text = gzip.decompress(packed.read_bytes()).decode() if not path.exists() and packed.exists() else path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def computed_metrics(run_dir: Path) -> list[tuple]:
    """What a run's metrics.jsonl says it computed, round by round (round, accuracy, client and train losses), without
    its timings: equal for a run interrupted and resumed and the same run undisturbed (docs/reliability.md)."""
    return [(r["round"], r["accuracy"], r["client_loss"], r["train_loss"])
            for r in read_jsonl(run_dir / "metrics.jsonl")]


def computed_summary(run_dir: Path) -> dict:
    """A run's summary.json without how long it took, when it finished and its processes' peak memory."""
    s = json.loads((run_dir / "summary.json").read_text())
    for key in ("wall_time_s", "finished_utc", "peak_memory"):
        s.pop(key)
    return s


def pack_metrics(run_dir: Path, dest: Path | None = None) -> None:
    """metrics.jsonl.gz (METRICS_ARCHIVE) from the run folder's metrics.jsonl, written atomically into `dest` (default:
    the run folder); no timestamp in the gzip header, so one record always packs to the same bytes."""
    run_dir = Path(run_dir)
    atomic_write(Path(dest or run_dir) / METRICS_ARCHIVE,
                 gzip.compress((run_dir / "metrics.jsonl").read_bytes(), compresslevel=9, mtime=0))


def summarize(cfg: dict, clients: list[dict], rounds: list[dict]) -> dict:
    """summary.json from the per-round records: final accuracies and the last-5-round mean (the schedule evaluates
    the last `eval_last` rounds always, `RunConfig.evaluates`: LAST_K, or 1 when a table reads the final round
    only, and then last5 is None)."""
    keep = cfg.get("eval_last", LAST_K)
    missing = [r["round"] for r in rounds[-keep:] if "accuracy" not in r]
    if missing:
        raise ValueError(f"rounds {missing} of the last {keep} were not evaluated; "
                         "the final (and last-5) metrics need them.")
    last = rounds[-LAST_K:]
    domains = list(rounds[-1]["accuracy"])
    last5 = ({d: float(np.mean([r["accuracy"][d] for r in last])) for d in domains}
             if all("accuracy" in r for r in last) else None)
    return {
        "method": cfg["method"],
        "dataset": cfg["dataset"],
        "split": cfg["split"],
        "domains": cfg["domains"],
        "dropped_domains": cfg["dropped_domains"],
        "seed": cfg["seed"],
        "rounds": len(rounds),
        "hparams": cfg["hparams"],
        "clients": clients,  # id, domain, num_samples (and classes under an n-way k-shot split)
        "final": dict(rounds[-1]["accuracy"]),
        "last5": last5,
        "evaluated_rounds": sum("accuracy" in r for r in rounds),
        "finished_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_time_s": float(sum(r["time_s"]["round"] for r in rounds)),
        "communication": communication.run_total(rounds),
        "protocol": protocol(cfg),
        "complete": True,
    }


PROTOCOL_KEYS = ("method", "dataset", "split", "domains", "seed", "rounds", "local_epochs", "batch_size", "lr",
                 "momentum", "weight_decay", "drop_last", "aggregation", "client_init", "hparams", "client_fraction",
                 "eval_max", "precision", "dirichlet_alpha", "dirichlet_seed", "data_split", "participation",
                 "erasing")
# keys added since runs were first recorded: a run folder without one ran with its value here (data_split None: the
# archives' own train and test sets, as digit5 had them until 2026-11-24; participation 1: every client every round;
# dirichlet_seed None: a label-skew run drew its class counts with its own seed, until 2026-11-27: see `protocol`;
# erasing False: training batches were not erased, until 2026-11-29)
LATER_KEYS = {"aggregation": "samples", "client_init": "shared", "dirichlet_alpha": None, "data_split": None,
              "participation": 1.0, "dirichlet_seed": None, "erasing": False}
# method hyperparameters added since runs were recorded, and the value a run recorded without one ran with: FPL's
# (and its variants') `lambda`, its weight on CPCL + UPCR, whose loss had no weight before (1); FedPLVM's `dp_budget`
# (2026-11-26), whose DP-SGD spent its budget over the whole run before ("run"); FedAPC's `prototypes` (2026-11-28),
# a pass after local training before ("after"); FedOpt's `step_from` (2026-11-29), whose step started from the global
# model before ("global", Reddi et al.'s); FedDyn's `max_grad_norm` (2026-11-29), no clipping before (None), and its
# `momentum` (2026-11-29), the protocol's before (None)
LATER_HPARAMS = {"lambda": 1.0, "dp_budget": "run", "prototypes": "after", "step_from": "global",
                 "max_grad_norm": None, "momentum": None}


def protocol(cfg) -> dict:
    """What makes two runs the same experiment (from a RunConfig or its dict). A RunConfig whose method averages no
    weights (`averages_weights` false: FedProto as published, Local, FedPCL) has no `aggregation` (None): how weights
    would be averaged is no part of its experiment, so its recorded runs compare whatever they recorded for it
    (`without_moot`)."""
    d = cfg if isinstance(cfg, dict) else cfg.to_dict()
    p = {k: d[k] if k in d or k not in LATER_KEYS else LATER_KEYS[k] for k in PROTOCOL_KEYS}
    if p["dirichlet_seed"] is None:  # recorded before the key: a label-skew run drew with its own seed, others none
        p["dirichlet_seed"] = 0 if p["dirichlet_alpha"] is None else p["seed"]
    if not isinstance(cfg, dict) and not cfg.averages_weights:
        p["aggregation"] = None
    return p


def without_moot(recorded: dict, expected: dict) -> dict:
    """A recorded protocol with its `aggregation` dropped (None) when the expected protocol's is None (a method that
    averages no weights, `protocol`); otherwise `recorded` as it is."""
    if "aggregation" in expected and expected["aggregation"] is None:
        return {**recorded, "aggregation": None}
    return recorded


def with_later_hparams(recorded: dict, expected: dict) -> dict:
    """A recorded protocol (a summary's or a checkpoint's) whose hparams lack a LATER_HPARAMS key that the expected
    protocol's have, with that key at the value it ran with; otherwise `recorded` as it is. Only keys the expected
    method takes are filled: a method that has always recorded the key (FedPLVM's lambda) is never filled."""
    hp, want = recorded.get("hparams"), expected.get("hparams")
    if not isinstance(hp, dict) or not isinstance(want, dict):
        return recorded
    missing = {k: v for k, v in LATER_HPARAMS.items() if k in want and k not in hp}
    return {**recorded, "hparams": {**hp, **missing}} if missing else recorded


def is_complete(run_dir: Path, expected: dict | None = None) -> bool:
    """A run is complete when its summary.json says so and, given `expected`, ran that protocol."""
    try:
        s = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    if not s.get("complete") or expected is None:
        return bool(s.get("complete"))
    # a summary written before a protocol key (or a method's hyperparameter) existed ran with its value in LATER_KEYS
    # (LATER_HPARAMS)
    try:
        want = json.loads(json.dumps(protocol(expected)))
        return protocol(without_moot(with_later_hparams(s["protocol"], want), want)) == want
    except (KeyError, TypeError):  # no protocol, or one without a key it needs: not this run
        return False


def run_complete(cfg) -> bool:
    """A planned run (a RunConfig) is in its folder, complete and with its protocol."""
    return is_complete(Path(cfg.out), protocol(cfg))


def wandb_mode() -> str:
    """WANDB_MODE when set; otherwise online with an API key, offline without one."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    netrc = Path.home() / ".netrc"
    has_key = bool(os.environ.get("WANDB_API_KEY")) or (netrc.is_file() and "api.wandb.ai" in netrc.read_text())
    return "online" if has_key else "offline"


TAG_KEYS = ("method", "dataset", "split", "seed")


def wandb_config(cfg: dict) -> dict:
    """The W&B run config: the run's configuration with the method's hyperparameters as top-level keys."""
    return {**{k: v for k, v in cfg.items() if k != "hparams"}, **cfg["hparams"]}


def wandb_tags(cfg: dict) -> list[str]:
    """`key:value` tags for method, dataset, split, seed and each method hyperparameter (W&B filters on tags)."""
    return [f"{k}:{cfg[k]}" for k in TAG_KEYS] + [f"{k}:{v}" for k, v in cfg["hparams"].items()]


def wandb_memory(peak_memory: dict | None) -> dict:
    """The W&B summary's memory figures (MiB) from summary.json's `peak_memory`: the driver's peak resident set,
    the largest of the client actors', and on CUDA the largest peak allocation of any process."""
    if not peak_memory:
        return {}
    procs = [peak_memory["driver"], *peak_memory["actors"]]
    cuda = [p["cuda_peak_allocated_mib"] for p in procs if p["cuda_peak_allocated_mib"] is not None]
    return {"peak_memory/driver_rss_mib": peak_memory["driver"]["peak_rss_mib"],
            "peak_memory/actor_rss_mib": max(p["peak_rss_mib"] for p in peak_memory["actors"]),
            **({"peak_memory/cuda_allocated_mib": max(cuda)} if cuda else {})}


class Recorder:
    """Writes one run's folder and W&B run. Until `finish`, the folder holds no summary.json,
    so an interrupted or failed run never claims to be complete."""

    def __init__(self, out_dir: Path, cfg: dict, clients: list[dict], test_sizes: dict[str, int],
                 rounds: list[dict] | None = None):
        """`rounds`: the records of the rounds a resumed run already has (its checkpoint's); metrics.jsonl is
        rewritten to exactly those and the new W&B run gets them again, so it holds the whole run."""
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        for stale in ("summary.json", "error.txt", MODEL_FILE, FEATURES_FILE, METRICS_ARCHIVE):
            (self.out / stale).unlink(missing_ok=True)
        self.cfg, self.clients, self.rounds = cfg, clients, []
        atomic_write(self.out / "config.json",
                     json.dumps({**cfg, "clients": clients, "test_sizes": test_sizes}, indent=2))
        atomic_write(self.out / "metrics.jsonl", "")
        self.wandb = None
        if wandb_mode() != "disabled":
            import wandb

            self.wandb = wandb.init(
                project=cfg["wandb_project"],
                group=cfg["wandb_group"] or f"{cfg['dataset']}",
                job_type="train",
                name=cfg["run_name"],
                config=wandb_config(cfg),
                tags=wandb_tags(cfg),
                mode=wandb_mode(),
                dir=str(self.out),
                reinit="create_new",
            )
        for record in rounds or []:
            self.log_round(record)

    def log_round(self, record: dict) -> None:
        self.rounds.append(record)
        atomic_write(self.out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in self.rounds))
        if self.wandb:
            acc = record.get("accuracy", {})  # none in a round the schedule does not evaluate
            self.wandb.log(
                {**{f"accuracy/{d}": v for d, v in acc.items()}, "train_loss": record["train_loss"],
                 **{f"time_s/{k}": v for k, v in record["time_s"].items()},
                 **{f"communication/{k}": v
                    for k, v in record.get("communication", {}).get("mean_per_client", {}).items()},
                 "round": record["round"]},
                step=record["round"],
            )

    def save_model(self, state: dict) -> None:
        """model.pt: the final global model's state_dict (float16), written atomically."""
        import torch

        atomic_write(self.out / MODEL_FILE, in_memory(lambda f: torch.save(state, f)))

    def save_features(self, arrays: dict) -> None:
        """features.npz (FEATURES_FILE): the final test features and prototypes (`Driver.final_features`), written
        atomically."""
        atomic_write(self.out / FEATURES_FILE, in_memory(lambda f: np.savez_compressed(f, **arrays)))

    def finish(self, images: dict[str, Path] | None = None, peak_memory: dict | None = None) -> dict:
        """summary.json (with the processes' `peak_memory` when given); the W&B run gets the tables, `images`
        ({name: PNG path}) and its summary (with `wandb_memory`'s figures)."""
        summary = summarize(self.cfg, self.clients, self.rounds) | ({"peak_memory": peak_memory} if peak_memory else {})
        if self.wandb:
            import wandb

            self.wandb.log({name: wandb.Image(str(path)) for name, path in (images or {}).items()})

            domains = list(self.rounds[-1]["accuracy"])
            per_round = wandb.Table(columns=["round", *domains],
                                    data=[[r["round"], *r["accuracy"].values()]
                                          for r in self.rounds if "accuracy" in r])
            final = wandb.Table(columns=["metric", *domains],
                                data=[["final", *summary["final"].values()]]
                                + ([["last5", *summary["last5"].values()]] if summary["last5"] else []))
            self.wandb.log({"accuracy_per_round": per_round, "final_accuracy": final})
            self.wandb.summary.update({**{f"last5/{d}": v for d, v in (summary["last5"] or {}).items()},
                                       **{f"final/{d}": v for d, v in summary["final"].items()},
                                       **{f"communication/{k}": v for k, v in
                                          summary["communication"].get("per_client_per_round", {}).items()},
                                       "communication/total_bytes": summary["communication"].get("total_bytes"),
                                       **wandb_memory(peak_memory), "wall_time_s": summary["wall_time_s"]})
            self.wandb.finish()
        pack_metrics(self.out)  # before summary.json: a folder with a summary holds its committed form
        atomic_write(self.out / "summary.json", json.dumps(summary, indent=2))
        return summary

    def fail(self, message: str) -> None:
        """error.txt says why the run stopped, where it can be written (the message is the entry point's error line
        too: a full disk that refuses error.txt loses nothing)."""
        with suppress(WriteError):
            atomic_write(self.out / "error.txt", message + "\n")
        if self.wandb:
            self.wandb.finish(exit_code=1)


def read_summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())
