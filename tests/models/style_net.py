"""A small style-transfer network (Johnson et al.'s layout): conv layers with instance normalisation,
residual blocks, an upsampling decoder. Instance norm as the module (affine, the usual) and as the
functional call some codebases write by hand."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvIN(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2)
        self.norm = nn.InstanceNorm2d(cout, affine=True)

    def forward(self, x):
        return F.relu(self.norm(self.conv(x)))


class Residual(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c))

    def forward(self, x):
        y = F.relu(F.instance_norm(self.conv1(x), weight=self.weight, bias=self.bias))
        return x + F.instance_norm(self.conv2(y))  # the second without affine


class StyleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(ConvIN(3, 16, 9), ConvIN(16, 32, 3, 2), ConvIN(32, 64, 3, 2))
        self.res = nn.Sequential(Residual(64), Residual(64))
        self.up1 = ConvIN(64, 32, 3)
        self.up2 = ConvIN(32, 16, 3)
        self.out = nn.Conv2d(16, 3, 9, padding=4)

    def forward(self, x):
        y = self.res(self.enc(x))
        y = self.up1(F.interpolate(y, scale_factor=2, mode="nearest"))
        y = self.up2(F.interpolate(y, scale_factor=2, mode="nearest"))
        return self.out(y)


def get_model():
    torch.manual_seed(0)
    return StyleNet()


def get_inputs():
    torch.manual_seed(1)
    return (torch.randn(2, 3, 64, 64),)
