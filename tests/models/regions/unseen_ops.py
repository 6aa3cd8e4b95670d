"""Ops of models forge-pack was not built on, one block: Gemma's RMSNorm (``type_as``), Llama's rotary tables
(cos, sin), a transformers mask builder from positions (``new_ones``, ``&``), MobileNetV3's hardswish, ELU / SELU / softplus /
mish, ConvNeXt V2's global response norm (a 2-norm over the spatial dims of an NHWC view, ``addcmul``),
ConvNeXt's layer scale permuted back to NCHW before the residual add, and Swin's shifted-window logits (a
per-window mask added over [B, nW, heads, L, L], viewed back to [B * nW, ...], softmax), and KernelBench's
RMSNorm over the channels of NCHW (the input divided by it: the epilogue in the reduction's dim order). Every region here is one the generated
kernels compute (tests/test_region_cuda_compile.py builds each with nvcc and NVRTC)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, c: int = 32):
        super().__init__()
        self.norm_w = nn.Parameter(torch.randn(c) * 0.1)
        self.grn_w, self.grn_b = nn.Parameter(torch.randn(c) * 0.1), nn.Parameter(torch.randn(c) * 0.1)
        self.gamma = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x, seq, angles, pos, attn, wmask):
        # an LLM's pieces over a [B, L, C] sequence
        sf = seq.float()
        h = (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + self.norm_w.float())).type_as(seq)
        rope = (angles.cos() * 0.5).to(seq.dtype) + (angles.sin() * 0.5).to(seq.dtype)
        keep = (pos[:, None] >= pos[None, :]) & seq.new_ones((seq.shape[1], seq.shape[1]), dtype=torch.bool)
        mask = torch.where(keep, 0.0, torch.finfo(seq.dtype).min).to(seq.dtype)
        mixed = torch.matmul(h + rope, h.transpose(1, 2)) + mask
        # a vision block's pieces over [N, C, H, W]
        y = x.permute(0, 2, 3, 1)
        gx = torch.linalg.vector_norm(y, ord=2, dim=(1, 2), keepdim=True)
        nx = gx / (gx.mean(dim=-1, keepdim=True) + 1e-6)
        y = torch.addcmul(self.grn_b, self.grn_w, y * nx) + y
        y = F.mish(F.softplus(F.selu(F.elu(F.hardswish(y), 0.7)), beta=2.0))
        z = x + (self.gamma * y).permute(0, 3, 1, 2)
        # Swin's shifted-window logits
        nw, heads, n = wmask.shape[0], attn.shape[1], attn.shape[-1]
        w = attn.view(attn.shape[0] // nw, nw, heads, n, n) + wmask.unsqueeze(1).unsqueeze(0)
        rms = x * 2.0 / torch.sqrt(torch.mean((x * 2.0) ** 2, dim=1, keepdim=True) + 1e-5)
        return mixed, z, torch.softmax(w.view(-1, heads, n, n), dim=-1), rms


def get_model():
    torch.manual_seed(0)
    return Model().eval()


def get_inputs():
    torch.manual_seed(0)
    return [torch.randn(2, 32, 6, 5), torch.randn(2, 12, 32), torch.randn(1, 12, 32) * 3, torch.arange(12),
            torch.randn(8, 3, 16, 16), torch.randn(4, 16, 16) * 3]
