"""The fused engine: several clients of one group trained as one batched computation.

The clients' own tensors (the module's parameters and buffers after each client's
`start_round`: weights, BatchNorm statistics, prototype sums, FedDyn's h_k,
MOON's previous model) are stacked along a leading client dimension; the method's
own hooks (`on_train_epoch_start`, `training_step`, hence `extra_loss`) run once for
all of them through `torch.func.functional_call` under `torch.func.vmap`. Tensors
named by the module's `shared_state` prefixes and plain attributes (payload, global
weights) are the same for every client and are not batched.

Training is the same as `fit_local` for each client: each client keeps its own
generator (same shuffles and augmentation draws, in the same order), the loss is
the sum of the clients' losses so each stacked slice gets its own client's
gradient, and the module's optimiser (SGD: elementwise, momentum and weight decay
included) applied to the stacked tensors is the per-client optimiser. The clients
must have the same number of samples (same batches, same last short batch).
"""
from __future__ import annotations

from itertools import chain
from typing import Callable

import torch
from torch import nn
from torch.func import functional_call, vmap

from lightning_modules.base import ClientModule, NonFiniteLoss, batches, precision_context, steps_per_epoch


class _Hooks(nn.Module):
    """Calls a hook of the client module by name: functional_call then swaps the client's tensors."""

    def __init__(self, client: ClientModule):
        super().__init__()
        self.client = client

    def forward(self, name: str, *args):
        out = getattr(self.client, name)(*args)
        return torch.zeros(()) if out is None else out  # vmap needs a tensor back


class FusedNonFiniteLoss(NonFiniteLoss):
    def __init__(self, index: int):
        super().__init__(f"non-finite local loss (client {index} of the fused group)")
        self.index = index


def client_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of the module by name (non-persistent buffers included)."""
    return dict(chain(module.named_parameters(), module.named_buffers()))


def fit_fused(
    module: ClientModule,
    start_client: Callable[[int], None],
    data: list[tuple[torch.Tensor, torch.Tensor]],
    epochs: int,
    batch_size: int,
    generators: list[torch.Generator],
    drop_last: bool = False,
) -> tuple[list[float], Callable[[int], None]]:
    """Train len(data) clients of equal size together.

    `start_client(i)` puts client i's starting state into `module` (global weights,
    client state, `start_round`). Returns the clients' mean losses and `load(i)`,
    which copies client i's trained tensors into `module` (then `client_state`,
    `local_prototypes` and `net.state_dict` read client i as after `fit_local`).
    Raises FusedNonFiniteLoss naming the first client whose loss was NaN or infinite.
    """
    sizes = {len(y) for _, y in data}
    if len(sizes) != 1:
        raise ValueError(f"fused clients must have the same number of samples (got {sorted(sizes)}).")
    (n,) = sizes
    k = len(data)
    shared_prefixes = tuple(module.shared_state)
    per_client = []
    for i in range(k):
        start_client(i)
        module.on_train_epoch_start()  # allocates the per-client tensors it resets (prototype sums)
        # stacked contiguous: vmap has no batching rule for the as_strided_ that pooling a channels_last
        # activation takes (it falls back to a loop over the clients)
        per_client.append({name: t.detach().clone(memory_format=torch.contiguous_format)
                           for name, t in client_tensors(module).items()
                           if not name.startswith(shared_prefixes)})
    template = client_tensors(module)
    stacked = {name: torch.stack([c[name] for c in per_client]) for name in per_client[0]}
    trainable = [name for name in stacked if isinstance(template[name], nn.Parameter) and template[name].requires_grad]
    for name in trainable:
        stacked[name].requires_grad_(True)
    shared = {f"client.{name}": t.detach() for name, t in template.items() if name.startswith(shared_prefixes)}
    batched = {f"client.{name}": t for name, t in stacked.items()}
    hooks = _Hooks(module)

    def call(name: str, *tensors_in_dims):
        def one_client(state, *args):
            return functional_call(hooks, (state, shared), (name, *args))
        return one_client

    base_opt = module.configure_optimizers()
    optimizer = type(base_opt)([stacked[name] for name in trainable], **base_opt.defaults)
    module.train()
    dtype = next(module.net.parameters()).dtype
    x_all, y_all = (torch.stack(t) for t in zip(*data))  # k x n x C x H x W uint8, k x n: one gather per step
    device = x_all.device
    total = torch.zeros(k, dtype=dtype, device=device)
    finite = torch.ones(k, dtype=torch.bool, device=device)
    steps, epoch_steps = 0, steps_per_epoch(n, batch_size, drop_last)
    for epoch in range(epochs):
        module.gather_prototypes = epoch == epochs - 1
        vmap(call("on_train_epoch_start"))(batched)
        orders = [batches(n, batch_size, g, drop_last, device) for g in generators]
        for i, idx in enumerate(zip(*orders)):
            module.on_local_step(steps, epoch_steps, epochs)
            for name in trainable:  # a part the method froze for this step (FedRep's phases) is frozen in the stack
                stacked[name].requires_grad_(template[name].requires_grad)
            idx = torch.stack(idx)  # k x B
            xb = module.transform.train_stacked(x_all, idx, generators).to(dtype)
            yb = y_all.gather(1, idx)
            step = call("training_step")
            with precision_context(module.precision_mode, device):
                # randomness="different": a model with dropout (FedProto's CNN) draws each client's masks apart
                # (from torch's global stream, not the clients' generators: other draws than the sequential loop's)
                losses = vmap(lambda s, xb, yb: step(s, (xb, yb), i), randomness="different")(batched, xb, yb)
            optimizer.zero_grad(set_to_none=True)
            losses.sum().backward()
            optimizer.step()
            losses = losses.detach()
            finite &= torch.isfinite(losses)
            total += losses
            steps += 1
    bad = torch.nonzero(~finite).flatten().tolist()
    if bad:
        raise FusedNonFiniteLoss(bad[0])
    if steps == 0:
        raise ValueError(f"no training step: {n} samples give no full batch of {batch_size} with drop_last.")

    def load(i: int) -> None:
        with torch.no_grad():
            for name, t in client_tensors(module).items():
                if name in stacked:
                    t.copy_(stacked[name][i])

    return [float(v) / steps for v in total.cpu()], load
