"""ConvNeXt stage (two blocks): depthwise 7x7 conv, channels-last LayerNorm, 4x MLP with GELU, layer scale,
residual; then a downsample (LayerNorm over channels, 2x2 stride-2 conv)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        return F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps).permute(0, 3, 1, 2)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6) + torch.rand(dim))

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.fc2(F.gelu(self.fc1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class Model(nn.Module):
    def __init__(self, dim=96):
        super().__init__()
        self.blocks = nn.Sequential(Block(dim), Block(dim))
        self.down_norm, self.down = LayerNorm2d(dim, eps=1e-6), nn.Conv2d(dim, 2 * dim, 2, stride=2)

    def forward(self, x):
        return self.down(self.down_norm(self.blocks(x)))


def get_model():
    torch.manual_seed(0)
    return Model().eval()


def get_inputs():
    return [torch.randn(2, 96, 28, 28)]
