"""Batched image transforms on uint8 tensors, on whatever device the batch lives.

`augment` draws the same distribution as torchvision's
RandomCrop(32, padding=4) -> RandomHorizontalFlip -> ToTensor -> Normalize:
per image an offset (i, j) uniform in {0..8}^2 into the zero-padded 40x40
image and a flip with probability 1/2, done for the whole batch with one
gather instead of per image through PIL. A dataset's protocol names its
`Transform` (normalisation, and which of crop and flip its training batches get).
`random_erasing` draws torchvision's RandomErasing (on normalised images) for a
whole batch with one mask (FedAPC's views; training batches too under `--erasing`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PAD = 4


def normalize(x_uint8: torch.Tensor, mean: tuple = IMAGENET_MEAN, std: tuple = IMAGENET_STD) -> torch.Tensor:
    """ToTensor + Normalize(mean, std) (ImageNet's by default) for a uint8 N x C x H x W batch (one mean and
    std per channel)."""
    mean, std = channel_constants(mean, std, x_uint8.device)
    return (x_uint8.float().div_(255.0) - mean) / std


@lru_cache(maxsize=None)
def channel_constants(mean: tuple, std: tuple, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`mean` and `std` as 1 x C x 1 x 1 tensors on `device`, made once (not a host-to-device copy per batch)."""
    return (torch.tensor(mean, device=device).view(1, -1, 1, 1), torch.tensor(std, device=device).view(1, -1, 1, 1))


def crop_flip(x: torch.Tensor, top: torch.Tensor, left: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """Crop each zero-padded image at (top, left), mirrored where `flip`; one gather for the batch."""
    n, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (PAD, PAD, PAD, PAD))
    ar_h = torch.arange(h, device=x.device)
    ar_w = torch.arange(w, device=x.device)
    rows = top[:, None] + ar_h[None, :]  # n x h
    cols = torch.where(flip[:, None], w - 1 - ar_w[None, :], ar_w[None, :]) + left[:, None]  # n x w
    batch = torch.arange(n, device=x.device)[:, None, None, None]
    chan = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, chan, rows[:, None, :, None], cols[:, None, None, :]]


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` on `device`; from the CPU to a GPU through pinned memory without blocking the host, so that drawing
    a step's augmentation on the CPU does not wait for the GPU to finish the step before."""
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def crop_flip_params(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """The draws of `augment` for n images, on the generator's device: 3 x n (top, left, flip as 0/1), drawn
    in this order: the offsets (2 x n, uniform in {0..8}), then the flips (U(0,1) < 1/2)."""
    dev = generator.device if generator is not None else "cpu"
    offsets = torch.randint(0, 2 * PAD + 1, (2, n), generator=generator, device=dev)
    flip = torch.rand(n, generator=generator, device=dev) < 0.5
    return torch.cat([offsets, flip[None].long()])


def augment(x_uint8: torch.Tensor, generator: torch.Generator | None = None, mean: tuple = IMAGENET_MEAN,
            std: tuple = IMAGENET_STD, params: torch.Tensor | None = None) -> torch.Tensor:
    """Random crop with 4-pixel zero padding, random horizontal flip, normalise; `params`: the draws
    (`crop_flip_params`) when already made, else drawn here from `generator`."""
    p = to_device(crop_flip_params(x_uint8.shape[0], generator) if params is None else params, x_uint8.device)
    return normalize(crop_flip(x_uint8, p[0], p[1], p[2].bool()), mean, std)


@dataclass(frozen=True)
class Transform:
    """A protocol's image pipeline on resident uint8 batches: FPL's by default (random crop with 4-pixel
    padding and flip for training, ImageNet normalisation); `augment=False`: normalisation only."""

    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD
    augment: bool = True
    erase: bool = False  # training batches also get torchvision's RandomErasing, after crop and flip (`--erasing`)

    def train(self, x_uint8: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """A training batch: augmented (drawing from `generator`) when the protocol augments, normalised; then
        erased (drawing from `generator` after the crop and flip) when it erases."""
        x = augment(x_uint8, generator, self.mean, self.std) if self.augment else self.eval(x_uint8)
        return random_erasing(x, generator) if self.erase else x

    def eval(self, x_uint8: torch.Tensor) -> torch.Tensor:
        """A test batch: normalised."""
        return normalize(x_uint8, self.mean, self.std)

    def train_stacked(self, x_uint8: torch.Tensor, idx: torch.Tensor,
                      generators: list[torch.Generator]) -> torch.Tensor:
        """The training batches of k clients at once: `x_uint8` N x C x H x W (the clients' images, one after
        another), `idx` k x B (each client's batch: rows of x_uint8). Client i's batch is
        `train(x_uint8[idx[i]], generators[i])`, the same draws from its generator, made with one gather and one
        host-to-device copy for all the clients."""
        k, b = idx.shape
        x = x_uint8[idx.flatten()]  # k B x C x H x W
        if not self.augment:
            x = self.eval(x).unflatten(0, (k, b))
        else:
            params = torch.cat([crop_flip_params(b, g) for g in generators], dim=1)  # 3 x k B
            x = augment(x, None, self.mean, self.std, params).unflatten(0, (k, b))
        # each client's erasing drawn from its generator after its crop and flip, as `train` draws them
        return torch.stack([random_erasing(xi, g) for xi, g in zip(x, generators)]) if self.erase else x


# torchvision RandomErasing's defaults: probability, erased area share, log-uniform aspect ratio, tries
ERASE_P, ERASE_SCALE, ERASE_RATIO, ERASE_TRIES = 0.5, (0.02, 0.33), (0.3, 3.3), 10


def erasing_params(n: int, h: int, w: int, generator: torch.Generator | None = None, p: float = ERASE_P):
    """Per image the rectangle torchvision's RandomErasing(p, scale, ratio) draws, for a whole batch.

    Drawn in this order from `generator`: apply ~ U(0,1) (n), area share ~ U(scale) (n x tries),
    log aspect ratio ~ U(log ratio) (n x tries), position ~ U(0,1) (2 x n). As torchvision's
    `get_params`, each image takes its first try whose rounded height and width fit inside the
    image (none: not erased) and a top-left corner uniform over the places the box fits.
    Returns (erase n bool, top n, left n, height n, width n).
    """
    dev = generator.device if generator is not None else "cpu"
    apply = torch.rand(n, generator=generator, device=dev) < p
    area = torch.empty(n, ERASE_TRIES, device=dev).uniform_(*ERASE_SCALE, generator=generator) * (h * w)
    log_r = torch.empty(n, ERASE_TRIES, device=dev).uniform_(*torch.tensor(ERASE_RATIO).log().tolist(),
                                                             generator=generator)
    pos = torch.rand(2, n, generator=generator, device=dev)
    eh = torch.sqrt(area * log_r.exp()).round().long()
    ew = torch.sqrt(area / log_r.exp()).round().long()
    fits = (eh < h) & (ew < w)
    first = torch.where(fits.any(dim=1), fits.long().argmax(dim=1), 0)
    eh, ew = eh.gather(1, first[:, None])[:, 0], ew.gather(1, first[:, None])[:, 0]
    erase = apply & fits.any(dim=1)
    top = (pos[0] * (h - eh + 1)).floor().long()  # uniform in {0, ..., h - eh}, as randint(0, h - eh + 1)
    left = (pos[1] * (w - ew + 1)).floor().long()
    return erase, top, left, eh, ew


def erase(x: torch.Tensor, erase_: torch.Tensor, top, left, height, width, value: float = 0.0) -> torch.Tensor:
    """`x` (N x C x H x W) with each image's rectangle [top, top + height) x [left, left + width) set to
    `value` where `erase_`; one mask for the batch."""
    n, _, h, w = x.shape
    dev = x.device
    top, left, height, width, erase_ = (to_device(t, dev) for t in (top, left, height, width, erase_))
    rows = torch.arange(h, device=dev)[None, :]
    cols = torch.arange(w, device=dev)[None, :]
    in_rows = (rows >= top[:, None]) & (rows < (top + height)[:, None])  # n x h
    in_cols = (cols >= left[:, None]) & (cols < (left + width)[:, None])  # n x w
    mask = (in_rows[:, :, None] & in_cols[:, None, :] & erase_[:, None, None])[:, None]  # n x 1 x h x w
    return x.masked_fill(mask, value)


def random_erasing(x: torch.Tensor, generator: torch.Generator | None = None, p: float = ERASE_P) -> torch.Tensor:
    """torchvision's RandomErasing(p, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0) on a batch of normalised
    images (value 0: the channel mean, as after Normalize), each image drawn independently."""
    n, _, h, w = x.shape
    return erase(x, *erasing_params(n, h, w, generator, p))
