"""FedProx client (Li et al. 2020): CE + (mu / 2) * ||w - w_global||^2 over the parameters."""
import torch

from lightning_modules.base import ClientModule


class FedProxClient(ClientModule):
    def start_round(self, round_idx, payload, global_state):
        super().start_round(round_idx, payload, global_state)
        self.global_params = [p.detach().clone() for p in self.net.parameters()]

    def extra_loss(self, x, y, logits, z):
        sq = torch.stack([(p - g).pow(2).sum() for p, g in zip(self.net.parameters(), self.global_params)]).sum()
        return self.hp["mu"] / 2 * sq
