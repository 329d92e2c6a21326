"""FedRep: a shared representation, a head per client, trained in turn. FedPer's rule on the server (`FedPerServer`:
only the body is averaged, each client keeps its own head).

Liam Collins, Hamed Hassani, Aryan Mokhtari, Sanjay Shakkottai. "Exploiting Shared Representations for
Personalized Federated Learning." ICML 2021, PMLR 139:2089-2099. Official code lgcollins/FedRep
(`models/Update.py` `LocalUpdate.train`, `main_fedrep.py`). FedProto's Table 1 baseline (PROTOCOL.md section 4).

Client (`FedRepClient`): CE, starting from the global body and its own head as FedPer's; each round it first trains
the head with the body frozen, then the body with the head frozen, by `requires_grad` (as the reference: frozen
parameters get no gradient, so SGD leaves them, their momentum and weight decay alone). The body trains during the
last `rep_epochs` epochs of the round's local training, the head in every step before them (the reference's
`head_eps = local_ep - local_rep_ep`), counted in steps so that a fraction of an epoch splits an epoch by its
batches. The reference's `local_rep_ep` is 1; with FedProto's 1 local epoch that leaves the head no step at all
(it would keep its initialisation until the reference's extra fine-tuning round), so our default is 0.5: the
first half of the epoch's batches train the head, the second half the body (docs/deviations.md, 41); of an odd
number of steps the head gets half rounded to the even count (Python's `round`: 5 steps 2, 7 steps 4).
"""
from __future__ import annotations

from lightning_modules.fedper import FedPerClient, is_head


class FedRepClient(FedPerClient):
    def start_round(self, round_idx, payload, global_state, client_state=None):
        super().start_round(round_idx, payload, global_state, client_state)
        self.net.requires_grad_(True)  # the fused engine stacks the parameters that require a gradient

    def on_local_step(self, step, epoch_steps, epochs):
        head_steps = max(0, round((epochs - self.hparams["rep_epochs"]) * epoch_steps))
        train_head = step < head_steps
        for name, p in self.net.named_parameters():
            p.requires_grad_(is_head(name, self.hparams["head"]) == train_head)
