"""A small ResNet-style classifier: conv + BatchNorm/GroupNorm blocks and an adaptive-avg-pool head.

Written the way torchvision-style code is written; forge-pack's example for vision workloads.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, cout, 1, bias=False)
        # the last norm of the block as a direct functional call, as some codebases fold BN by hand
        self.register_buffer("bn3_mean", torch.zeros(cout))
        self.register_buffer("bn3_var", torch.ones(cout))
        self.bn3_weight = nn.Parameter(torch.ones(cout))
        self.bn3_bias = nn.Parameter(torch.zeros(cout))
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = F.batch_norm(self.conv3(y), self.bn3_mean, self.bn3_var, self.bn3_weight, self.bn3_bias,
                         training=False, eps=1e-5)
        return F.relu(y + idt)


class GNBlock(nn.Module):
    """A GroupNorm block (as in detection backbones that avoid batch statistics)."""

    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.gn = nn.GroupNorm(8, c)
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c))

    def forward(self, x):
        y = self.gn(self.conv(x))
        y = torch.group_norm(F.silu(y), 8, self.weight, self.bias, 1e-5)
        return x + y


class VisionNet(nn.Module):
    def __init__(self, classes: int = 100):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32),
                                  nn.ReLU())
        self.stage1 = Bottleneck(32, 16, 64)
        self.stage2 = Bottleneck(64, 32, 128, stride=2)
        self.gn = GNBlock(128)
        # a frozen BatchNorm applied through the aten-level call (as fused/exported code does)
        self.register_buffer("frozen_mean", torch.zeros(128))
        self.register_buffer("frozen_var", torch.ones(128))
        self.register_buffer("frozen_weight", torch.ones(128))
        self.register_buffer("frozen_bias", torch.zeros(128))
        self.stage3 = Bottleneck(128, 64, 256, stride=2)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(256 + 128, classes)

    def forward(self, x):
        x = self.stem(x)
        x = self.stage2(self.stage1(x))
        x = self.gn(x)
        x = torch.batch_norm(x, self.frozen_weight, self.frozen_bias, self.frozen_mean, self.frozen_var,
                             False, 0.0, 1e-5, False)
        side = F.adaptive_avg_pool2d(x, 1).flatten(1)  # a second head path through the functional call
        x = self.stage3(x)
        x = self.pool(x).flatten(1)
        return self.fc(torch.cat([x, side], dim=1))


def get_model():
    torch.manual_seed(0)
    model = VisionNet()
    for m in model.modules():  # non-trivial running statistics, as a trained model has
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return model


def get_inputs():
    torch.manual_seed(1)
    return (torch.randn(8, 3, 64, 64),)
