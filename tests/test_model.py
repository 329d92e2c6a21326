"""FPL's CIFAR-style ResNet-10 (PROTOCOL.md section 1)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmark.data import to_tensor_images
from benchmark.models import ResNet10
from benchmark.transforms import normalize


@pytest.fixture(scope="module")
def images(data_root):
    with np.load(data_root / "digits/usps_test.npz") as z:
        usps = z["x"][:6]
    with np.load(data_root / "office_caltech10/dslr.npz") as z:
        office = z["x"][:6]
    return normalize(torch.cat([to_tensor_images(usps), to_tensor_images(office)]))


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_parameter_count():
    net = ResNet10(10)
    assert _count(net) == 4_903_242
    # by hand: stem conv 3*64*9 + BN 2*64; per block two 3x3 convs + 2 BN (+ 1x1 shortcut conv + BN)
    stem = 3 * 64 * 9 + 2 * 64
    block1 = 2 * (64 * 64 * 9) + 2 * 2 * 64
    def down(cin, cout):
        return cin * cout * 9 + cout * cout * 9 + 2 * 2 * cout + cin * cout + 2 * cout
    head = 512 * 10 + 10
    assert stem + block1 + down(64, 128) + down(128, 256) + down(256, 512) + head == 4_903_242
    assert (sum(b.numel() for n, b in net.named_buffers() if "running" in n)
            == 2 * (64 + 2 * 64 + 128 * 3 + 256 * 3 + 512 * 3))


def test_shapes_and_nonnegative_features(images):
    torch.manual_seed(0)
    net = ResNet10(10)
    for mode in (net.train, net.eval):
        mode()
        with torch.no_grad():
            logits, z = net(images)
            f = net.features(images)
        assert logits.shape == (12, 10) and z.shape == (12, 512)
        assert torch.all(z >= 0) and (z > 0).any()
        torch.testing.assert_close(f, z)
        torch.testing.assert_close(logits, z @ net.classifier.weight.T + net.classifier.bias)


def test_no_maxpool_stride1_stem():
    net = ResNet10(10).eval()
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in net.modules())
    # a 32x32 input keeps 32x32 after the stem and ends at 4x4 before pooling (strides 1/2/2/2)
    x = torch.zeros(1, 3, 32, 32)
    with torch.no_grad():
        stem = net.conv1(x)
        out = net.layers(torch.relu(net.bn1(stem)))
    assert stem.shape[-2:] == (32, 32) and out.shape == (1, 512, 4, 4)
