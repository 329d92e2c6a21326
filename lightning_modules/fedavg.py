"""FedAvg: local cross-entropy, sample-weighted mean of the whole state_dicts.

H. Brendan McMahan, Eider Moore, Daniel Ramage, Seth Hampson, Blaise Agüera y Arcas.
"Communication-Efficient Learning of Deep Networks from Decentralized Data." AISTATS 2017,
PMLR 54:1273-1282.

`FedAvgServer` is also the server rule of the methods that change only the client
(FedProx, MOON) and the base of those that change one of its two steps (FedOpt and
FedDyn the aggregation, FedProto, FedProc and FPL the payload).
"""
from __future__ import annotations

from lightning_modules.base import ClientModule
from lightning_modules.server import ServerRule, cast_like


class FedAvgClient(ClientModule):
    """CE only: the base module as it is."""


class FedAvgServer(ServerRule):
    """The global model is the sample-weighted mean (BatchNorm buffers included); no payload (None)."""

    def aggregate(self, global_state, mean64, round_idx, share=1.0):
        return cast_like(mean64, global_state)

    def payload(self, client_protos, round_idx):
        return None
