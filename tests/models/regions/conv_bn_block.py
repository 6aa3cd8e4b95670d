"""A torchvision-style basic block: conv + BatchNorm + ReLU, conv + BatchNorm, the identity
added, ReLU (inference BatchNorm with trained-looking running statistics)."""

import torch
import torch.nn as nn


class BasicBlock(nn.Module):
    def __init__(self, c: int = 16):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.relu2 = nn.ReLU()

    def forward(self, x):
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + x)


def get_model():
    torch.manual_seed(0)
    model = BasicBlock()
    with torch.no_grad():
        for bn in (model.bn1, model.bn2):
            bn.running_mean.normal_(0.0, 0.2)
            bn.running_var.uniform_(0.5, 1.5)
            bn.weight.normal_(1.0, 0.1)
            bn.bias.normal_(0.0, 0.1)
    return model.eval()


def get_inputs(size: int = 8):
    torch.manual_seed(1)
    return (torch.randn(2, 16, size, size),)
