"""FedAvg client: cross-entropy only (the base module as it is)."""
from lightning_modules.base import ClientModule


class FedAvgClient(ClientModule):
    pass
