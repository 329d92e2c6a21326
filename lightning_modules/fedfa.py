"""FedFA: federated feature augmentation.

Tianfei Zhou, Ender Konukoglu. "FedFA: Federated Feature Augmentation." ICLR 2023 (arXiv:2301.12995);
official code tfzhou/FedFA (`pyfed/utils/ffa_layer.py`, `pyfed/manager/comm.py`). A baseline of FedPLVM's
Tables 1, 2, 7 and 8 (PROTOCOL.md section 2, appendix).

Client: CE, with a feature-augmentation (FFA) layer after each convolutional stage of the model (ResNet-10:
after the stem and after each of its four residual stages; another model: after each convolution). In training,
with probability `p` per layer and step (the code's one draw per batch), each sample's channel-wise feature
mean mu and std sigma (over the spatial positions; sigma = sqrt(var + eps)) are re-sampled,
beta ~ N(mu, (gamma_mu + 1) * Var_batch(mu)) and gamma ~ N(sigma, (gamma_sigma + 1) * Var_batch(sigma)), and the
features re-styled: gamma * (x - mu) / sigma + beta. gamma_mu = C * t / sum(t), t = 1 / (1 + 1 / (V + eps)), V the
server's client-sharing variance of the clients' running means (the same for sigma: the adaptive variance
fusion). The layer keeps running means of the batch-mean mu and sigma (momentum 0.99, updated when it fires,
as the code). In eval mode it is the identity. The layers are not part of the model: they live in the client
module (`ffa`, one per site) and run as forward hooks on the model's stage modules, so the global model, its
state_dict and every other method are unchanged.

Server (`FedFAServer`): FedAvg of the model's whole state_dict (weights and BatchNorm buffers); from the
clients' running statistics (uploaded after training, counted as prototypes in the communication columns)
it sends, per layer, their mean over the clients (the running statistics every client starts the next round
from) and their variance across the clients: per channel as the paper's equations (`client_variance=channel`,
default), or over all channels and clients at once as the reference's `torch.var(tmp)` then broadcast
(`client_variance=all`: every channel alike, so gamma = 1). docs/deviations.md, 30.

Randomness: the coin and the Gaussian draws come from a counter-based hash of (seed, client id, round, step,
layer, element) (`counter_uniforms`, Box-Muller), not from torch's stream: the same draws for a client on any
executor and in both engines (the fused engine runs the hooks under vmap, where a generator cannot be used).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from benchmark.models import ResNet10
from lightning_modules.base import ClientModule
from lightning_modules.fedavg import FedAvgServer
from lightning_modules.server import RoundPayload

MASK32 = 0xFFFFFFFF


def _mul32(h: torch.Tensor, c: int) -> torch.Tensor:
    """(h * c) mod 2^32 for 0 <= h < 2^32 in int64 without overflow (16-bit halves)."""
    return ((h & 0xFFFF) * c + ((((h >> 16) * c) & 0xFFFF) << 16)) & MASK32


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (Wellons' lowbias32) on int64 tensors holding values in [0, 2^32)."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x7FEB352D)
    h = h ^ (h >> 15)
    h = _mul32(h, 0x846CA68B)
    return h ^ (h >> 16)


def counter_uniforms(key: torch.Tensor, n: int) -> torch.Tensor:
    """n uniforms in (0, 1) (float64, 24 random bits each) from the int64 `key` (its last dimension: the
    stream's coordinates): a pure function of the key, elementwise, so it runs per client under vmap."""
    h = torch.zeros(key.shape[:-1], dtype=torch.int64, device=key.device)
    for part in key.unbind(-1):
        h = _mix32(h ^ (part & MASK32))
    idx = torch.arange(n, dtype=torch.int64, device=key.device)
    h = _mix32(_mix32(h[..., None] ^ idx) ^ 0x9E3779B9)
    return ((h >> 8).to(torch.float64) + 0.5) / 2**24


def counter_normals(key: torch.Tensor, n: int) -> torch.Tensor:
    """n standard normals (float64) from `counter_uniforms(key, 2n)` by Box-Muller (the cosine branch)."""
    u = counter_uniforms(key, 2 * n)
    return torch.sqrt(-2 * torch.log(u[..., :n])) * torch.cos(2 * math.pi * u[..., n:])


def variance_fusion(shared_var: torch.Tensor, eps: float) -> torch.Tensor:
    """FedFA's adaptive variance fusion: C * t / sum(t), t = 1 / (1 + 1 / (V + eps)) per channel."""
    t = 1 / (1 + 1 / (shared_var + eps))
    return t.shape[-1] * t / t.sum(dim=-1, keepdim=True)


def feature_augmentation(x: torch.Tensor, noise_mean: torch.Tensor, noise_std: torch.Tensor,
                         shared_var_mean: torch.Tensor, shared_var_std: torch.Tensor, eps: float = 1e-6):
    """The FFA layer's re-styling of `x` (B x C x H x W) with the standard normal draws `noise_mean`,
    `noise_std` (B x C) and the server's client-sharing variances (C each). Returns (the augmented x, the
    per-sample channel means mu, the stds sigma), both B x C. Variances unbiased, as torch's default there."""
    mean = x.mean(dim=(2, 3))
    std = (x.var(dim=(2, 3)) + eps).sqrt()
    scope_mean = ((variance_fusion(shared_var_mean, eps) + 1) * (mean.var(dim=0) + eps)).sqrt()
    scope_std = ((variance_fusion(shared_var_std, eps) + 1) * (std.var(dim=0) + eps)).sqrt()
    beta = mean + noise_mean * scope_mean
    gamma = std + noise_std * scope_std
    out = (x - mean[:, :, None, None]) / std[:, :, None, None] * gamma[:, :, None, None] + beta[:, :, None, None]
    return out, mean, std


class FFALayer(nn.Module):
    """One FFA layer's statistics (buffers, so the fused engine gives each client its own): the running means
    of the batch-mean channel mean and std, and the server's client-sharing variances of them."""

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_std", torch.ones(channels))
        self.register_buffer("shared_var_mean", torch.ones(channels))
        self.register_buffer("shared_var_std", torch.ones(channels))

    def reset(self, running: torch.Tensor | None, shared_var: torch.Tensor | None) -> None:
        """The round's start: the server's (2 x C) mean running statistics and client-sharing variances, or the
        code's initial values (0, 1; 1, 1) before the first aggregation."""
        with torch.no_grad():
            if running is None:
                self.running_mean.zero_(), self.running_std.fill_(1.0)
                self.shared_var_mean.fill_(1.0), self.shared_var_std.fill_(1.0)
            else:
                self.running_mean.copy_(running[0]), self.running_std.copy_(running[1])
                self.shared_var_mean.copy_(shared_var[0]), self.shared_var_std.copy_(shared_var[1])


def augmentation_sites(net: nn.Module) -> list[tuple[nn.Module, str, int]]:
    """Where the FFA layers go, as (module, "pre" | "post", channels): on ResNet-10 (and FedPLVM's) the input of
    its residual stages (the stem's output) and the output of each stage; on another model the output of each
    convolution."""
    if isinstance(net, ResNet10):
        return [(net.layers, "pre", net.bn1.num_features)] + [(b, "post", b.bn2.num_features) for b in net.layers]
    sites = [(m, "post", m.out_channels) for m in net.modules() if isinstance(m, nn.Conv2d)]
    if not sites:
        raise ValueError(f"FedFA puts its layers after convolutional stages; {type(net).__name__} has no Conv2d.")
    return sites


@dataclass(frozen=True)
class FedFARound(RoundPayload):
    running: torch.Tensor  # 2 x sum(C): per layer in order, the clients' mean running channel mean (row 0) and std
                           # (row 1)
    shared_var: torch.Tensor  # 2 x sum(C): their variance across the clients (the client-sharing statistics)


class FedFAClient(ClientModule):
    payload: FedFARound | None

    def __init__(self, net, hparams=None, **optim):
        super().__init__(net, hparams, **optim)
        sites = augmentation_sites(self.net)
        self.ffa = nn.ModuleList(FFALayer(c) for _, _, c in sites)
        for i, (module, kind, _) in enumerate(sites):
            if kind == "pre":
                module.register_forward_pre_hook(lambda m, args, i=i: (self.augment(i, args[0], m.training), *args[1:]))
            else:
                module.register_forward_hook(lambda m, args, out, i=i: self.augment(i, out, m.training))
        # the client's (seed, id) and its training steps this round: the coordinates of its random stream
        self.register_buffer("ffa_client", torch.zeros(2, dtype=torch.int64), persistent=False)
        self.register_buffer("ffa_step", torch.zeros((), dtype=torch.int64), persistent=False)

    def initial_client_state(self, seed, client):
        return torch.tensor([seed, client["id"]], dtype=torch.int64)

    def client_state(self):
        return self.ffa_client.clone()

    def start_round(self, round_idx, payload, global_state, client_state=None):
        super().start_round(round_idx, payload, global_state, client_state)
        with torch.no_grad():
            self.ffa_client.copy_(client_state)
            self.ffa_step.zero_()
        p, start = self.payload, 0
        for layer in self.ffa:
            end = start + layer.channels
            layer.reset(None if p is None else p.running[:, start:end],
                        None if p is None else p.shared_var[:, start:end])
            start = end

    def augment(self, i: int, x: torch.Tensor, training: bool) -> torch.Tensor:
        """FFA layer i on the features `x` of a training forward pass; the identity in eval mode and on a batch of
        one sample (no batch variance to draw from)."""
        if not training or x.shape[0] < 2:
            return x
        if i == 0:  # a new training step: the first layer of the forward pass
            self.ffa_step.add_(1)
        hp, layer = self.hparams, self.ffa[i]
        b, c = x.shape[:2]
        key = torch.stack([*self.ffa_client, torch.full_like(self.ffa_step, self.round), self.ffa_step,
                           torch.full_like(self.ffa_step, i)])
        coin = counter_uniforms(key, 1)[..., 0]
        noise = counter_normals(torch.cat([key, torch.ones_like(key[:1])]), 2 * b * c)
        dtype = torch.promote_types(x.dtype, torch.float32)
        out, mean, std = feature_augmentation(
            x.to(dtype), noise[: b * c].view(b, c).to(dtype), noise[b * c:].view(b, c).to(dtype),
            layer.shared_var_mean.to(dtype), layer.shared_var_std.to(dtype), hp["eps"])
        fire = coin < hp["p"]
        with torch.no_grad():  # the running statistics move only when the layer fires, as the code's
            m = hp["momentum"]
            layer.running_mean.copy_(torch.where(fire, layer.running_mean * m + mean.mean(dim=0) * (1 - m),
                                                 layer.running_mean))
            layer.running_std.copy_(torch.where(fire, layer.running_std * m + std.mean(dim=0) * (1 - m),
                                                layer.running_std))
        return torch.where(fire, out.to(x.dtype), x)

    def local_prototypes(self, x=None, y=None, generator=None) -> dict[int, torch.Tensor]:
        """What FedFA uploads besides its weights: layer -> its running channel mean and std (2 x C, CPU)."""
        return {i: torch.stack([layer.running_mean, layer.running_std]).detach().cpu()
                for i, layer in enumerate(self.ffa)}


class FedFAServer(FedAvgServer):
    """FedAvg of the weights (and BatchNorm buffers); the clients' running statistics averaged and their
    variance across the clients (the client-sharing statistics) sent as the payload."""

    def payload(self, client_protos, round_idx):
        stats = [client_protos[c] for c in sorted(client_protos)]
        running, shared = [], []
        for i in sorted(stats[0]):
            s = torch.stack([st[i].double() for st in stats])  # clients x 2 x C
            correction = 1 if len(s) > 1 else 0  # unbiased as torch.var; one client: no spread
            if self.hparams["client_variance"] == "channel":
                var = s.var(dim=0, correction=correction)
            else:  # the code's torch.var over every client and channel of a statistic at once
                var = torch.stack([s[:, j].var(correction=correction) for j in range(2)])[:, None].expand(2, s.shape[2])
            running.append(s.mean(dim=0))
            shared.append(var)
        return FedFARound(running=torch.cat(running, dim=1).float(), shared_var=torch.cat(shared, dim=1).float())

