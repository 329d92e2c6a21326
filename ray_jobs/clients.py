"""A group of clients held by one process: their data shards as resident tensors, one module.

The same class runs in-process (`--executor local`) and as a Ray actor. Clients
of a group train one after another on one LightningModule whose weights are
reloaded from the round's global state for each client; what a client must keep
between rounds (MOON's previous model, FedDyn's correction) is stored per client
id here, never in the shared module. The group returns the sample-weighted sum
of its clients' weights, so weights leave an actor once per round, not once per
client.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from benchmark.data import load_domain, to_tensor_images
from benchmark.server import accumulate
from lightning_modules.base import NonFiniteLoss, fit_local


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def client_generator(seed: int, round_idx: int, client_id: int) -> torch.Generator:
    """The client's shuffling and augmentation stream for one round: same on any executor."""
    state = np.random.SeedSequence([seed, round_idx, client_id]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


class ClientGroup:
    def __init__(self, cfg: dict, clients: list[dict], data_root: str):
        from benchmark.methods import METHODS

        self.cfg = cfg
        self.device = resolve_device(cfg["device"])
        if self.device.type == "cpu":  # the actor's CPU share, in or out of Ray: same kernels, same numbers
            torch.set_num_threads(max(1, int(cfg["cpus_per_actor"])))
        self.clients = clients
        domains = sorted({c["domain"] for c in clients})
        raw = {d: load_domain(Path(data_root), cfg["dataset"], d, need_test=False) for d in domains}
        self.data = {}
        for c in clients:
            dom = raw[c["domain"]]
            idx = np.asarray(c["indices"])
            x = to_tensor_images(dom.train_x[idx]).to(self.device)
            y = torch.from_numpy(dom.train_y[idx]).to(self.device)
            self.data[c["id"]] = (x, y)
        method = METHODS[cfg["method"]]
        self.module = method.client(
            num_classes=10, lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=cfg["weight_decay"], **cfg["hparams"]
        ).to(self.device)
        self.client_states: dict[int, object] = {}

    def train(self, global_state: dict, payload: dict, round_idx: int) -> dict:
        """Train every client of the group from the global state; return partial sums and prototypes."""
        cfg = self.cfg
        weight_sum, total, protos, losses = None, 0, {}, {}
        start = time.perf_counter()
        for c in self.clients:
            cid = c["id"]
            x, y = self.data[cid]
            self.module.net.load_state_dict(global_state)
            self.module.load_client_state(self.client_states.get(cid))
            self.module.start_round(round_idx, payload, global_state)
            gen = client_generator(cfg["seed"], round_idx, cid)
            try:
                losses[cid] = fit_local(self.module, x, y, cfg["local_epochs"], cfg["batch_size"], gen)
            except NonFiniteLoss:
                raise NonFiniteLoss(
                    f"non-finite loss in round {round_idx}, client {cid} ({c['domain']}); "
                    "its weights were discarded and the run stopped. Lower the learning rate or raise tau."
                ) from None
            self.client_states[cid] = self.module.client_state()
            weight_sum = accumulate(weight_sum, self.module.net.state_dict(), len(y))
            total += len(y)
            protos[cid] = self.module.local_prototypes()
        return {"sum": {k: v.cpu() for k, v in weight_sum.items()}, "weight": total, "protos": protos, "losses": losses,
                "train_s": time.perf_counter() - start}
