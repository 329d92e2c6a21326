"""The client-side interface: a LightningModule per method, and the local loop that runs it.

A method's client module subclasses `ClientModule` and overrides `extra_loss`
(and, when it needs per-round inputs or per-client state, `start_round`,
`client_state` / `load_client_state`). The module computes CE plus that term in
`training_step`, re-creates SGD in `configure_optimizers`, and gathers the
per-class feature means of the last local epoch as its local prototypes.

`fit_local` runs those hooks directly over batches of resident tensors: no
Trainer, checkpoint, logger, progress bar or model summary per client fit
(see `make bench` for what that saves against Lightning's Trainer).
"""
from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F

from benchmark.transforms import augment
from lightning_modules.resnet import ResNet10


class NonFiniteLoss(RuntimeError):
    """A client's local loss became NaN or infinite."""


class ClientModule(L.LightningModule):
    def __init__(self, num_classes: int = 10, lr: float = 0.01, momentum: float = 0.9, weight_decay: float = 1e-5, **hparams):
        super().__init__()
        self.num_classes = num_classes
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.hp = hparams
        self.net = ResNet10(num_classes)
        self.round = 0
        self.payload: dict = {}
        self._proto_sum: torch.Tensor | None = None
        self._proto_count: torch.Tensor | None = None

    # ------------------------------------------------------------------ per round
    def start_round(self, round_idx: int, payload: dict, global_state: dict) -> None:
        """Called after the global weights are loaded, before local training."""
        self.round = round_idx
        self.payload = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in payload.items()}

    def client_state(self):
        """State of this client that must survive to its next round (None: stateless)."""
        return None

    def load_client_state(self, state) -> None:
        pass

    # ------------------------------------------------------------------ training
    def forward(self, x: torch.Tensor):
        return self.net(x)

    def extra_loss(self, x, y, logits, features) -> torch.Tensor | None:
        """The method's term added to CE; None when there is none (FedAvg, or round 0)."""
        return None

    def compute_loss(self, x, y, logits, features) -> torch.Tensor:
        """CE plus the method's term; a method that re-weights CE overrides this."""
        ce = F.cross_entropy(logits, y)
        extra = self.extra_loss(x, y, logits, features)
        return ce if extra is None else ce + extra

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits, z = self.net(x)
        if self.gather_prototypes:
            self._proto_sum.index_add_(0, y, z.detach())
            self._proto_count += torch.bincount(y, minlength=self.num_classes)
        return self.compute_loss(x, y, logits, z)

    gather_prototypes = True  # the local loop turns it on for the last local epoch only

    def on_train_epoch_start(self) -> None:
        # reset each epoch: what remains after the last epoch are its class means
        self._proto_sum = torch.zeros(self.num_classes, self.net.feature_dim, device=self.device)
        self._proto_count = torch.zeros(self.num_classes, dtype=torch.long, device=self.device)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)

    def local_prototypes(self) -> dict[int, torch.Tensor]:
        """Class -> mean training-mode feature of that class over the last local epoch (CPU)."""
        sums, counts = self._proto_sum.cpu(), self._proto_count.cpu()
        return {int(k): sums[k] / counts[k] for k in torch.nonzero(counts).flatten()}


def batches(n: int, batch_size: int, generator: torch.Generator):
    """Shuffled index batches, the last one short (no drop_last)."""
    perm = torch.randperm(n, generator=generator)
    return perm.split(batch_size)


def fit_local(module: ClientModule, x: torch.Tensor, y: torch.Tensor, epochs: int, batch_size: int, generator: torch.Generator) -> float:
    """Train `module` on the resident uint8 images `x` and labels `y`; returns the mean loss.

    Raises NonFiniteLoss (checked once at the end, no per-step host sync) when any
    step's loss was NaN or infinite; the caller must then discard the weights.
    """
    optimizer = module.configure_optimizers()
    module.train()
    total = torch.zeros((), device=x.device)
    finite = torch.ones((), dtype=torch.bool, device=x.device)
    steps = 0
    for epoch in range(epochs):
        module.gather_prototypes = epoch == epochs - 1
        module.on_train_epoch_start()
        for i, idx in enumerate(batches(len(y), batch_size, generator)):
            idx = idx.to(x.device)
            loss = module.training_step((augment(x[idx], generator), y[idx]), i)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss = loss.detach()
            finite &= torch.isfinite(loss)
            total += loss
            steps += 1
    if not bool(finite):
        raise NonFiniteLoss("non-finite local loss")
    return float(total) / steps
