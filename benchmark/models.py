"""The models, by name: CIFAR-style ResNet-10 of FPL (PROTOCOL.md section 1, 4,903,242 parameters) and
FedPLVM's ResNet-10 for 64x64 inputs (section 2), and FedProto's MNIST CNN (`benchmark.cnn`, section 4).

A model maps images to (logits, features) and has `features(x)`, `feature_dim` and
`num_classes`; `build_model` makes the one a dataset's spec names (benchmark/protocols.py), channels_last.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from benchmark.cnn import CNNMnist


def norm_layer(norm: str, channels: int) -> nn.Module:
    """BatchNorm2d, or (`group`) the GroupNorm that Opacus's `ModuleValidator.fix` puts in a BatchNorm's place for
    DP-SGD (gcd(32, channels) groups, affine; its weight and bias start as BatchNorm's, ones and zeros): per-sample
    statistics, so no sample's output depends on the others of its batch, and no running statistics (the model
    normalises alike in training and in eval mode)."""
    if norm == "group":
        return nn.GroupNorm(math.gcd(32, channels), channels)
    return nn.BatchNorm2d(channels)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm: str = "batch"):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = norm_layer(norm, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = norm_layer(norm, cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), norm_layer(norm, cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet10(nn.Module):
    """conv3x3(3->64) + BN + ReLU, no max-pool; one BasicBlock per stage (64/128/256/512,
    strides 1/2/2/2); global average pool -> 512-d post-ReLU feature; Linear(512, classes). `norm="group"`:
    GroupNorm in every BatchNorm's place, as Opacus's `ModuleValidator.fix` makes it (`norm_layer`: DP-SGD)."""

    feature_dim = 512

    def __init__(self, num_classes: int = 10, norm: str = "batch"):
        super().__init__()
        self.num_classes = num_classes
        self.conv1 = self.stem()
        self.bn1 = norm_layer(norm, 64)
        widths, strides, cin, layers = (64, 128, 256, 512), (1, 2, 2, 2), 64, []
        for w, s in zip(widths, strides):
            layers.append(BasicBlock(cin, w, s, norm))
            cin = w
        self.layers = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, num_classes)

    def stem(self) -> nn.Module:
        return nn.Conv2d(3, 64, 3, 1, 1, bias=False)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        return x  # no max-pool after the stem

    def features(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(self.pool(F.relu(self.bn1(self.conv1(x)))))
        return F.adaptive_avg_pool2d(out, 1).flatten(1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (logits, features)."""
        z = self.features(x)
        return self.classifier(z), z


class ResNet10PLVM(ResNet10):
    """FedPLVM's resnet10 (its models/resnet.py, for 64x64 inputs): the same stages on a conv5x5 stride-2
    padding-1 stem and a 3x3 stride-2 max-pool; convolutions Kaiming-normal (fan_out) initialised as
    there. Its two unused heads (fc1, fc2) are left out (docs/deviations.md)."""

    def __init__(self, num_classes: int = 10, norm: str = "batch"):
        super().__init__(num_classes, norm)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def stem(self) -> nn.Module:
        return nn.Conv2d(3, 64, 5, 2, 1, bias=False)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, 3, 2, 1)


MODELS = {"resnet10": ResNet10, "resnet10_plvm": ResNet10PLVM, "cnn_mnist": CNNMnist}


def build_model(name: str, num_classes: int, **kwargs) -> nn.Module:
    """A freshly initialised model (torch's global RNG) by name; `kwargs` its architecture's options
    (a client's own, e.g. FedProto-mh's `conv2_channels`). Its convolution weights are channels_last
    (NHWC), and so are the activations they produce: faster convolutions, the same model (`make bench` (7))."""
    return MODELS[name](num_classes, **kwargs).to(memory_format=torch.channels_last)
