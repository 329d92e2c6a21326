"""Batched transforms against torchvision and a per-image reference, on real images."""
from __future__ import annotations

import math
import numpy as np
import pytest
import torch
import torchvision.transforms as T

from benchmark.data import to_tensor_images
from benchmark.transforms import (IMAGENET_MEAN, IMAGENET_STD, Transform, augment, crop_flip, erase, erasing_params,
                                  normalize, random_erasing)

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


@pytest.fixture(scope="module")
def batch(data_root):
    """64 real images as N x 3 x 32 x 32 uint8: 32 SYN (colour) and 32 MNIST (grey)."""
    with np.load(data_root / "digits/syn_test.npz") as z:
        syn = z["x"][:32]
    with np.load(data_root / "digits/mnist_test.npz") as z:
        mnist = z["x"][:32]
    return torch.cat([to_tensor_images(syn), to_tensor_images(mnist)])


def test_constants():
    assert IMAGENET_MEAN == (0.485, 0.456, 0.406) and IMAGENET_STD == (0.229, 0.224, 0.225)


def test_normalize_matches_torchvision(batch):
    tv = T.Compose([T.ToTensor(), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    ref = torch.stack([tv(img.permute(1, 2, 0).numpy()) for img in batch])  # HWC uint8 like a PIL image
    out = normalize(batch)
    assert out.dtype == torch.float32 and out.shape == batch.shape
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)


def _crop_flip_one(img: torch.Tensor, top: int, left: int, flip: bool) -> torch.Tensor:
    c, h, w = img.shape
    padded = torch.zeros(c, h + 8, w + 8, dtype=img.dtype)
    padded[:, 4:4 + h, 4:4 + w] = img
    out = padded[:, top:top + h, left:left + w]
    return torch.flip(out, dims=[2]) if flip else out


def test_crop_flip_matches_per_image_reference(batch):
    g = torch.Generator().manual_seed(0)
    n = len(batch)
    top = torch.randint(0, 9, (n,), generator=g)
    left = torch.randint(0, 9, (n,), generator=g)
    flip = torch.rand(n, generator=g) < 0.5
    # make sure the extremes occur
    top[:4] = torch.tensor([0, 8, 0, 8])
    left[:4] = torch.tensor([0, 8, 8, 0])
    flip[:4] = torch.tensor([True, False, True, False])
    out = crop_flip(batch, top, left, flip)
    assert out.dtype == torch.uint8 and out.shape == batch.shape
    for i in range(n):
        assert torch.equal(out[i], _crop_flip_one(batch[i], int(top[i]), int(left[i]), bool(flip[i]))), i


def test_crop_flip_identity(batch):
    n = len(batch)
    four = torch.full((n,), 4)
    assert torch.equal(crop_flip(batch, four, four, torch.zeros(n, dtype=torch.bool)), batch)
    assert torch.equal(crop_flip(batch, four, four, torch.ones(n, dtype=torch.bool)), batch.flip(3))


def _pattern() -> torch.Tensor:
    """One image whose pixels say where they come from: channel 0 = 10 + 7 * row, channel 1 = 10 + 7 * col."""
    r = torch.arange(32)
    img = torch.empty(3, 32, 32, dtype=torch.uint8)
    img[0] = (10 + 7 * r)[:, None].expand(32, 32)
    img[1] = (10 + 7 * r)[None, :].expand(32, 32)
    img[2] = 200
    return img


def _denormalize(x: torch.Tensor) -> torch.Tensor:
    return (x * STD + MEAN).mul(255).round().to(torch.int64)


@pytest.mark.slow
def test_augment_draws_uniform_offsets_and_fair_flips():
    n = 20_000
    img = _pattern()
    out = augment(img.expand(n, -1, -1, -1).contiguous(), torch.Generator().manual_seed(1))
    assert out.shape == (n, 3, 32, 32) and out.dtype == torch.float32
    # values are normalised [0, 1] pixels
    lo, hi = ((0 - MEAN) / STD).view(3), ((1 - MEAN) / STD).view(3)
    per_c = out.transpose(0, 1).reshape(3, -1)
    assert torch.all(per_c.min(1).values >= lo - 1e-5) and torch.all(per_c.max(1).values <= hi + 1e-5)
    px = _denormalize(out)
    # output pixel (16, 16) comes from original row top + 12 and column left + 12 (no flip) or left + 11 (flip)
    row = (px[:, 0, 16, 16] - 10) // 7
    col16 = (px[:, 1, 16, 16] - 10) // 7
    col17 = (px[:, 1, 16, 17] - 10) // 7
    flip = col17 < col16
    assert torch.all((col17 - col16).abs() == 1)
    top = row - 12
    left = torch.where(flip, col16 - 11, col16 - 12)
    assert top.min() == 0 and top.max() == 8 and left.min() == 0 and left.max() == 8
    for v in (top, left):
        freq = torch.bincount(v, minlength=9).double() / n
        assert torch.all((freq - 1 / 9).abs() < 0.015), freq
    assert abs(flip.double().mean().item() - 0.5) < 0.015
    # independence: chi-square over the 9 x 9 x 2 joint cells (df 161, mean 161, sd ~18)
    joint = torch.bincount(top * 18 + left * 2 + flip.long(), minlength=162).double()
    expected = n / 162
    chi2 = ((joint - expected) ** 2 / expected).sum().item()
    assert chi2 < 161 + 6 * 18, chi2
    # every image is exactly the crop/flip of the recovered draw
    ref = torch.stack([_crop_flip_one(img, int(t), int(l), bool(f))
                       for t, l, f in zip(top[:300], left[:300], flip[:300])])
    torch.testing.assert_close(out[:300], normalize(ref), rtol=0, atol=0)


def test_augment_seeded(batch):
    a = augment(batch, torch.Generator().manual_seed(7))
    b = augment(batch, torch.Generator().manual_seed(7))
    c = augment(batch, torch.Generator().manual_seed(8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # consecutive calls on one generator draw new offsets
    g = torch.Generator().manual_seed(7)
    first, second = augment(batch, g), augment(batch, g)
    assert torch.equal(first, a) and not torch.equal(first, second)


@pytest.mark.parametrize("transform", [Transform(), Transform(mean=(0.5,) * 3, std=(0.5,) * 3, augment=False),
                                       Transform(erase=True)])
def test_train_stacked_is_each_clients_train_batch(batch, transform):
    """The fused engine's input: k clients' batches with one gather equal each client's own `train` batch,
    bit for bit, and leave each client's generator where its own draws would."""
    k, b = 3, 10
    clients = [batch[:20], batch[20:32], batch[32:60]]  # 3 clients of 20, 12 and 28 images, one after another
    idx = torch.stack([torch.randperm(len(x), generator=torch.Generator().manual_seed(i))[:b] + start
                       for i, (x, start) in enumerate(zip(clients, (0, 20, 32)))])
    gens = [torch.Generator().manual_seed(10 + i) for i in range(k)]
    out = transform.train_stacked(torch.cat(clients), idx, gens)
    refs = [torch.Generator().manual_seed(10 + i) for i in range(k)]
    ref = torch.stack([transform.train(x[i - start], r) for x, i, start, r in zip(clients, idx, (0, 20, 32), refs)])
    assert out.shape == (k, b, 3, 32, 32) and torch.equal(out, ref)
    for g, r in zip(gens, refs):  # the same number of draws from every generator
        assert torch.equal(g.get_state(), r.get_state())
    if transform.augment:  # the clients' draws differ: not one client's augmentation repeated
        assert not torch.equal(out[0], transform.train(clients[0][idx[0]], torch.Generator().manual_seed(11)))


def test_erasing_training_batches_erases_after_the_same_crop_and_flip(batch):
    """`erase` (`--erasing`): a training batch is the plain one (the same crop and flip: drawn first from the
    generator) with torchvision's RandomErasing drawn next from that generator, rectangle for rectangle: the
    erased pixels are 0 and every other pixel is the plain batch's."""
    plain = Transform().train(batch, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    erased = Transform(erase=True).train(batch, g)
    g2 = torch.Generator().manual_seed(5)
    augment(batch, g2)  # the crop and flip's draws
    apply, top, left, h, w = erasing_params(len(batch), 32, 32, g2)
    assert 0 < int(apply.sum()) < len(batch)
    for i in range(len(batch)):
        box = torch.zeros(32, 32, dtype=torch.bool)
        if apply[i]:
            box[top[i]:top[i] + h[i], left[i]:left[i] + w[i]] = True
        assert torch.equal(erased[i][:, box], torch.zeros_like(erased[i][:, box]))
        assert torch.equal(erased[i][:, ~box], plain[i][:, ~box])
    assert torch.equal(g.get_state(), g2.get_state())


def _erasing_params_one(u_apply, u_area, u_logr, u_pos, h, w, p=0.5):
    """torchvision's RandomErasing.get_params for one image, written out, from the given uniforms."""
    if not u_apply < p:
        return None
    lo, hi = math.log(0.3), math.log(3.3)
    for a, r in zip(u_area, u_logr):
        area = h * w * (0.02 + (0.33 - 0.02) * a)
        ratio = math.exp(lo + (hi - lo) * r)
        eh, ew = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
        if eh < h and ew < w:
            return int(u_pos[0] * (h - eh + 1)), int(u_pos[1] * (w - ew + 1)), eh, ew
    return None


def test_erasing_params_match_a_per_image_reference():
    n, h, w = 2000, 32, 32
    g = torch.Generator().manual_seed(5)
    erase_, top, left, eh, ew = erasing_params(n, h, w, torch.Generator().manual_seed(5))
    # the same uniforms, in the documented order
    u_apply = torch.rand(n, generator=g)
    u_area = (torch.empty(n, 10).uniform_(0.02, 0.33, generator=g) - 0.02) / 0.31
    lo, hi = math.log(0.3), math.log(3.3)
    u_logr = (torch.empty(n, 10).uniform_(lo, hi, generator=g) - lo) / (hi - lo)
    u_pos = torch.rand(2, n, generator=g)
    for i in range(n):
        ref = _erasing_params_one(float(u_apply[i]), u_area[i].tolist(), u_logr[i].tolist(), u_pos[:, i].tolist(), h, w)
        if ref is None:
            assert not erase_[i], i
        else:
            assert erase_[i] and (int(top[i]), int(left[i]), int(eh[i]), int(ew[i])) == ref, i
    assert 0.4 < erase_.float().mean() < 0.6  # p = 0.5: both branches were checked


def test_erase_matches_slice_assignment(batch):
    x = normalize(batch)
    n, _, h, w = x.shape
    erase_, top, left, eh, ew = erasing_params(n, h, w, torch.Generator().manual_seed(1))
    out = erase(x, erase_, top, left, eh, ew)
    assert erase_.any() and (~erase_).any()
    for i in range(n):
        ref = x[i].clone()
        if erase_[i]:
            ref[:, top[i]:top[i] + eh[i], left[i]:left[i] + ew[i]] = 0.0
        assert torch.equal(out[i], ref), i


def test_random_erasing_has_torchvision_distribution():
    """Share of images erased and mean erased area of `random_erasing` vs torchvision's RandomErasing."""
    n = 4000
    ones = torch.ones(n, 1, 32, 32)
    ours = random_erasing(ones, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    tv = T.RandomErasing()
    theirs = torch.stack([tv(img) for img in ones])
    for out in (ours, theirs):
        assert set(out.unique().tolist()) <= {0.0, 1.0}
    erased = lambda o: (o == 0).flatten(1).float().sum(1)  # noqa: E731  (pixels erased per image)
    e_ours, e_tv = erased(ours), erased(theirs)
    assert abs((e_ours > 0).float().mean() - (e_tv > 0).float().mean()) < 0.04
    assert abs(e_ours[e_ours > 0].mean() - e_tv[e_tv > 0].mean()) < 0.06 * e_tv[e_tv > 0].mean()
