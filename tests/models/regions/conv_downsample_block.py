"""A torchvision-style bottleneck with a downsampling shortcut: conv1x1 + BN + ReLU, conv3x3 (stride 2) + BN
+ ReLU, conv1x1 + BN, added (in place, as torchvision writes it) to the shortcut's conv1x1 (stride 2) + BN, ReLU."""

import torch
import torch.nn as nn


class Bottleneck(nn.Module):
    def __init__(self, cin: int = 16, width: int = 8, cout: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=2, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = self.downsample(x)
        out += identity
        return self.relu(out)


def get_model():
    torch.manual_seed(0)
    model = Bottleneck()
    with torch.no_grad():
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.running_mean.normal_(0.0, 0.2)
            bn.running_var.uniform_(0.5, 1.5)
            bn.weight.normal_(1.0, 0.1)
            bn.bias.normal_(0.0, 0.1)
    return model.eval()


def get_inputs(size: int = 8):
    torch.manual_seed(1)
    return (torch.randn(2, 16, size, size),)
