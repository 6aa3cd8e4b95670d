"""Stable Diffusion 3.5's VAE decoder, the issue-8 way: diffusers `AutoencoderKL` built from SD3.5's
VAE configuration (random weights, no download), bf16, decoding one (1, 16, 128, 128) latent to a
1024x1024 image. The forward is what the SD3 pipeline does at the end:
`vae.decode(latent / scaling_factor + shift_factor).sample`.

SD3.5 (Medium / Large) VAE configuration: in/out channels 3, latent_channels 16,
block_out_channels (128, 256, 512, 512), 4 DownEncoderBlock2D / 4 UpDecoderBlock2D,
layers_per_block 2, norm_num_groups 32, act silu, mid-block attention, use_quant_conv False,
use_post_quant_conv False, scaling_factor 1.5305, shift_factor 0.0609, sample_size 1024.

Real sizes (the defaults): latent (1, 16, 128, 128) -> image (1, 3, 1024, 1024). forge-pack's
target is nn.GroupNorm(32) (30 calls; e.g. (1, 512, 128..512, ...), (1, 256, 512, 512),
(1, 128, 1024, 1024)): its statistics kernel is about half of the decode's GPU time in eager.

Environment knobs (all optional):
- FORGE_BENCH_SMALL=1           CPU smoke test only: latent (1, 16, 16, 16) -> 128x128 image.
- FORGE_BENCH_DTYPE=float32     instead of bfloat16.
- FORGE_BENCH_DEVICE=cpu|cuda   where the weights are created (default: cuda when present).
"""

import os

import torch

SMALL = os.environ.get("FORGE_BENCH_SMALL", "") not in ("", "0")
DTYPE = getattr(torch, os.environ.get("FORGE_BENCH_DTYPE", "bfloat16"))
LATENT = 16 if SMALL else 128  # image side = 8 x latent side

SD35_VAE_CONFIG = dict(
    in_channels=3, out_channels=3, latent_channels=16,
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(128, 256, 512, 512), layers_per_block=2, act_fn="silu", norm_num_groups=32,
    sample_size=1024, scaling_factor=1.5305, shift_factor=0.0609, force_upcast=True,
    use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=True,
)


def _device() -> str:
    return os.environ.get("FORGE_BENCH_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


class VAEDecode(torch.nn.Module):
    """latent -> image, as the SD3 pipeline decodes (un-scale, un-shift, decode)."""

    def __init__(self, vae):
        super().__init__()
        self.vae = vae
        self.scaling_factor = vae.config.scaling_factor
        self.shift_factor = vae.config.shift_factor

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latent / self.scaling_factor + self.shift_factor).sample


def get_model() -> torch.nn.Module:
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    with torch.device(_device()):
        vae = AutoencoderKL(**SD35_VAE_CONFIG)
    return VAEDecode(vae.to(DTYPE)).eval()


def get_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(1, 16, LATENT, LATENT, generator=g).to(DTYPE),)
