"""Local: every client trains its own model on its own data, nothing is communicated (FedProto's
Table 1 baseline). Client: CE only (`FedAvgClient`); server: no weights, no payload."""
from __future__ import annotations

from lightning_modules.server import LocalModelsRule


class LocalServer(LocalModelsRule):
    def payload(self, client_protos, round_idx):
        return None
