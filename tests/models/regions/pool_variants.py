"""Poolings as models use them, each with a pointwise prologue or epilogue:

- bn + max_pool2d(3, 2, 1, ceil_mode=True) with no ReLU between: the values can be negative, so
  padding must count as -inf, not 0, and the last window starts inside and ends past the input;
- avg_pool2d(3, 2, 1, ceil_mode=True, count_include_pad=False) * 0.5 + shortcut (an epilogue
  reading a second input at the pooled shape);
- avg_pool2d(2, ceil_mode=True) (count_include_pad=True) on a 9x9 input: a last window past the edge
  whose divisor counts only what lies inside the padded input;
- silu + avg_pool2d(3, 1, 1) with divisor_override=4;
- relu + adaptive_avg_pool2d to 4x4 from 9x9: overlapping windows of 3 cells."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Pools(nn.Module):
    def __init__(self, c: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.down = nn.Conv2d(c, c, 1, stride=2, bias=False)

    def forward(self, x):
        a = F.max_pool2d(self.bn(self.conv(x)), 3, 2, 1, ceil_mode=True)
        b = F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False) * 0.5 + self.down(x)
        c = F.avg_pool2d(self.conv(x), 2, ceil_mode=True)
        d = F.avg_pool2d(F.silu(self.down(x)), 3, 1, 1, divisor_override=4)
        e = F.adaptive_avg_pool2d(torch.relu(x - 0.5), (4, 4))
        return a, b, c, d, e


def get_model():
    torch.manual_seed(0)
    model = Pools()
    with torch.no_grad():
        model.bn.running_mean.normal_(0.0, 0.2)
        model.bn.running_var.uniform_(0.5, 1.5)
        model.bn.weight.normal_(1.0, 0.1)
        model.bn.bias.normal_(0.0, 0.1)
    return model.eval()


def get_inputs(size: int = 9):
    torch.manual_seed(1)
    return (torch.randn(2, 8, size, size),)
