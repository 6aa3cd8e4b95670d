"""A diffusion-VAE-style resnet block (diffusers' ResnetBlock2D shape): GroupNorm(32)+SiLU,
conv, a time-embedding add before the second GroupNorm+SiLU, conv, and the residual add scaled
by the output factor."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ResnetBlock(nn.Module):
    def __init__(self, c: int = 64, temb_dim: int = 32, groups: int = 32, scale: float = 1.0):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, c, eps=1e-6)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb_dim, c)
        self.norm2 = nn.GroupNorm(groups, c, eps=1e-6)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.output_scale_factor = scale

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return (x + h) / self.output_scale_factor


def get_model():
    torch.manual_seed(0)
    model = ResnetBlock(scale=2.0)
    with torch.no_grad():
        for norm in (model.norm1, model.norm2):
            norm.weight.normal_(1.0, 0.1)
            norm.bias.normal_(0.0, 0.1)
    return model.eval()


def get_inputs(size: int = 8):
    torch.manual_seed(1)
    return (torch.randn(2, 64, size, size), torch.randn(2, 32))
