"""A torchvision ResNet stem: 7x7 stride-2 conv, inference BatchNorm, ReLU, then
max_pool2d(3, stride 2, padding 1): one window region (batch_norm + relu + max_pool2d)."""

import torch
import torch.nn as nn


class Stem(nn.Module):
    def __init__(self, c: int = 16):
        super().__init__()
        self.conv1 = nn.Conv2d(3, c, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

    def forward(self, x):
        return self.maxpool(self.relu(self.bn1(self.conv1(x))))


def get_model():
    torch.manual_seed(0)
    model = Stem()
    with torch.no_grad():
        model.bn1.running_mean.normal_(0.0, 0.2)
        model.bn1.running_var.uniform_(0.5, 1.5)
        model.bn1.weight.normal_(1.0, 0.1)
        model.bn1.bias.normal_(0.0, 0.1)
    return model.eval()


def get_inputs(size: int = 18):
    # 18 -> conv 9x9 -> pool 5x5: the last window's right half is padding
    torch.manual_seed(1)
    return (torch.randn(2, 3, size, size),)
