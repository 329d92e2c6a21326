"""The fused engine: the clients of one group trained as one batched computation, whatever their sizes.

The clients' own tensors (the module's parameters and buffers after each client's
`start_round`: weights, BatchNorm statistics, prototype sums, FedDyn's h_k and alpha_k,
MOON's previous model) are stacked along a leading client dimension; the method's
own hooks (`on_train_epoch_start`, `training_step`, hence `extra_loss`) run for the
clients through `torch.func.functional_call` under `torch.func.vmap`. Tensors
named by the module's `shared_state` prefixes and plain attributes (payload, global
weights) are the same for every client and are not batched.

Training is the same as `fit_local` for each client: each client keeps its own
generator (same shuffles and augmentation draws, in the same order) and takes its
own number of steps per epoch (its samples over the batch size). The stack holds the
clients largest first, so at each step the clients that have a batch are its first m,
and they train in one vmapped call per batch size (a client's last batch may be short),
each on a view of the stack (a range of positions): nothing is gathered, and what the
hooks write in place (BatchNorm statistics, prototype sums) lands in the stack. The loss
is the sum of the clients' losses, so each slice gets its own client's gradient (the
first m clients' only), and `StackedSGD` applies each client's own SGD (its
`configure_optimizers`) to the slices of the clients that trained: a client without a
batch at a step is left exactly as it was (weights, momentum buffers, statistics, sums).

A method that trains parts of the model in turn (FedRep: the head, then the body) says so in
`on_local_step(step, epoch_steps, epochs)` through `requires_grad`, as for `fit_local`. Clients of
different sizes are at different steps of their own epochs, so the engine asks it per client: it calls
the hook with each client's own step count and steps per epoch (once per distinct pair, cached; the hook
must depend on nothing else than its arguments and the hyperparameters) and reads which parameters it
leaves trainable. A parameter's slice of a client that does not train it at this step is left as a
client without a batch is (weights and momentum buffer, whatever its gradient), as `torch.optim.SGD`
leaves a parameter without a gradient; a parameter no client trains at a step gets no gradient at all.
"""
from __future__ import annotations

from functools import lru_cache
from itertools import accumulate, chain
from typing import Callable

import torch
from torch import nn
from torch.func import functional_call, vmap

from lightning_modules.base import (ClientModule, NonFiniteLoss, batches, no_training_step, precision_context,
                                    steps_per_epoch)
from lightning_modules.privacy import FUSED_REFUSAL, private


class _Hooks(nn.Module):
    """Calls a hook of the client module by name: functional_call then swaps the client's tensors."""

    def __init__(self, client: ClientModule):
        super().__init__()
        self.client = client

    def forward(self, name: str, *args):
        out = getattr(self.client, name)(*args)
        return torch.zeros(()) if out is None else out  # vmap needs a tensor back


def hooks_of(module: ClientModule) -> _Hooks:
    """The module's `_Hooks`, made once and kept in its __dict__ (not a registered submodule: the module's tensors
    keep their names), so that a compiled `training_losses`, specialised on it, serves every fit of the module."""
    if "_fused_hooks" not in module.__dict__:
        module.__dict__["_fused_hooks"] = _Hooks(module)
    return module.__dict__["_fused_hooks"]


class FusedNonFiniteLoss(NonFiniteLoss):
    def __init__(self, index: int):
        super().__init__(f"non-finite local loss (client {index} of the fused group)")
        self.index = index


def client_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of the module by name (non-persistent buffers included)."""
    return dict(chain(module.named_parameters(), module.named_buffers()))


def sgd_hyperparameters(optimizer: torch.optim.Optimizer) -> tuple[float, float, float]:
    """(lr, momentum, weight decay) of a client's optimiser, which must be what `StackedSGD` applies: SGD with
    one parameter group, no dampening, no Nesterov momentum, not maximising."""
    group = optimizer.param_groups[0]
    if (type(optimizer) is not torch.optim.SGD or len(optimizer.param_groups) != 1 or group["dampening"] != 0
            or group["nesterov"] or group["maximize"]):
        raise ValueError(f"the fused engine applies SGD with one parameter group, no dampening, no Nesterov momentum "
                         f"(configure_optimizers gave {optimizer!r}); use --engine sequential.")
    return group["lr"], group["momentum"], group["weight_decay"]


class StackedSGD:
    """`torch.optim.SGD` (dampening 0, no Nesterov) on tensors stacked along a leading client dimension, each
    client with its own (lr, momentum, weight decay). `step(grads, active)` takes one gradient per parameter
    (None: no client trains it at this step, and it is left alone, as torch's SGD leaves a parameter without a
    gradient) whose leading dimension m may be shorter than the stack's: it holds the first m clients' gradients
    (the one-stack engine puts the clients with most steps first, so the clients with a batch at a step are a
    prefix), and the clients from m on are left as they were. `active` (None: every client of the prefix) is an
    m-element bool tensor of the clients that train; the others' slices of the weights and momentum buffers stay
    as they were, bit for bit, whatever their gradients. It may also be a list with one such entry per parameter
    (the clients that train that parameter at this step: FedRep's phases).

    Per client, as torch's: d = grad + weight_decay * w; buf = momentum * buf + d (the first time: d);
    w = w - lr * buf. The buffers start at zero, so that a client's first update makes its buffer d exactly.
    When every client has the same (lr, momentum, weight decay) and trains every parameter it has a gradient for,
    the update is a few `torch._foreach_*` calls for all parameters (as torch's SGD with foreach), not four
    kernels per parameter: on a GPU, where a step of small batches is bound by kernel launches, that is most of
    the optimiser's cost.
    """

    def __init__(self, params: list[torch.Tensor], hyperparameters: list[tuple[float, float, float]]):
        self.params = params
        p = params[0]
        self.same = hyperparameters[0] if len(set(hyperparameters)) == 1 else None
        self.lr, self.momentum, self.weight_decay = (torch.tensor(v, dtype=p.dtype, device=p.device)
                                                     for v in zip(*hyperparameters))
        self.buffers = [torch.zeros_like(q) for q in params]

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor | None],
             active: torch.Tensor | list[torch.Tensor | None] | None = None) -> None:
        masks = active if isinstance(active, list) else [active] * len(self.params)
        plain = []  # (weights, buffer, gradient) of the parameters every client of the prefix trains
        for p, buf, g, mask in zip(self.params, self.buffers, grads, masks):
            if g is None:  # no client trains it at this step
                continue
            m = len(g)
            if m < len(p):
                p, buf = p[:m], buf[:m]
            if mask is None and self.same is not None:
                plain.append((p, buf, g))
                continue
            shape = (-1,) + (1,) * (p.dim() - 1)  # a client's coefficient over its slice
            momentum, lr = self.momentum[:m].view(shape), self.lr[:m].view(shape)
            d = torch.addcmul(g, p, self.weight_decay[:m].view(shape))
            if mask is None:
                buf.mul_(momentum).add_(d)
                p.addcmul_(buf, lr, value=-1)
            else:  # the same arithmetic where the mask is true; elsewhere the old values, whatever d holds
                trained = mask.view(shape)
                buf.copy_(torch.where(trained, buf * momentum + d, buf))
                p.copy_(torch.where(trained, torch.addcmul(p, buf, lr, value=-1), p))
        if plain:
            lr, momentum, weight_decay = self.same
            ps, bufs, gs = (list(t) for t in zip(*plain))
            d = torch._foreach_add(gs, ps, alpha=weight_decay)
            torch._foreach_mul_(bufs, momentum)
            torch._foreach_add_(bufs, d)
            torch._foreach_add_(ps, bufs, alpha=-lr)


def clip_per_client(grads: list[torch.Tensor | None], max_norm: float) -> None:
    """`torch.nn.utils.clip_grad_norm_` on each client's slice of stacked gradients (dimension 0: the clients), in
    place: a client's gradients scaled by min(1, max_norm / (their L2 norm + 1e-6))."""
    present = [g for g in grads if g is not None]
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in present]).norm(dim=0)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in present:
        g.mul_(coef.view(-1, *[1] * (g.dim() - 1)).to(g.dtype))


def training_losses(hooks: _Hooks, state: dict, shared: dict, xb: torch.Tensor, yb: torch.Tensor,
                    step: int) -> torch.Tensor:
    """The clients' `training_step` losses: the module's hook under vmap, each client with its slice of `state`."""
    def one_client(s, x, y):
        return functional_call(hooks, (s, shared), ("training_step", (x, y), step))
    # randomness="different": a model with dropout (FedProto's CNN) draws each client's masks apart
    # (from torch's global stream, not the clients' generators: other draws than the sequential loop's)
    return vmap(one_client, randomness="different")(state, xb, yb)


COMPILE_BACKEND = "inductor"  # torch.compile's backend for `--compile` (the tests use aot_eager: no kernel generation)
COMPILE_SHAPES = 64  # compilations of `training_losses` allowed per process (dynamo's default, 8, falls back to eager)


@lru_cache(maxsize=None)
def compiled_training_losses(device_type: str, backend: str = COMPILE_BACKEND) -> Callable:
    """`training_losses` through torch.compile (`--compile`): one compiled function per device type, so that its
    compiled code serves every fit of the process. On CUDA with inductor in mode reduce-overhead (CUDA graphs,
    where inductor takes them).

    The one-stack engine calls it with as many shapes as a round has (clients in the call, batch size): at a step
    the clients with a full batch, then the clients of each size with their last, shorter batch, each of these once
    with and once without the last epoch's prototype gathering (a Python branch of `training_step`). Dynamo does
    not make these sizes dynamic under vmap (it compiled each shape apart in torch 2.14), so each shape compiles
    once, statically (`dynamic=False`), and the recompile limit is raised to COMPILE_SHAPES for this function:
    at dynamo's default limit (8) a Digits group (clients of 3 sizes: about 10 shapes) fell back to eager,
    with a warning only. Past COMPILE_SHAPES it still does."""
    mode = "reduce-overhead" if device_type == "cuda" and backend == "inductor" else None
    fn = torch.compile(training_losses, backend=backend, mode=mode, dynamic=False)

    def call(*args):
        with torch._dynamo.config.patch(recompile_limit=COMPILE_SHAPES):
            return fn(*args)
    return call


def fit_fused(
    module: ClientModule,
    start_client: Callable[[int], None],
    data: list[tuple[torch.Tensor, torch.Tensor]],
    epochs: int,
    batch_size: int,
    generators: list[torch.Generator],
    drop_last: bool = False,
    compile: bool = False,
) -> tuple[list[float], Callable[[int], None]]:
    """Train len(data) clients (of any sizes) together.

    `start_client(i)` puts client i's starting state into `module` (global weights,
    client state, `start_round`). Returns the clients' mean losses and `load(i)`,
    which copies client i's trained tensors into `module` (then `client_state`,
    `local_prototypes` and `net.state_dict` read client i as after `fit_local`).
    `compile`: the vmapped forward and backward through torch.compile (`compiled_training_losses`).
    Raises FusedNonFiniteLoss naming the first client whose loss was NaN or infinite.

    The stack holds the clients largest first (stable): a client with more samples has at least as many steps
    and, at a step where both have a batch, a batch at least as large. So the clients with a batch at a step are
    the stack's first m, and those with a batch of one size a range of them: each call takes a view of the
    stack (no gather, and what the hooks write in place lands in the stack), the gradients are the first m
    clients' only, and the optimiser updates those m slices.
    """
    if private(module.hparams):
        raise ValueError(FUSED_REFUSAL)
    k = len(data)
    order = sorted(range(k), key=lambda i: -len(data[i][1]))  # stack position j holds client order[j]
    position = {client: j for j, client in enumerate(order)}
    data, generators = [data[i] for i in order], [generators[i] for i in order]
    sizes = [len(y) for _, y in data]  # largest first
    if drop_last and sizes[-1] < batch_size:
        raise no_training_step(sizes[-1], batch_size)
    shared_prefixes = tuple(module.shared_state)
    per_client, hyperparameters = [], []
    for i in order:
        start_client(i)
        module.on_train_epoch_start()  # allocates the per-client tensors it resets (prototype sums)
        # stacked contiguous: vmap has no batching rule for the as_strided_ that pooling a channels_last
        # activation takes (it falls back to a loop over the clients)
        per_client.append({name: t.detach().clone(memory_format=torch.contiguous_format)
                           for name, t in client_tensors(module).items()
                           if not name.startswith(shared_prefixes)})
        hyperparameters.append(sgd_hyperparameters(module.configure_optimizers()))  # FedDyn's differ by client
    template = client_tensors(module)
    stacked = {name: torch.stack([c[name] for c in per_client]) for name in per_client[0]}
    trainable = [name for name in stacked if isinstance(template[name], nn.Parameter) and template[name].requires_grad]
    # contiguous too: a channels_last weight (MOON's global model) makes channels_last activations, and on CUDA
    # BatchNorm asks them `is_contiguous(memory_format=channels_last)`, which vmap does not answer (NYI)
    shared = {f"client.{name}": t.detach().clone(memory_format=torch.contiguous_format)
              for name, t in template.items() if name.startswith(shared_prefixes)}
    hooks = hooks_of(module)

    optimizer = StackedSGD([stacked[name] for name in trainable], hyperparameters)
    module.train()
    dtype = next(module.net.parameters()).dtype
    x_all, y_all = torch.cat([x for x, _ in data]), torch.cat([y for _, y in data])  # one gather per step
    device = x_all.device
    losses_fn = compiled_training_losses(device.type, COMPILE_BACKEND) if compile else training_losses
    starts = list(accumulate(sizes, initial=0))  # position j's samples: rows starts[j] to starts[j + 1] of x_all
    leaves: dict[tuple[int, frozenset[str]], dict[str, torch.Tensor]] = {}

    def prefix(m: int, some: frozenset[str]) -> dict[str, torch.Tensor]:
        """The first m clients' slices of the stack, by name: views; those of the trainable parameters in `some`
        are leaves of their own that collect the m clients' gradients (made once per (m, some))."""
        if (m, some) not in leaves:
            views = {name: t[:m] if m < k else t for name, t in stacked.items()}
            leaves[m, some] = {name: v.detach().requires_grad_(name in some) if name in trainable else v
                               for name, v in views.items()}
        return leaves[m, some]

    def losses_of(state: dict[str, torch.Tensor], a: int, b: int, step: int) -> torch.Tensor:
        """The losses of the clients at positions a to b - 1, whose batches at this step have one size."""
        gens = generators[a:b]
        idx = torch.stack([orders[c][step] for c in range(a, b)])
        xb = module.transform.train_stacked(x_all, idx, gens).to(dtype)
        yb = y_all[idx]
        batched = {f"client.{name}": t if (a, b) == (0, len(t)) else t[a:b] for name, t in state.items()}
        with precision_context(module.precision_mode, device):
            return losses_fn(hooks, batched, shared, xb, yb, step)

    phases: dict[tuple[int, int], frozenset[str]] = {}  # (a client's step, its steps per epoch) -> what it trains
    masks: dict[tuple, tuple[list[torch.Tensor | None], frozenset[str]]] = {}
    epoch_steps = [steps_per_epoch(n, batch_size, drop_last) for n in sizes]  # as fit_local counts them

    def trains(step: int, steps_in_epoch: int) -> frozenset[str]:
        """The trainable parameters a client trains at its local step `step` (the method's `on_local_step`)."""
        if (step, steps_in_epoch) not in phases:
            module.on_local_step(step, steps_in_epoch, epochs)
            phases[step, steps_in_epoch] = frozenset(name for name in trainable if template[name].requires_grad)
        return phases[step, steps_in_epoch]

    def update_masks(by_client: tuple[frozenset[str], ...]) -> tuple[list[torch.Tensor | None], frozenset[str]]:
        """Per trainable parameter the mask of the m clients with a batch that train it (None: all m), and the
        parameters some client trains, from what each of the m trains at this step."""
        if by_client not in masks:
            per_parameter = []
            for name in trainable:
                mask = [name in t for t in by_client]
                per_parameter.append(None if all(mask) else torch.tensor(mask, device=device))
            masks[by_client] = per_parameter, frozenset().union(*by_client)
        return masks[by_client]

    total = torch.zeros(k, dtype=dtype, device=device)  # each client's sum of losses
    steps = [0] * k
    for epoch in range(epochs):
        module.gather_prototypes = epoch == epochs - 1
        vmap(lambda s: functional_call(hooks, (s, shared), ("on_train_epoch_start",)))(
            {f"client.{name}": t for name, t in stacked.items()})
        orders = [[b + start for b in batches(n, batch_size, g, drop_last, device)]
                  for n, start, g in zip(sizes, starts, generators)]
        for step in range(len(orders[0])):
            m = sum(step < len(o) for o in orders)  # the clients with a batch: the first m
            trained = []
            for c in range(m):
                trained.append(trains(steps[c], epoch_steps[c]))
                steps[c] += 1
            per_parameter, some = update_masks(tuple(trained))
            state = prefix(m, some)
            calls = []  # (a, b): positions a to b - 1 have batches of one size at this step
            for c in range(m):
                if calls and len(orders[c][step]) == len(orders[calls[-1][0]][step]):
                    calls[-1][1] = c + 1
                else:
                    calls.append([c, c + 1])
            losses = [losses_of(state, a, b, step) for a, b in calls]
            loss = sum(v.sum() for v in losses)
            if loss.requires_grad:
                loss.backward()
            grads = [state[name].grad for name in trainable]
            if module.max_grad_norm:
                clip_per_client(grads, module.max_grad_norm)
            optimizer.step(grads, per_parameter)
            for name in some:
                state[name].grad = None
            for (a, b), v in zip(calls, losses):
                total[a:b] += v.detach()
    for name in trainable:  # the module as the stack started (the last call of on_local_step set the phases)
        template[name].requires_grad_(True)
    bad = torch.nonzero(~torch.isfinite(total)).flatten().tolist()  # (a NaN or infinite loss makes its sum so)
    if bad:
        raise FusedNonFiniteLoss(min(order[j] for j in bad))

    def load(i: int) -> None:
        with torch.no_grad():
            for name, t in client_tensors(module).items():
                if name in stacked:
                    t.copy_(stacked[name][position[i]])

    mean = [float(v) / s for v, s in zip(total.cpu(), steps)]
    return [mean[position[i]] for i in range(k)], load
