"""Run records: config.json, metrics.jsonl, summary.json (written atomically) and the W&B run."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

LAST_K = 5  # the paper's metric: mean accuracy over the last 5 rounds


def atomic_write(path: Path, text: str) -> None:
    """Write a temp file beside `path`, fsync it, then rename over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def summarize(cfg: dict, clients: list[dict], rounds: list[dict]) -> dict:
    """summary.json from the per-round records: final accuracies and the last-5-round mean."""
    domains = list(rounds[-1]["accuracy"])
    last = rounds[-LAST_K:]
    return {
        "method": cfg["method"],
        "dataset": cfg["dataset"],
        "split": cfg["split"],
        "domains": cfg["domains"],
        "dropped_domains": cfg["dropped_domains"],
        "seed": cfg["seed"],
        "rounds": len(rounds),
        "hparams": cfg["hparams"],
        "clients": [{"id": c["id"], "domain": c["domain"], "num_samples": c["num_samples"]} for c in clients],
        "final": dict(rounds[-1]["accuracy"]),
        "last5": {d: float(np.mean([r["accuracy"][d] for r in last])) for d in domains},
        "wall_time_s": float(sum(r["time_s"]["round"] for r in rounds)),
        "protocol": protocol(cfg),
        "complete": True,
    }


PROTOCOL_KEYS = ("method", "dataset", "split", "domains", "seed", "rounds", "local_epochs", "batch_size", "lr",
                 "momentum", "weight_decay", "hparams", "client_fraction", "eval_max")


def protocol(cfg) -> dict:
    """What makes two runs the same experiment (from a RunConfig or its dict)."""
    d = cfg if isinstance(cfg, dict) else cfg.to_dict()
    return {k: d[k] for k in PROTOCOL_KEYS}


def is_complete(run_dir: Path, expected: dict | None = None) -> bool:
    """A run is complete when its summary.json says so and, given `expected`, ran that protocol."""
    try:
        s = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(s.get("complete")) and (expected is None or s.get("protocol") == json.loads(json.dumps(expected)))


def wandb_mode() -> str:
    """WANDB_MODE when set; otherwise online with an API key, offline without one."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    netrc = Path.home() / ".netrc"
    has_key = bool(os.environ.get("WANDB_API_KEY")) or (netrc.is_file() and "api.wandb.ai" in netrc.read_text())
    return "online" if has_key else "offline"


class Recorder:
    """Writes one run's folder and W&B run. Until `finish`, the folder holds no summary.json,
    so an interrupted or failed run never claims to be complete."""

    def __init__(self, out_dir: Path, cfg: dict, clients: list[dict], test_sizes: dict[str, int]):
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        for stale in ("summary.json", "error.txt"):
            (self.out / stale).unlink(missing_ok=True)
        self.cfg, self.clients, self.rounds = cfg, clients, []
        atomic_write(self.out / "config.json", json.dumps({**cfg, "clients": clients, "test_sizes": test_sizes}, indent=2))
        atomic_write(self.out / "metrics.jsonl", "")
        self.wandb = None
        if wandb_mode() != "disabled":
            import wandb

            self.wandb = wandb.init(
                project=cfg["wandb_project"],
                group=cfg["wandb_group"] or f"{cfg['dataset']}",
                name=cfg["run_name"],
                config=cfg,
                mode=wandb_mode(),
                dir=str(self.out),
                reinit="create_new",
            )

    def log_round(self, record: dict) -> None:
        self.rounds.append(record)
        atomic_write(self.out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in self.rounds))
        if self.wandb:
            acc = record["accuracy"]
            self.wandb.log(
                {**{f"accuracy/{d}": v for d, v in acc.items()}, "train_loss": record["train_loss"],
                 **{f"time_s/{k}": v for k, v in record["time_s"].items()}, "round": record["round"]},
                step=record["round"],
            )

    def finish(self) -> dict:
        summary = summarize(self.cfg, self.clients, self.rounds)
        if self.wandb:
            import wandb

            domains = list(self.rounds[-1]["accuracy"])
            per_round = wandb.Table(columns=["round", *domains], data=[[r["round"], *r["accuracy"].values()] for r in self.rounds])
            final = wandb.Table(columns=["metric", *domains],
                                data=[["final", *summary["final"].values()], ["last5", *summary["last5"].values()]])
            self.wandb.log({"accuracy_per_round": per_round, "final_accuracy": final})
            self.wandb.summary.update({f"last5/{d}": v for d, v in summary["last5"].items()})
            self.wandb.finish()
        atomic_write(self.out / "summary.json", json.dumps(summary, indent=2))
        return summary

    def fail(self, message: str) -> None:
        atomic_write(self.out / "error.txt", message + "\n")
        if self.wandb:
            self.wandb.finish(exit_code=1)


def read_summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())
