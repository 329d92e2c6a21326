"""FeSEM: multi-center federated learning. The server keeps K centre models; each round every client is assigned
to its nearest centre by the L2 distance of its weights (E-step), each centre becomes the mean of its clients
(M-step; weighted by the protocol's `aggregation`: by sample count, or each client alike under FedProto's), and
each client trains its next round from its centre.

Ming Xie, Guodong Long, Tao Shen, Tianyi Zhou, Xianzhi Wang, Jing Jiang, Chengqi Zhang. "Multi-center Federated
Learning." arXiv:2005.01026, 2020 (FeSEM: federated stochastic expectation maximisation). Official TensorFlow
code mingxuts/multi-center-fed-learning (`models/fedsem.py`; read in its fork
xxyen/age-based-multi-center-fed-learning). FedProto's Table 1 baseline (PROTOCOL.md section 4).

Client: CE, as FedAvg's (`FedAvgClient`), from its centre. Server (`FeSEMServer`, a per-client rule): one E-step
and one M-step per round on the clients' trained weights. Round 0 starts every client from the one
initialisation (the reference copies one initialisation into every centre); the centres then start from the
first K clients' trained weights, as the reference's k-means starts from its first K points. A centre no client
is nearest keeps its weights. `distance=weights` (default) compares every parameter, the paper's distance
between models; `classifier` only the classifier's weight matrix, as the reference compares only its last dense
layer's kernel. K (`clusters`) 4, the reference's config; 2 under FedProto's protocol (`PRESET_HPARAMS`: its
code's `average_weights_sem` keeps 2 groups, which it forms by the clients' number of classes instead: not followed,
docs/deviations.md, 42). Under partial participation (`--participation`) only
the round's trained clients are assigned and averaged into their centres (a centre none of them is nearest keeps
its weights); a client not drawn keeps its last assignment and starts its next round from that centre as it is
then (before it is first drawn: the one initialisation). Each client is tested with its centre. The reference's
quirks we do not copy (docs/deviations.md, 42): its first assignment clusters random points instead of the
clients' weights, its re-clustering interval (`update-center-every`) can be longer than the run (no
re-assignment at all), a cluster of one client is skipped (that client does not train), and the accuracy it
reports is the maximum over the clusters.
"""
from __future__ import annotations

import torch

from lightning_modules.server import ServerRule, State, accumulate, cast_like


def nearest_centers(points: list[State], centers: list[State], keys: list[str]) -> list[int]:
    """Per point, the index of its nearest centre by the L2 distance over `keys` (ties: the lowest index)."""
    flat = lambda s: torch.cat([s[k].detach().to(torch.float64).flatten() for k in keys])  # noqa: E731
    x = torch.stack([flat(p) for p in points])
    d = torch.stack([((x - flat(c)) ** 2).sum(1) for c in centers], 1)  # n x K squared distances, a centre at a time
    return d.argmin(1).tolist()


class FeSEMServer(ServerRule):
    per_client = True
    personal_models = True
    state_attrs = ("centers", "assignment")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.centers: list[State] | None = None  # K state_dicts (None before the first round's end)
        self.assignment: dict[int, int] = {}  # client id -> its centre

    def compared_keys(self) -> list[str]:
        return self.param_keys if self.hparams["distance"] == "weights" else ["classifier.weight"]

    def aggregate(self, global_state, mean64, round_idx, share=1.0):
        raise TypeError("FeSEM is a per-client rule; the driver calls aggregate_clients.")

    def aggregate_clients(self, states, weights, round_idx):
        ids, k = sorted(states), self.hparams["clusters"]
        if self.centers is None:  # the first round's clients give the centres: at least K of them
            if k > len(ids):
                raise ValueError(f"FeSEM: {k} clusters for {len(ids)} clients trained in its first round; use "
                                 f"--hp clusters={len(ids)} or fewer (or a larger --participation).")
            self.centers = [states[i] for i in ids[:k]]
        assigned = dict(zip(ids, nearest_centers([states[i] for i in ids], self.centers, self.compared_keys())))
        self.assignment.update(assigned)
        for c in range(k):
            members = [i for i in ids if assigned[i] == c]
            if members:
                acc = None
                for i in members:
                    acc = accumulate(acc, states[i], weights[i])
                total = sum(weights[i] for i in members)
                self.centers[c] = cast_like({key: v / total for key, v in acc.items()}, states[members[0]])
        return {i: self.centers[c] for i, c in self.assignment.items()}

    def payload(self, client_protos, round_idx):
        return None
