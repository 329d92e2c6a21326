"""FedProto's MNIST CNN (PROTOCOL.md section 4; `CNNMnist` of the official code, yuetan031/FedProto).

conv5x5(in -> 10) -> max-pool 2 -> ReLU; conv5x5(10 -> c2) -> Dropout2d(0.5) -> max-pool 2 -> ReLU;
flatten (c2 x 4 x 4 for a 28 x 28 input) -> fc1 (-> 50) -> ReLU: the 50-d prototype feature;
dropout(0.5) -> fc2 (-> classes). c2 is 20 by default; FedProto-mh gives clients 18, 20 or 22.
The input is the 1-channel 28 x 28 MNIST image (no resize). 21,840 parameters with c2 = 20.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CNNMnist(nn.Module):
    feature_dim = 50
    global_stream = True  # its dropout draws from torch's global random stream while training (one per process)

    def __init__(self, num_classes: int = 10, conv2_channels: int = 20, in_channels: int = 1):
        super().__init__()
        self.num_classes = num_classes
        self.conv1 = nn.Conv2d(in_channels, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, conv2_channels, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(16 * conv2_channels, self.feature_dim)
        self.classifier = nn.Linear(self.feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        return F.relu(self.fc1(x.flatten(1)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (logits, features); the reference's log-softmax + NLL is our cross-entropy on the logits."""
        z = self.features(x)
        return self.classifier(F.dropout(z, training=self.training)), z
