"""ResNet-50 inference, the issue-8 way: torchvision `resnet50(weights=None)` (random weights, no
download), eval mode, bf16, batch 256 of 224x224 images, NCHW.

Real sizes (the defaults): input (256, 3, 224, 224) bf16; the targets forge-pack sees are the 53
BatchNorm2d calls in inference (about 33% of the forward on an H200) and one
adaptive_avg_pool2d -> (1, 1) on (256, 2048, 7, 7) (the published 1.52x figure).

Environment knobs (all optional):
- FORGE_BENCH_SMALL=1           CPU smoke test only: batch 2, 112x112 (avgpool on (2, 2048, 4, 4)).
- FORGE_BENCH_DTYPE=float32     instead of bfloat16.
- FORGE_BENCH_DEVICE=cpu|cuda   where the weights are created (default: cuda when present;
                                forge-pack's --device moves the model anyway).
- FORGE_BENCH_CHANNELS_LAST=1   channels_last model and input (the default is NCHW, as eager runs it).
"""

import os

import torch

SMALL = os.environ.get("FORGE_BENCH_SMALL", "") not in ("", "0")
DTYPE = getattr(torch, os.environ.get("FORGE_BENCH_DTYPE", "bfloat16"))
CHANNELS_LAST = os.environ.get("FORGE_BENCH_CHANNELS_LAST", "") not in ("", "0")
BATCH, SIZE = (2, 112) if SMALL else (256, 224)


def _device() -> str:
    return os.environ.get("FORGE_BENCH_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


def get_model() -> torch.nn.Module:
    from torchvision.models import resnet50

    torch.manual_seed(0)
    with torch.device(_device()):
        model = resnet50(weights=None)
    model = model.to(DTYPE).eval()
    if CHANNELS_LAST:
        model = model.to(memory_format=torch.channels_last)
    return model


def get_inputs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, 3, SIZE, SIZE, generator=g).to(DTYPE)
    if CHANNELS_LAST:
        x = x.contiguous(memory_format=torch.channels_last)
    return (x,)
