"""Privacy protection of a client's uploads (FedPLVM's appendix G, Table 11): DP-SGD for its local training, Gaussian
noise on its local prototypes.

DP-SGD (Abadi et al., CCS 2016) with Opacus (Yousefpour et al., "Opacus: User-Friendly Differential Privacy Library
in PyTorch", 2021): each step computes every sample's gradient (`GradSampleModule`'s hooks on the model), clips it
to L2 norm `max_grad_norm`, sums the batch's, adds Gaussian noise of std `noise_multiplier * max_grad_norm` and
divides by the batch size (`DPOptimizer`, around the method's own SGD). The noise multiplier is Opacus's
accountant's (`get_noise_multiplier`, Renyi DP of the sampled Gaussian mechanism, Mironov et al. 2019, the paper's
[22]): the smallest that keeps the client's whole run, every round's local steps, within (epsilon, delta) at the
sample rate batch / the client's samples (`dp_budget` "run", the default), or each round's local steps alone
(`dp_budget` "round": what an FL code that makes a fresh Opacus `PrivacyEngine` every round spends, the run as a
whole then far above epsilon; the paper does not say which it did, docs/deviations.md 37). Opacus trains no
BatchNorm (a sample's output would depend on its batch); the model then has GroupNorm in its place
(`benchmark.models.norm_layer`, Opacus's `ModuleValidator.fix`). Opacus is imported when a client first trains
privately (it takes seconds to import).

Prototype noise (the paper's "scale s = 0.05, perturbation coefficient p = 0.1"; FedPLVM's code has none, FedPCL's,
whose `add_noise_proto` these two parameters and defaults come from, has it): each uploaded prototype P becomes
(1 - p) P + N(0, s^2) per coordinate, drawn from the client's generator (docs/deviations.md, 36).
"""
from __future__ import annotations

import warnings
from functools import lru_cache

import torch
from torch import nn

# torch warns at every backward that Opacus's full backward hooks fire without an input that requires a gradient
# (the images): harmless, its per-sample gradients come from each layer's own input and output gradient
# (tests/test_privacy.py checks them against per-sample autograd); silenced, this message only
warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with respect to "
                        "module outputs since no inputs require gradients", category=UserWarning)

ACCOUNTANT = "rdp"  # Opacus's accountant that sets the noise multiplier (its default for get_noise_multiplier)


FUSED_REFUSAL = ("DP-SGD (dp_sgd=true) trains one client at a time (Opacus's per-sample gradients): the fused engine "
                 "cannot run it; use ENGINE=sequential (--engine sequential).")


def private(hparams) -> bool:
    """Whether a method's local training is DP-SGD: its hyperparameter `dp_sgd` (methods without it never)."""
    return bool(hparams.get("dp_sgd", False))


def model_options(hparams) -> dict:
    """`build_model`'s options that training with these hyperparameters needs, for every client and the driver's
    model: GroupNorm for BatchNorm under DP-SGD (Opacus's replacement), none otherwise."""
    return {"norm": "group"} if private(hparams) else {}


@lru_cache(maxsize=None)
def noise_multiplier(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """Opacus's noise multiplier for `steps` steps at `sample_rate` within (epsilon, delta) (its binary search stops
    within 0.01 below epsilon; seconds of it, so once per client size in a process)."""
    from opacus.accountants.utils import get_noise_multiplier

    return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=sample_rate,
                                      steps=steps, accountant=ACCOUNTANT))


class DPSGD:
    """DP-SGD for one client fit: Opacus's per-sample gradient hooks on `net` and its `DPOptimizer` around
    `optimizer` (the noise drawn from `generator`, on the parameters' device). `close()` removes the hooks and
    the per-sample gradients once the fit is over (the model is then as it was, its weights trained, but in the
    contiguous memory format)."""

    def __init__(self, net: nn.Module, optimizer: torch.optim.Optimizer, noise_multiplier: float,
                 max_grad_norm: float, batch_size: int, generator: torch.Generator):
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        self.noise_multiplier, self.max_grad_norm = noise_multiplier, max_grad_norm
        # Opacus's convolution per-sample gradients are wrong on channels_last tensors (as `build_model` makes the
        # weights, and then the activations; tests/test_privacy.py): the model contiguous (NCHW) again, in place
        net.to(memory_format=torch.contiguous_format)
        self.sampler = GradSampleModule(net)  # refuses a model with BatchNorm
        self.optimizer = DPOptimizer(optimizer, noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm,
                                     expected_batch_size=batch_size, generator=generator)

    def close(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.sampler._close()  # hooks removed, grad_sample attributes deleted


def dp_sgd(net: nn.Module, optimizer: torch.optim.Optimizer, hparams, fit_steps: int, run_rounds: int,
           num_samples: int, batch_size: int, generator: torch.Generator) -> DPSGD:
    """DP-SGD for a fit of `fit_steps` steps by a client of `num_samples` samples, by the hyperparameters
    `dp_epsilon`, `dp_delta`, `dp_max_grad_norm` and `dp_budget` (its budget spans `run_rounds` such fits, "run",
    or this fit alone, "round"); the noise generator seeded from one draw of the client's `generator`."""
    steps = fit_steps * (run_rounds if hparams.get("dp_budget", "run") == "run" else 1)
    sigma = noise_multiplier(hparams["dp_epsilon"], hparams["dp_delta"], batch_size / num_samples, steps)
    device = next(net.parameters()).device
    noise = torch.Generator(device).manual_seed(int(torch.randint(2**62, (), generator=generator)))
    return DPSGD(net, optimizer, sigma, hparams["dp_max_grad_norm"], batch_size, noise)


def perturb_prototypes(protos: dict[int, torch.Tensor], scale: float, coefficient: float,
                       generator: torch.Generator) -> dict[int, torch.Tensor]:
    """Class -> (1 - coefficient) * prototypes + Gaussian noise of std `scale` (each coordinate), the noise drawn from
    `generator` class by class in increasing class order."""
    out = {}
    for k in sorted(protos):
        p = protos[k]
        noise = torch.randn(p.shape, generator=generator, dtype=p.dtype)
        out[k] = (1 - coefficient) * p + scale * noise
    return out
