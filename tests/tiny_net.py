"""A tiny model with ResNet10's interface for fast client-module tests."""
import torch.nn.functional as F
from torch import nn


class TinyNet(nn.Module):
    """The ResNet10 interface (features, (logits, z), feature_dim) at a tiny size, BatchNorm included."""

    feature_dim = 6

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.num_classes = num_classes
        self.conv = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.classifier = nn.Linear(6, num_classes)

    def features(self, x):
        return F.adaptive_avg_pool2d(F.relu(self.bn(self.conv(x))), 1).flatten(1)

    def forward(self, x):
        z = self.features(x)
        return self.classifier(z), z
