"""The issue-4 benchmark shapes as one model file: each target signature called once per forward.

`forge-pack search bench/shapes/issue4_shapes.py --device cuda --top 12 --min-share 0` searches
every one of them as its own hotspot, on real captured inputs, timed against eager and
torch.compile in the same worker. Shapes: SD3.5 VAE group_norm, Gemma-style
attention softmax (bf16 in, fp32 out), MoE routers, a long fp32 row softmax, ResNet-50's pool
and batch_norm at batch 256 (bf16).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

BF16 = torch.bfloat16
BN_SHAPES = ((256, 256, 56, 56),)  # ResNet-50 layer1 at batch 256: 411 MB in bf16


class Shapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.gn_big = nn.GroupNorm(32, 128).to(BF16)
        self.gn_small = nn.GroupNorm(32, 512).to(BF16)
        self.bns = nn.ModuleList(nn.BatchNorm2d(s[1]).to(BF16).eval() for s in BN_SHAPES)
        with torch.no_grad():
            for m in [self.gn_big, self.gn_small, *self.bns]:
                m.weight.normal_(1.0, 0.1)
                m.bias.normal_(0.0, 0.1)
            for bn in self.bns:
                bn.running_mean.normal_(0.0, 0.1)
                bn.running_var.uniform_(0.5, 1.5)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, gn_big, gn_small, attn, router_a, router_b, long_rows, pool_in, *bn_in):
        outs = [self.gn_big(gn_big), self.gn_small(gn_small),
                F.softmax(attn, dim=-1, dtype=torch.float32),
                router_a.softmax(dim=-1, dtype=torch.float32),
                router_b.softmax(dim=-1, dtype=torch.float32),
                torch.softmax(long_rows, dim=-1),
                self.pool(pool_in)]
        outs += [bn(x) for bn, x in zip(self.bns, bn_in)]
        return outs


def get_model():
    torch.manual_seed(0)
    return Shapes()


def get_inputs():
    torch.manual_seed(1)
    return (torch.randn(1, 128, 1024, 1024, dtype=BF16), torch.randn(1, 512, 128, 128, dtype=BF16),
            torch.randn(1, 8, 2048, 2048, dtype=BF16) * 3, torch.randn(2048, 256, dtype=BF16) * 2,
            torch.randn(4096, 256, dtype=BF16) * 2, torch.randn(8, 262144) * 4,
            torch.randn(256, 2048, 7, 7, dtype=BF16), *(torch.randn(*s, dtype=BF16) for s in BN_SHAPES))
