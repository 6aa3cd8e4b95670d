"""Convolution epilogue chains beyond ResNet's: a strided grouped conv with a bias + BatchNorm + SiLU, a
1x1 conv + BatchNorm + GELU (tanh), a dilated conv + BatchNorm added to a shortcut without an activation,
a conv whose output is read twice (not a chain), and a conv + BatchNorm added to its own input (the chain stops
at the BatchNorm)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Variants(nn.Module):
    def __init__(self, c: int = 8):
        super().__init__()
        self.down = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1, groups=2, bias=True)
        self.bn_down = nn.BatchNorm2d(2 * c)
        self.point = nn.Conv2d(2 * c, 2 * c, 1, bias=False)
        self.bn_point = nn.BatchNorm2d(2 * c)
        self.dil = nn.Conv2d(2 * c, 2 * c, 3, padding=2, dilation=2, bias=False)
        self.bn_dil = nn.BatchNorm2d(2 * c)
        self.twice = nn.Conv2d(2 * c, 2 * c, 1, bias=False)
        self.own = nn.Conv2d(2 * c, 2 * c, 3, padding=1, bias=False)
        self.bn_own = nn.BatchNorm2d(2 * c)

    def forward(self, x):
        h = F.silu(self.bn_down(self.down(x)))
        g = F.gelu(self.bn_point(self.point(h)), approximate="tanh")
        s = self.bn_dil(self.dil(g)) + h
        t = self.twice(s)
        u = t * t.sigmoid()
        return torch.relu(self.bn_own(self.own(u)) + u)


def get_model():
    torch.manual_seed(0)
    model = Variants()
    with torch.no_grad():
        for bn in (model.bn_down, model.bn_point, model.bn_dil, model.bn_own):
            bn.running_mean.normal_(0.0, 0.2)
            bn.running_var.uniform_(0.5, 1.5)
            bn.weight.normal_(1.0, 0.1)
            bn.bias.normal_(0.0, 0.1)
    return model.eval()


def get_inputs(size: int = 10):
    torch.manual_seed(1)
    return (torch.randn(2, 8, size, size),)
