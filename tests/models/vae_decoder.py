"""One up-block of a diffusion VAE decoder (KernelBench form): GroupNorm(32)+SiLU resnet blocks
and a spatial self-attention block, as in the SD VAE decoders."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ResnetBlock(nn.Module):
    def __init__(self, c: int, groups: int = 32):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, c, eps=1e-6)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, c, eps=1e-6)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return x + h


class AttnBlock(nn.Module):
    def __init__(self, c: int, groups: int = 32, module_softmax: bool = True):
        super().__init__()
        self.groups = groups
        self.module_softmax = module_softmax
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c))
        self.qkv = nn.Conv2d(c, 3 * c, 1)
        self.proj = nn.Conv2d(c, c, 1)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        b, c, hgt, wid = x.shape
        h = F.group_norm(x, self.groups, self.weight, self.bias, eps=1e-6)
        q, k, v = self.qkv(h).reshape(b, 3, c, hgt * wid).unbind(1)
        scores = torch.bmm(q.transpose(1, 2), k) * c ** -0.5
        # two equivalent spellings, as codebases mix them
        attn = self.softmax(scores) if self.module_softmax else torch.softmax(scores, dim=-1)
        out = torch.bmm(v, attn.transpose(1, 2)).reshape(b, c, hgt, wid)
        return x + self.proj(out)


class Model(nn.Module):
    def __init__(self, channels: int = 64):
        super().__init__()
        self.res1 = ResnetBlock(channels)
        self.attn = AttnBlock(channels)
        self.attn2 = AttnBlock(channels, module_softmax=False)
        self.res2 = ResnetBlock(channels)
        self.up = nn.Upsample(scale_factor=2.0, mode="nearest")
        self.conv_up = nn.Conv2d(channels, channels, 3, padding=1)
        self.res3 = ResnetBlock(channels)
        self.norm_out = nn.GroupNorm(32, channels, eps=1e-6)
        self.conv_out = nn.Conv2d(channels, 3, 3, padding=1)

    def forward(self, z):
        h = self.res2(self.attn2(self.attn(self.res1(z))))
        h = self.res3(self.conv_up(self.up(h)))
        return self.conv_out(F.silu(self.norm_out(h)))


def get_init_inputs():
    torch.manual_seed(0)
    return [64]


def get_inputs():
    torch.manual_seed(2)
    return [torch.randn(1, 64, 24, 24)]
