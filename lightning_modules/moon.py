"""MOON client (Li et al., CVPR 2021): CE + mu * model-contrastive loss on the 512-d features.

The positive pair is (z, z_global), the negative (z, z_previous), cosine
similarity over temperature; the global and the client's previous local model
are frozen. The previous model is this client's state, kept in its actor
across rounds; in round 0 it is the client's starting model. The global model
is the same for every client of a round (`shared_state`: the fused engine keeps
one copy of it for all clients), the previous model is each client's own.
"""
import copy

import torch
import torch.nn.functional as F

from lightning_modules.base import ClientModule


class MOONClient(ClientModule):
    shared_state = ("global_net.",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._previous_state = None

    def start_round(self, round_idx, payload, global_state):
        super().start_round(round_idx, payload, global_state)
        if not hasattr(self, "global_net"):
            self.global_net = copy.deepcopy(self.net).requires_grad_(False)
            self.previous_net = copy.deepcopy(self.net).requires_grad_(False)
        self.global_net.load_state_dict(self.net.state_dict())
        self.previous_net.load_state_dict(self._previous_state or self.net.state_dict())
        self.global_net.eval()
        self.previous_net.eval()

    def train(self, mode: bool = True):
        # fit_local calls module.train(): the frozen models are submodules, keep them in eval mode
        super().train(mode)
        if hasattr(self, "global_net"):
            self.global_net.eval()
            self.previous_net.eval()
        return self

    def client_state(self):
        return {k: v.detach().clone() for k, v in self.net.state_dict().items()}

    def load_client_state(self, state):
        self._previous_state = state

    def extra_loss(self, x, y, logits, z):
        with torch.no_grad():
            z_glob = self.global_net.features(x)
            z_prev = self.previous_net.features(x)
        return self.hp["mu"] * moon_loss(z, z_glob, z_prev, self.hp["temperature"])


def moon_loss(z, z_glob, z_prev, temperature):
    """Batch mean of -log( e^{cos(z,zg)/T} / (e^{cos(z,zg)/T} + e^{cos(z,zp)/T}) )."""
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], dim=1)
    return F.cross_entropy(logits / temperature, torch.zeros(len(z), dtype=torch.long, device=z.device))
