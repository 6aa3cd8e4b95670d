"""Can a library convolution with a fused epilogue beat torch.compile on ResNet-50's conv blocks?

    python bench/conv_epilogue_probe.py [--batch 256] [--dtype bfloat16] [--out BASE]

For each ResNet-50 convolution shape (the three convolutions of one bottleneck per stage,
channels_last), it times, with CUDA events in one process and one run:
  eager       conv (no bias) -> batch_norm (eval) [-> + residual] -> relu, as torchvision runs it
  compile     torch.compile of the same chain with the batch_norm folded into the conv first (what
              `freezing=True` does to a frozen model): Inductor's conv call plus its fused pointwise kernel
  cudnn_fused torch.cudnn_convolution_relu / torch.cudnn_convolution_add_relu on the folded weight and
              bias: cuDNN computes bias + residual + relu in the convolution's epilogue, one write
and the whole torchvision ResNet-50 (random weights, eval) as eager, torch.compile (default and
freezing) and with every conv+bn(+add)+relu replaced by the cuDNN fused call (eager and under
torch.compile). Max |difference| against the float32 model is reported per variant. Writes
BASE.{md,json} (default bench/results/conv_epilogue). About 3-4 minutes on an H200.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

# (in_channels, out_channels, kernel, stride, H = W of the input, residual after it)
LAYERS = [
    (256, 64, 1, 1, 56, False), (64, 64, 3, 1, 56, False), (64, 256, 1, 1, 56, True),
    (512, 128, 1, 1, 28, False), (128, 128, 3, 1, 28, False), (128, 512, 1, 1, 28, True),
    (1024, 256, 1, 1, 14, False), (256, 256, 3, 1, 14, False), (256, 1024, 1, 1, 14, True),
    (2048, 512, 1, 1, 7, False), (512, 512, 3, 1, 7, False), (512, 2048, 1, 1, 7, True),
]


def fold(conv, bn):
    """(weight, bias) of the convolution with the eval batch_norm folded in: the package's own folding
    (forge_pack/graph/conv_fold.py), so the probe times the weights a package would ship."""
    from forge_pack.graph.conv_fold import fold as fold_params

    return fold_params(conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.eps)


def time_ms(fn, reps: int = 50, warm: int = 10) -> float:
    import torch

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def layer_rows(batch, dtype):
    import torch
    import torch.nn.functional as F

    rows = []
    for cin, cout, k, stride, hw, residual in LAYERS:
        torch.manual_seed(0)
        conv = torch.nn.Conv2d(cin, cout, k, stride, k // 2, bias=False).cuda()
        bn = torch.nn.BatchNorm2d(cout).cuda().eval()
        with torch.no_grad():
            bn.running_mean.normal_(0, 0.1)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.normal_(1, 0.1)
            bn.bias.normal_(0, 0.1)
        conv, bn = conv.to(dtype).to(memory_format=torch.channels_last), bn.to(dtype)
        x = torch.randn(batch, cin, hw, hw, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
        ho = (hw + 2 * (k // 2) - k) // stride + 1
        z = torch.randn(batch, cout, ho, ho, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
        w, b = fold(conv, bn)
        wd = w.to(dtype).contiguous(memory_format=torch.channels_last)
        bd = b.to(dtype)

        def eager():
            y = bn(conv(x))
            return torch.relu(y + z if residual else y)

        def folded(x, wd, bd, z):
            y = F.conv2d(x, wd, bd, stride, k // 2)
            return torch.relu(y + z if residual else y)

        comp = torch.compile(folded)

        def cudnn():
            if residual:
                return torch.cudnn_convolution_add_relu(x, wd, z, 1.0, bd, (stride, stride), (k // 2, k // 2), (1, 1), 1)
            return torch.cudnn_convolution_relu(x, wd, bd, (stride, stride), (k // 2, k // 2), (1, 1), 1)

        with torch.no_grad():
            ref = eager().float()
            row = {"layer": f"{cin}->{cout} k{k} {hw}x{hw}" + (" +res" if residual else ""), "residual": residual}
            try:
                got = cudnn()
                row["cudnn_diff"] = (got.float() - ref).abs().max().item()
                row["cudnn_ms"] = time_ms(cudnn)
            except Exception as e:  # noqa: BLE001  the probe reports what the installed torch cannot do
                row["cudnn_error"] = f"{type(e).__name__}: {str(e)[:160]}"
            row["compile_diff"] = (comp(x, wd, bd, z).float() - ref).abs().max().item()
            row["eager_ms"] = time_ms(eager)
            row["compile_ms"] = time_ms(lambda: comp(x, wd, bd, z))
            if "cudnn_ms" in row:
                row["cudnn_ms"] = time_ms(cudnn)  # again, after compile's warm-up: same GPU state for both
        rows.append(row)
        print(row, flush=True)
    return rows


def fused_resnet(model, dtype):
    """A copy of torchvision's ResNet-50 whose conv+bn(+add)+relu run as cuDNN fused calls."""
    import torch
    import torch.nn.functional as F

    class FusedConv(torch.nn.Module):
        def __init__(self, conv, bn, relu):
            super().__init__()
            w, b = fold(conv, bn)
            self.register_buffer("w", w.to(dtype).contiguous(memory_format=torch.channels_last))
            self.register_buffer("b", b.to(dtype))
            self.stride, self.padding, self.relu = conv.stride, conv.padding, relu

        def forward(self, x, z=None):
            if z is not None:
                return torch.cudnn_convolution_add_relu(x, self.w, z, 1.0, self.b, self.stride, self.padding, (1, 1), 1)
            if self.relu:
                return torch.cudnn_convolution_relu(x, self.w, self.b, self.stride, self.padding, (1, 1), 1)
            return F.conv2d(x, self.w, self.b, self.stride, self.padding)

    class FusedBottleneck(torch.nn.Module):
        def __init__(self, blk):
            super().__init__()
            self.c1 = FusedConv(blk.conv1, blk.bn1, True)
            self.c2 = FusedConv(blk.conv2, blk.bn2, True)
            self.c3 = FusedConv(blk.conv3, blk.bn3, True)
            self.down = FusedConv(blk.downsample[0], blk.downsample[1], False) if blk.downsample is not None else None

        def forward(self, x):
            idt = self.down(x) if self.down is not None else x
            return self.c3(self.c2(self.c1(x)), idt)

    class FusedResNet(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.stem = FusedConv(m.conv1, m.bn1, True)
            self.pool, self.avg, self.fc = m.maxpool, m.avgpool, m.fc
            self.blocks = torch.nn.Sequential(*[FusedBottleneck(b) for layer in (m.layer1, m.layer2, m.layer3, m.layer4)
                                                for b in layer])

        def forward(self, x):
            x = self.blocks(self.pool(self.stem(x)))
            return self.fc(torch.flatten(self.avg(x), 1))

    return FusedResNet(model)


def model_rows(batch, dtype):
    import torch
    import torchvision

    torch.manual_seed(0)
    m32 = torchvision.models.resnet50().cuda().eval()
    with torch.no_grad():
        for mod in m32.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.normal_(0, 0.1)
                mod.running_var.uniform_(0.5, 2.0)
    x32 = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    m = copy.deepcopy(m32).to(dtype).to(memory_format=torch.channels_last)
    x = x32.to(dtype)
    fused = fused_resnet(m, dtype).cuda()
    rows = {}
    with torch.no_grad():
        ref = m32(x32)
        scale = ref.abs().max().item()

        def add(name, fn, t0):
            out = fn()
            rows[name] = {"ms": time_ms(fn, reps=20, warm=3), "max_diff": (out.float() - ref).abs().max().item(),
                          "ref_max": scale, "setup_s": time.time() - t0}
            print(name, rows[name], flush=True)

        add("eager", lambda: m(x), time.time())
        t0 = time.time()
        c = torch.compile(m)
        add("compile", lambda: c(x), t0)
        import torch._inductor.config as icfg

        t0 = time.time()
        with icfg.patch(freezing=True):
            cf = torch.compile(copy.deepcopy(m))
            add("compile_freezing", lambda: cf(x), t0)
        add("cudnn_fused_eager", lambda: fused(x), time.time())
        t0 = time.time()
        cfu = torch.compile(fused)
        add("cudnn_fused_compile", lambda: cfu(x), t0)
        add("compile_again", lambda: c(x), time.time())  # drift check: compile timed again last
    return rows


def main() -> int:
    import torch

    from _common import environment, out_path, write

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    torch.backends.cudnn.benchmark = True
    layers = layer_rows(a.batch, dtype)
    models = model_rows(a.batch, dtype)
    doc = {"environment": environment(), "batch": a.batch, "dtype": a.dtype, "layers": layers, "resnet50": models,
           "command": "python bench/conv_epilogue_probe.py " + " ".join(sys.argv[1:])}
    md = [f"# Conv epilogues: cuDNN fused conv+bias(+add)+relu against torch.compile (ResNet-50, B{a.batch} {a.dtype}, channels_last)",
          "", f"GPU {doc['environment'].get('gpu')}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}. "
          f"Command: `{doc['command']}`. Median of CUDA-event timings.", "",
          "| layer | eager ms | compile (folded) ms | cuDNN fused ms | fused / compile | max diff fused | max diff compile |",
          "|---|---|---|---|---|---|---|"]
    for r in layers:
        fused = f"{r['cudnn_ms']:.3f}" if "cudnn_ms" in r else r.get("cudnn_error", "")
        ratio = f"{r['compile_ms'] / r['cudnn_ms']:.2f}x" if "cudnn_ms" in r else "-"
        md.append(f"| {r['layer']} | {r['eager_ms']:.3f} | {r['compile_ms']:.3f} | {fused} | {ratio} | "
                  f"{r.get('cudnn_diff', float('nan')):.3g} | {r['compile_diff']:.3g} |")
    md += ["", "| ResNet-50 | ms | max diff vs fp32 (|ref| max) |", "|---|---|---|"]
    for k, v in models.items():
        md.append(f"| {k} | {v['ms']:.3f} | {v['max_diff']:.3g} ({v['ref_max']:.3g}) |")
    write(out_path("conv_epilogue") if a.out is None else Path(a.out), doc, "\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
