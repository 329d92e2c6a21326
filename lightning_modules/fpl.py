"""FPL client (Huang et al., CVPR 2023): CE + mean over the batch of (CPCL + UPCR).

Round 0 has no prototypes and trains CE alone. The ablation switches of the
paper are hyperparameters: `cpcl`, `upcr` (Table 1), `upcr_target` unbiased |
global (Table 3) and `cpcl_protos` cluster | global (Fig. 5).
"""
import torch

from lightning_modules.base import ClientModule
from lightning_modules.losses import cpcl_loss, upcr_loss


class FPLClient(ClientModule):
    def extra_loss(self, x, y, logits, z):
        p = self.payload
        if "cluster_protos" not in p:  # round 0
            return None
        loss = torch.zeros((), device=z.device)
        if self.hp["cpcl"]:
            if self.hp["cpcl_protos"] == "cluster":
                protos, proto_labels = p["cluster_protos"], p["cluster_labels"]
            else:  # one global (mean) prototype per class
                held = ~torch.isnan(p["global_protos"]).any(dim=1)
                protos, proto_labels = p["global_protos"][held], torch.nonzero(held).flatten()
            loss = loss + cpcl_loss(z, y, protos, proto_labels, self.hp["tau"])
        if self.hp["upcr"]:
            target = p["unbiased_protos"] if self.hp["upcr_target"] == "unbiased" else p["global_protos"]
            loss = loss + upcr_loss(z, y, target)
        return loss
