"""Batched image transforms on uint8 tensors, on whatever device the batch lives.

`augment` draws the same distribution as torchvision's
RandomCrop(32, padding=4) -> RandomHorizontalFlip -> ToTensor -> Normalize:
per image an offset (i, j) uniform in {0..8}^2 into the zero-padded 40x40
image and a flip with probability 1/2, done for the whole batch with one
gather instead of per image through PIL. A dataset's protocol names its
`Transform` (normalisation, and which of crop and flip its training batches get).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PAD = 4


def normalize(x_uint8: torch.Tensor, mean: tuple = IMAGENET_MEAN, std: tuple = IMAGENET_STD) -> torch.Tensor:
    """ToTensor + Normalize(mean, std) (ImageNet's by default) for a uint8 N x C x H x W batch (one mean and
    std per channel)."""
    mean = torch.tensor(mean, device=x_uint8.device).view(1, -1, 1, 1)
    std = torch.tensor(std, device=x_uint8.device).view(1, -1, 1, 1)
    return (x_uint8.float().div_(255.0) - mean) / std


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


def augment(x_uint8: torch.Tensor, generator: torch.Generator | None = None, mean: tuple = IMAGENET_MEAN,
            std: tuple = IMAGENET_STD) -> torch.Tensor:
    """Random crop with 4-pixel zero padding, random horizontal flip, normalise."""
    n = x_uint8.shape[0]
    dev = x_uint8.device
    offsets = torch.randint(0, 2 * PAD + 1, (2, n), generator=generator, device=generator.device if generator else "cpu")
    flip = torch.rand(n, generator=generator, device=offsets.device) < 0.5
    offsets, flip = offsets.to(dev), flip.to(dev)
    return normalize(crop_flip(x_uint8, offsets[0], offsets[1], flip), mean, std)


@dataclass(frozen=True)
class Transform:
    """A protocol's image pipeline on resident uint8 batches: FPL's by default (random crop with 4-pixel
    padding and flip for training, ImageNet normalisation); `augment=False`: normalisation only."""

    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD
    augment: bool = True

    def train(self, x_uint8: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """A training batch: augmented (drawing from `generator`) when the protocol augments, normalised."""
        return augment(x_uint8, generator, self.mean, self.std) if self.augment else self.eval(x_uint8)

    def eval(self, x_uint8: torch.Tensor) -> torch.Tensor:
        """A test batch: normalised."""
        return normalize(x_uint8, self.mean, self.std)
