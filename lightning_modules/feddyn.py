"""FedDyn client (Acar et al., ICLR 2021).

Local objective: CE - <g_k, w> + (alpha / 2) ||w - w_global||^2, where g_k is the
client's gradient correction, kept in its actor across rounds (0 at first) and
updated after local training: g_k <- g_k - alpha (w_k - w_global). The correction
is held in buffers `correction_<i>` (one per parameter) so that the fused engine
gives every client its own.
"""
import torch

from lightning_modules.base import ClientModule


class FedDynClient(ClientModule):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._loaded_correction = None

    def corrections(self) -> list[torch.Tensor]:
        return [getattr(self, f"correction_{i}") for i in range(len(self.global_params))]

    def start_round(self, round_idx, payload, global_state):
        super().start_round(round_idx, payload, global_state)
        self.global_params = [p.detach().clone() for p in self.net.parameters()]
        for i, p in enumerate(self.global_params):
            g = self._loaded_correction[i] if self._loaded_correction is not None else torch.zeros_like(p)
            self.register_buffer(f"correction_{i}", g.detach().to(p).clone())

    def extra_loss(self, x, y, logits, z):
        params = list(self.net.parameters())
        linear = torch.stack([(g * p).sum() for g, p in zip(self.corrections(), params)]).sum()
        prox = torch.stack([(p - w).pow(2).sum() for p, w in zip(params, self.global_params)]).sum()
        return -linear + self.hp["alpha"] / 2 * prox

    def client_state(self):
        alpha = self.hp["alpha"]
        return [g - alpha * (p.detach() - w) for g, p, w in zip(self.corrections(), self.net.parameters(), self.global_params)]

    def load_client_state(self, state):
        self._loaded_correction = state
