"""FedDyn: dynamic regularisation, as in Acar et al.'s code (`train_FedDyn`, `train_feddyn_mdl`).

Durmus Alp Emre Acar, Yue Zhao, Ramon Matas Navarro, Matthew Mattina, Paul N. Whatmough,
Venkatesh Saligrama. "Federated Learning Based on Dynamic Regularization." ICLR 2021.

Client: each client k scales alpha by its data share: alpha_k = alpha / (n_k / N * K)
(K clients, N samples in all; `data_share` = n_k / mean n). Local objective, as coded
there: CE + alpha_k <w, h_k - w_sent> + ((alpha_k + weight decay) / 2) ||w||^2, the
quadratic term through SGD's weight decay; h_k, the client's state (0 at first),
accumulates w_k - w_sent after each round. This is the paper's
CE - <g_k, w> + (alpha_k / 2) ||w - w_sent||^2 with g_k = -alpha_k h_k, up to a constant.
SGD keeps the protocol's momentum (FPL's 0.9) and clips no gradient unless asked: Acar et al.'s
`momentum` 0 and `max_grad_norm` 10 are hyperparameters (docs/deviations.md, 9).
h_k is held in buffers `h_<i>` (one per parameter) and alpha_k in the buffer `alpha_k`, so
that the fused engine gives every client its own (clients of other sizes, hence other
alpha_k, train in one stack); configure_optimizers reads each client's weight decay from it.

Server: avg = the unweighted mean of the client models (`np.mean` over clients); the
model sent to the clients is avg + drift, drift = sum over rounds of (avg - the model
sent that round) = the mean over clients of their h_k. Under partial participation
(`--participation`) avg is the mean of the round's trained clients and drift stays the
mean of all N clients' h_k, as Acar et al.'s code (`cld_mdl_param = avg_mdl_param_sel +
np.mean(local_param_list)`): each round it moves by m / N times (avg - the model sent),
m of the N clients having trained; an undrawn client's h_k is left as it was. The model evaluated is avg
(`avg_model`), not the one sent. Parameters only; BatchNorm buffers take the mean in both.
Each round records the L2 norms (over the parameters, float64) of the evaluated model, of the
drift and of the model sent (`server_norms` in metrics.jsonl; tools/feddyn_norms.py reads them).
"""
from __future__ import annotations

import math

import torch

from lightning_modules.base import ClientModule
from lightning_modules.fedavg import FedAvgServer
from lightning_modules.server import State, cast_like


class FedDynClient(ClientModule):
    def initial_client_state(self, seed, client):
        return {"alpha": self.hparams["alpha"] / client["data_share"],
                "h": [torch.zeros_like(p) for p in self.net.parameters()]}

    def hs(self) -> list[torch.Tensor]:
        return [getattr(self, f"h_{i}") for i in range(len(self.sent))]

    def start_round(self, round_idx, payload, global_state, client_state=None):
        super().start_round(round_idx, payload, global_state, client_state)
        self.sent = [p.detach().clone() for p in self.net.parameters()]
        p = self.sent[0]
        self.register_buffer("alpha_k", torch.tensor(client_state["alpha"], dtype=p.dtype, device=p.device),
                             persistent=False)
        for i, (h, p) in enumerate(zip(client_state["h"], self.sent)):
            self.register_buffer(f"h_{i}", h.detach().to(p).clone(), persistent=False)

    def extra_loss(self, x, y, logits, z):
        params = self.net.parameters()
        return self.alpha_k * torch.stack([(p * (h - w)).sum() for p, h, w in zip(params, self.hs(), self.sent)]).sum()

    def configure_optimizers(self):
        momentum = self.momentum if self.hparams["momentum"] is None else self.hparams["momentum"]
        return torch.optim.SGD(self.net.parameters(), lr=self.lr, momentum=momentum,
                               weight_decay=self.weight_decay + float(self.alpha_k))

    def client_state(self):
        h = [h + p.detach() - w for h, p, w in zip(self.hs(), self.net.parameters(), self.sent)]
        return {"alpha": float(self.alpha_k), "h": h}


class FedDynServer(FedAvgServer):
    state_attrs = ("drift", "avg")

    @staticmethod
    def client_weight(hparams, num_samples):
        return 1.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.drift: State = {}
        self.avg: State | None = None

    def aggregate(self, global_state, mean64, round_idx, share=1.0):
        sent = dict(mean64)
        for k in self.param_keys:  # the mean of all N clients' h_k: m of them moved by (w_k - w_sent), m / N = share
            self.drift[k] = self.drift.get(k, 0.0) + share * (mean64[k] - global_state[k].to(torch.float64))
            sent[k] = mean64[k] + self.drift[k]
        self.avg = cast_like(mean64, global_state)
        return cast_like(sent, global_state)

    def evaluated_state(self, global_state):
        return global_state if self.avg is None else self.avg

    def round_record(self, global_state):  # after `aggregate`: avg and drift are this round's
        def norm(state):
            return math.sqrt(sum(float(state[k].double().pow(2).sum()) for k in self.param_keys))
        return {"server_norms": {"evaluated": norm(self.avg), "drift": norm(self.drift), "sent": norm(global_state)}}
