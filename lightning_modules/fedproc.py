"""FedProc client (Mu et al. 2023): a * L_con + (1 - a) * CE, a = 1 - r / (R - 1).

L_con is a cosine InfoNCE with temperature 1 between the feature and the global
(mean) prototypes of all classes, the sample's own class the positive. Round 0
has no prototypes: CE alone (the official code trains nothing there).
"""
import torch
import torch.nn.functional as F

from lightning_modules.base import ClientModule


class FedProcClient(ClientModule):
    def compute_loss(self, x, y, logits, z):
        ce = F.cross_entropy(logits, y)
        if "global_protos" not in self.payload:
            return ce
        a = self.payload["weight_a"]
        return a * prototype_infonce(z, y, self.payload["global_protos"], self.hp["temperature"]) + (1 - a) * ce


def prototype_infonce(z, y, global_protos, temperature):
    """Batch mean of CE over cos(z, G_k) / T for the classes with a prototype (NaN rows are absent);
    a sample whose class has no prototype contributes 0."""
    held = ~torch.isnan(global_protos).any(dim=1)
    classes = torch.nonzero(held).flatten()
    logits = F.normalize(z, dim=1) @ F.normalize(global_protos[classes], dim=1).T / temperature
    target_of_class = torch.full((len(global_protos),), -100, dtype=torch.long, device=z.device)
    target_of_class[classes] = torch.arange(len(classes), device=z.device)
    per_sample = F.cross_entropy(logits, target_of_class[y], ignore_index=-100, reduction="none")
    return per_sample.sum() / len(y)
