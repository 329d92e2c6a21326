"""FedProto with parameter averaging, as in FPL's Table 2: CE + mu * MSE(z, global prototype of y).

The MSE to a class prototype is the same term as FPL's UPCR, against the plain
mean prototypes instead of the unbiased ones.
"""
from lightning_modules.base import ClientModule
from lightning_modules.losses import upcr_loss


class FedProtoClient(ClientModule):
    def extra_loss(self, x, y, logits, z):
        if "global_protos" not in self.payload:  # round 0
            return None
        return self.hp["mu"] * upcr_loss(z, y, self.payload["global_protos"])
