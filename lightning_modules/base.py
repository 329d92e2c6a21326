"""The client-side interface: a LightningModule per method, and the local loop that runs it.

A method's client module subclasses `ClientModule` and overrides two hooks of the loss
and, where it needs them, two hooks of the round:

    loss = ce_weight() * CE(logits, y) + extra_loss(x, y, logits, features)

- `extra_loss`: the method's term (None: no term, e.g. FedAvg, or round 0 without prototypes);
- `ce_weight`: the weight of CE (1.0 unless the method re-weights it, e.g. FedProc's 1 - a);
- `start_round(round_idx, payload, global_state, client_state)`: loads the global weights,
  takes the round's payload (a frozen dataclass from the method's `ServerRule`, or None)
  and this client's state from its last round (None the first time);
- `client_state()`: what this client must keep to its next round (None: stateless);
- `initial_client_state(seed, client)`: that state before the client's first round (None
  unless the method needs one, e.g. FedDyn's alpha_k and zero h_k, MOON's own initialisation);
- `local_prototypes(x, y, generator)`: what the client uploads after training (the last
  epoch's class means, or a pass of the trained model over its data, e.g. FedAPC's).

The method's hyperparameters are `self.hparams` (Lightning's `save_hyperparameters`: an
attribute dict of `RunConfig.hparams`); the optimiser's are `lr`, `momentum`, `weight_decay`.

Lightning where it is Lightning: `fit_local` drives the module's hooks itself over batches
of resident tensors, in this order per client fit: `configure_optimizers` once,
`train()`, then per epoch `on_train_epoch_start` and per batch `training_step` (under
Lightning Fabric's precision context) followed by backward and the optimiser step.
Nothing else of Lightning runs: no Trainer, so no `self.log`, callbacks,
validation/test hooks, `on_fit_*`/`on_train_batch_*` hooks, checkpoints, loggers,
progress bars or model summaries (see `make bench` for what that saves per client fit).

The fused engine (`lightning_modules.fused`) runs the same hooks for several clients at
once; for that, a client's own tensors that change during or between its rounds (its
prototype sums here, FedDyn's h_k, MOON's previous model) are parameters or
buffers of the module, changed in place inside the hooks, never plain attributes; plain
attributes set in `start_round` (the payload, the global weights) must be the same for
every client of the round.
"""
from __future__ import annotations

import threading
from functools import lru_cache

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmark.transforms import Transform, to_device
from lightning_modules.privacy import dp_sgd, private
from lightning_modules.server import RoundPayload


def precision_context(precision: str, device: torch.device):
    """Lightning Fabric's precision plugin's forward context: nothing for 32-true, autocast for bf16-mixed."""
    return precision_plugin(precision, device.type).forward_context()


@lru_cache(maxsize=None)
def precision_plugin(precision: str, device_type: str):
    """Lightning Fabric's precision plugin, made once per (precision, device type), not once per step."""
    from lightning.fabric.plugins.precision import MixedPrecision, Precision

    return Precision() if precision == "32-true" else MixedPrecision(precision, device_type)


def batch_norm_in_stats_dtype(bn: nn.Module, args: tuple) -> tuple | None:
    """Forward pre-hook on every BatchNorm of a client's model (`ClientModule` registers it): its input cast to
    the dtype of its running statistics (of its weight where it keeps none), so that under bf16-mixed
    BatchNorm runs in float32, like the norms autocast keeps in float32 (layer_norm, group_norm), in both
    engines alike. Without it the fused engine fails under bf16-mixed: autocast leaves batch_norm in its
    input's dtype (bfloat16 after an autocast convolution), and under vmap BatchNorm's batching rule
    normalises with a stand-in weight of ones in the input's dtype beside the float32 running statistics;
    the kernels read the statistics' dtype off the weight's (float32 statistics for a bfloat16 input only
    with a float32 weight), so CUDA's backward fails (`Expected running_mean to have type BFloat16 but got
    Float`), the CPU's forward too (`expected scalar type BFloat16 but found Float`, where autocast makes the
    input bfloat16 under vmap: after a matmul, `tests/test_fused.py`). No change without autocast: the input
    already has that dtype."""
    ref = bn.running_mean if bn.running_mean is not None else bn.weight
    x = args[0]
    return None if ref is None or x.dtype == ref.dtype else (x.to(ref.dtype),)



# images per forward pass when testing (the driver's test sets, the client groups' own test samples): on a CPU a
# small batch keeps the activations in cache (ResNet-10 at 32x32 and FedPLVM's at 64x64: about 1.4x the images/s of
# batches of 1,000 on this project's 2-core CPU, `make bench` section (7)); on a GPU, the larger the better
EVAL_BATCH = {"cpu": 64}


def eval_batch(device: torch.device | str) -> int:
    """Test images per forward pass on `device`: EVAL_BATCH's, else 1,000."""
    return EVAL_BATCH.get(torch.device(device).type, 1000)


class NonFiniteLoss(RuntimeError):
    """A client's local loss became NaN or infinite."""


def no_training_step(n: int, batch_size: int) -> ValueError:
    """The error of a client fit with no step: fewer samples than a batch, and the last short batch dropped."""
    return ValueError(f"no training step: {n} samples give no full batch of {batch_size} with drop_last.")


class ClientModule(L.LightningModule):
    """FedAvg's client (CE only) and the base of every method's client.

    `net` is the model (`features(x)`, `forward(x) -> (logits, features)`, `feature_dim`,
    `num_classes`); `hparams` the method's hyperparameters.
    """

    # prefixes of parameter/buffer names that are the same for every client of a round and
    # not changed by training (MOON's global model): the fused engine keeps one copy of them
    shared_state: tuple[str, ...] = ()
    precision_mode = "32-true"  # the engines run the forward passes under precision_context(precision_mode)
    transform = Transform()  # the protocol's batch transform (the client group sets the dataset's)
    eval_batch = 500  # images per forward pass of `eval_features`
    # the run's rounds (the client group sets it): DP-SGD's accountant counts the whole run's steps (`dp_budget` run)
    run_rounds = 1

    @property
    def max_grad_norm(self) -> float | None:
        """Both engines scale each step's gradients (the client's own, over every parameter its optimiser updates) to
        at most this L2 norm before the step, as `torch.nn.utils.clip_grad_norm_` (Acar et al.'s FedDyn clips at 10);
        None: no clipping. A method offers it as its hyperparameter `max_grad_norm`."""
        return self.hparams.get("max_grad_norm")

    def __init__(self, net: nn.Module, hparams: dict | None = None, *, lr: float = 0.01, momentum: float = 0.9,
                 weight_decay: float = 1e-5):
        super().__init__()
        self.save_hyperparameters(dict(hparams or {}))
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.net = net
        for m in net.modules():  # (copies of the model, such as MOON's frozen ones, keep the hook)
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.register_forward_pre_hook(batch_norm_in_stats_dtype)
        self.num_classes = net.num_classes
        self.round = 0
        self.payload: RoundPayload | None = None
        # True: training_step adds the batch's features to the class sums; fit_local turns it
        # off for every local epoch but the last, so the prototypes are the last epoch's means
        self.gather_prototypes = True
        # per-client tensors are buffers (not plain attributes) so that the fused engine's
        # functional_call swaps in each client's own copy; non-persistent: not in state_dict
        self.register_buffer("_proto_sum", None, persistent=False)
        self.register_buffer("_proto_count", None, persistent=False)

    # ------------------------------------------------------------------ per round
    def start_round(self, round_idx: int, payload: RoundPayload | None, global_state: dict, client_state=None) -> None:
        """Before a client's local training: load the global weights and take the round's inputs.

        `payload` is what the server built at the end of round round_idx - 1 (None in round 0),
        moved to this module's device and its float tensors to the model's dtype;
        `client_state` is what this client's `client_state()` returned in its last round (None
        the first time). Subclasses call super() first.
        """
        self.round = round_idx
        self.net.load_state_dict(global_state)
        dtype = next(self.net.parameters()).dtype  # float payload tensors (prototypes) in the model's dtype
        self.payload = None if payload is None else payload.to(self.device, dtype)

    def client_state(self):
        """State of this client that must survive to its next round (None: stateless)."""
        return None

    def personalise(self, state: dict, client_state) -> dict:
        """The weights this client trains and is tested with, from the weights the server gives it and its client
        state: those weights, unless the method keeps a part of the model on the client (FedPer's head)."""
        return state

    def initial_client_state(self, seed: int, client: dict):
        """The state of a client before its first round (`client`: id, domain, num_samples, data_share)."""
        return None

    # ------------------------------------------------------------------ loss hooks
    def forward(self, x: torch.Tensor):
        return self.net(x)

    def extra_loss(self, x, y, logits, features) -> torch.Tensor | None:
        """The method's term added to the weighted CE; None when there is none (FedAvg, or round 0)."""
        return None

    def ce_weight(self) -> float:
        """The weight of CE in the loss (1.0 unless the method re-weights it)."""
        return 1.0

    def compute_loss(self, x, y, logits, features) -> torch.Tensor:
        """ce_weight() * CE + extra_loss: not overridden by methods (override the two hooks)."""
        ce = F.cross_entropy(logits, y)
        w = self.ce_weight()
        if w != 1.0:
            ce = w * ce
        extra = self.extra_loss(x, y, logits, features)
        return ce if extra is None else ce + extra

    # ------------------------------------------------------------------ Lightning hooks run by the engines
    def training_step(self, batch, batch_idx):
        x, y = batch
        logits, z = self.net(x)
        if self.gather_prototypes:  # index_add_, not bincount: it also runs per client under vmap
            self._proto_sum.index_add_(0, y, z.detach().to(self._proto_sum.dtype))
            self._proto_count.index_add_(0, y, torch.ones_like(y))
        return self.compute_loss(x, y, logits, z)

    def on_train_epoch_start(self) -> None:
        # reset each epoch, in place (the fused engine runs this on every client's copy):
        # what remains after the last epoch are its class sums
        shape = (self.num_classes, self.net.feature_dim)
        if self._proto_sum is None or self._proto_sum.shape != shape:
            dtype = next(self.net.parameters()).dtype
            self._proto_sum = torch.zeros(shape, dtype=dtype, device=self.device)
            self._proto_count = torch.zeros(self.num_classes, dtype=torch.long, device=self.device)
        self._proto_sum.zero_()
        self._proto_count.zero_()

    def on_local_step(self, step: int, epoch_steps: int, epochs: int) -> None:
        """Before local step `step` (0-based, counted over the fit's `epochs` epochs of `epoch_steps` steps; both
        engines call it outside the batched computation): nothing, unless the method trains parts of the model in
        turn (FedRep freezes the body, then the head, through `requires_grad`). What it leaves trainable must
        depend only on its arguments and the hyperparameters: the fused engine calls it once per distinct (step,
        epoch_steps) of its clients, each at its own step, and reads `requires_grad` per client."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=self.lr, momentum=self.momentum,
                               weight_decay=self.weight_decay)

    @torch.no_grad()
    def eval_features(self, x: torch.Tensor) -> torch.Tensor:
        """The model's features of the resident uint8 images `x` in eval mode, through the protocol's eval transform,
        `eval_batch` images per forward pass (FedPLVM's and FedPCL's post-training pass over the client's data)."""
        was_training = self.net.training
        self.net.eval()
        dtype = next(self.net.parameters()).dtype
        out = []
        for i in range(0, len(x), self.eval_batch):
            with precision_context(self.precision_mode, x.device):
                out.append(self.net.features(self.transform.eval(x[i:i + self.eval_batch]).to(dtype)).to(dtype))
        self.net.train(was_training)
        return torch.cat(out)

    def local_prototypes(self, x: torch.Tensor | None = None, y: torch.Tensor | None = None,
                         generator: torch.Generator | None = None) -> dict[int, torch.Tensor]:
        """What the client uploads after its training: class -> prototype (CPU).

        The engines call it once per client after its training, with the client's resident
        training images `x` (uint8), labels `y` and its generator (in the state training left it),
        for a method that runs its trained model over its data (FedAPC, FedPLVM). This default needs none
        of them: the mean training-mode feature of each class over the last local epoch.
        """
        sums, counts = self._proto_sum.cpu(), self._proto_count.cpu()
        return {int(k): sums[k] / counts[k] for k in torch.nonzero(counts).flatten()}


# torch's global random stream is one per process: who seeds it and draws from it at once (`own_initialisation`, a
# client group's seeding of it for dropout) holds this, so that the local executor's groups in threads draw alike
GLOBAL_STREAM = threading.RLock()


def own_initialisation(net_class: type, num_classes: int, seed: int, client_id: int, **model_kwargs) -> dict:
    """A fresh random initialisation of `net_class(num_classes, **model_kwargs)`, seeded from (seed, client id),
    the same on any executor: MOON's own previous model of round 0, the own model of a client that keeps
    its own (`LocalModelsRule`). CPU state_dict."""
    state = np.random.SeedSequence([seed, client_id], spawn_key=(1,)).generate_state(1)[0]
    with GLOBAL_STREAM, torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(state))
        return net_class(num_classes, **model_kwargs).state_dict()


def bn_updates_per_step(net: nn.Module, updates: int, momentum: float = 0.1) -> None:
    """BatchNorm running statistics as if every training step ran `updates` forward passes in training
    mode (RethinkFL's MOON and FedProto call the network twice per step): each pass uses the batch's
    statistics, so outputs and gradients are those of one pass, and the running statistics move by
    momentum 1 - (1 - m)^updates (0.19 for two). `num_batches_tracked` still counts one per step."""
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.momentum = 1 - (1 - momentum) ** updates


def steps_per_epoch(n: int, batch_size: int, drop_last: bool = False) -> int:
    """The number of batches `batches` gives for n samples."""
    return n // batch_size if drop_last else -(-n // batch_size)


def batches(n: int, batch_size: int, generator: torch.Generator, drop_last: bool = False,
            device: torch.device | None = None):
    """Shuffled index batches (drawn from `generator`, moved to `device` once per epoch); the last one short,
    or dropped with `drop_last` (a DataLoader's rule)."""
    perm = torch.randperm(n, generator=generator)
    perm = perm if device is None else to_device(perm, device)
    out = perm.split(batch_size)
    return out[: n // batch_size] if drop_last else out


def augmented_batch(x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, generator: torch.Generator, dtype: torch.dtype,
                    transform: Transform = Transform()):
    """One training batch: the images at `idx` through the training transform (augmentation drawn from the
    client's generator), in the model's dtype."""
    idx = idx.to(x.device)
    return transform.train(x[idx], generator).to(dtype), y[idx]


def fit_local(module: ClientModule, x: torch.Tensor, y: torch.Tensor, epochs: int, batch_size: int,
              generator: torch.Generator, drop_last: bool = False) -> float:
    """Train `module` on the resident uint8 images `x` and labels `y`; returns the mean loss.

    Under the hyperparameter `dp_sgd` the steps are DP-SGD (`lightning_modules.privacy.dp_sgd`: Opacus's optimiser
    around the module's, within a budget for this fit or for the client's `run_rounds` fits).
    Raises NonFiniteLoss when any step's loss was NaN or infinite (checked once, at the end, on the sum of
    the losses, which is then non-finite: no per-step check or host sync); the caller must then discard the
    weights.
    """
    optimizer = module.configure_optimizers()
    steps, epoch_steps = 0, steps_per_epoch(len(y), batch_size, drop_last)
    if epoch_steps == 0:
        raise no_training_step(len(y), batch_size)
    dp = None
    if private(module.hparams):
        dp = dp_sgd(module.net, optimizer, module.hparams, epochs * epoch_steps, module.run_rounds, len(y), batch_size,
                    generator)
        optimizer = dp.optimizer
    module.train()
    dtype = next(module.net.parameters()).dtype
    total = torch.zeros((), dtype=dtype, device=x.device)
    try:
        for epoch in range(epochs):
            module.gather_prototypes = epoch == epochs - 1
            module.on_train_epoch_start()
            for i, idx in enumerate(batches(len(y), batch_size, generator, drop_last, x.device)):
                module.on_local_step(steps, epoch_steps, epochs)
                with precision_context(module.precision_mode, x.device):
                    loss = module.training_step(augmented_batch(x, y, idx, generator, dtype, module.transform), i)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if module.max_grad_norm:
                    nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]],
                                             module.max_grad_norm)
                optimizer.step()
                total += loss.detach()
                steps += 1
    finally:
        if dp is not None:
            dp.close()
    if not bool(torch.isfinite(total)):
        raise NonFiniteLoss("non-finite local loss")
    return float(total) / steps
