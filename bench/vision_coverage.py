"""Which parts of vision models (and LLMs) forge-pack's regions cover: a survey of models it has not seen.

    python bench/vision_coverage.py [OUT_BASE] [--models a,b] [--size 224] [--batch 2]
        (needs torchvision; timm for the timm rows; no GPU needed: CPU profile times)
    python bench/vision_coverage.py [OUT_BASE] --llm [--tokens 64]
        (transformers' causal LMs from tiny configurations, bench/attention_chains.py's, eager attention,
        bf16: one prompt; default OUT_BASE bench/results/llm_coverage)

Per model (torchvision / timm architectures, random weights, fp32, eval): the graph as `forge-pack
profile --regions` captures it (export route, per-node eager CPU times), then the time share in
memory-bound regions, in conv epilogue regions (conv -> inference batch_norm [-> add] [-> act]) and in
eager attention chains, what no region covers by reason, and the regions the generated kernels do not
compute (found, but not searched: `RegionGroup.kernel_coverage`). CPU times weigh the
ops otherwise than an H200 does (convolutions and matmuls dominate more), so the shares are a map of
what is covered, not of where a GPU spends its time. Writes OUT_BASE.{json,md} (default
bench/results/vision_coverage).
"""

from __future__ import annotations

import argparse
import time

from _common import environment, out_path, write

TORCHVISION = ("resnet50", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny", "regnet_y_400mf", "swin_t",
               "vit_b_16", "densenet121")
TIMM = ("timm:convnextv2_atto", "timm:efficientvit_b0", "timm:deit_tiny_patch16_224")


def build(name: str):
    import torch

    torch.manual_seed(0)
    if name.startswith("timm:"):
        import timm

        return timm.create_model(name.split(":", 1)[1], pretrained=False).eval()
    import torchvision

    return getattr(torchvision.models, name)(weights=None).eval()


def llm_inputs(name: str, tokens: int):
    """(model, inputs) of a transformers causal LM from attention_chains.py's tiny configurations."""
    import torch
    import transformers as tf

    from attention_chains import prefill_model

    model = prefill_model(tf, name)
    return model, (torch.randint(1, 128, (1, tokens)),)


def survey_one(name: str, size: int, batch: int, llm: bool = False) -> dict:
    import torch

    from forge_pack.graph.capture import capture
    from forge_pack.graph.report import regions_json

    row: dict = {"model": name}
    t0 = time.time()
    try:
        if llm:
            model, inputs = llm_inputs(name, size)
        else:
            model, inputs = build(name), (torch.randn(batch, 3, size, size),)
        with torch.no_grad():
            graph = capture(model, inputs, {})
        doc = regions_json(graph)
        total = max(doc["attributed_us"], 1e-9)
        no_family = [{"pattern": g["pattern"], "share": g["time_share"], "why": g["kernel"]}
                     for g in doc["regions"] if g["kernel"]]
        row.update(
            route=doc["route"], region_signatures=len(doc["regions"]),
            region_share=doc["region_share"],
            conv_share=sum(c["time_share"] for c in doc["conv_regions"]),
            attention_share=sum(a["time_share"] for a in doc["attention_regions"]),
            conv_regions=[{"pattern": c["pattern"], "calls": c["calls"], "share": c["time_share"]}
                          for c in doc["conv_regions"]],
            top_regions=[{"pattern": g["pattern"], "kind": g["kind"], "calls": g["calls"], "share": g["time_share"]}
                         for g in doc["regions"][:6]],
            uncovered=[{"reason": u["reason"], "share": u["time_share"], "ops": u["ops"]} for u in doc["uncovered"]],
            no_family=no_family, attributed_ms=total / 1e3)
    except Exception as e:  # noqa: BLE001 - a row per model, whatever happens
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    row["seconds"] = round(time.time() - t0, 1)
    return row


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def markdown(doc: dict) -> str:
    if doc.get("llm"):
        head = ["# Causal LMs (eager attention): what forge-pack's regions cover", "",
                f"Command: `{doc['command']}`; torch {doc['environment']['torch']}, transformers "
                f"{doc['environment'].get('transformers')}, CPU, bf16, one prompt of {doc['size']} tokens, tiny "
                "configurations (bench/attention_chains.py's), random weights; shares of the attributed eager CPU "
                "time.", ""]
    else:
        head = ["# Vision models: what forge-pack's regions cover", "",
                f"Command: `{doc['command']}`; torch {doc['environment']['torch']}, CPU, fp32, batch {doc['batch']}, "
                f"{doc['size']}x{doc['size']}, random weights; shares of the attributed eager CPU time.", ""]
    head += ["CPU shares move by up to 2x between runs on a shared 2-core machine: read the table as a map of what "
             "is covered and what is not, not as timings.", ""]
    lines = head + [
             "| model | regions (signatures) | conv epilogue regions | attention chains | matmul / conv left to "
             "the library | other uncovered | regions no kernel computes |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in doc["rows"]:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error'][:150]} | | | | | |")
            continue
        lib = sum(u["share"] for u in r["uncovered"] if u["reason"].startswith(("matmul", "convolution")))
        other = [u for u in r["uncovered"] if not u["reason"].startswith(("matmul", "convolution")) and u["share"] > 0.001]
        other_text = "; ".join(f"{_pct(u['share'])} {u['reason'].split(':')[0]} ({', '.join(u['ops'])})"
                               for u in other[:3]) or "-"
        nf = "; ".join(f"{x['pattern']} ({_pct(x['share'])}: {x['why']})" for x in r["no_family"][:3]) or "-"
        lines.append(f"| {r['model']} | {_pct(r['region_share'])} ({r['region_signatures']}) | "
                     f"{_pct(r['conv_share'])} | {_pct(r['attention_share'])} | {_pct(lib)} | {other_text} | {nf} |")
    lines += ["", "Largest region signatures per model (pattern, kind, calls, share):", ""]
    for r in doc["rows"]:
        if "error" not in r:
            lines.append(f"- {r['model']}: " + ", ".join(f"{g['pattern']} ({g['kind']}, x{g['calls']}, "
                                                          f"{_pct(g['share'])})" for g in r["top_regions"]))
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--models", default=",".join(TORCHVISION + TIMM))
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--llm", action="store_true", help="transformers causal LMs instead of vision models")
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    base = out_path("llm_coverage" if a.llm else "vision_coverage")
    extra = {}
    if a.llm:
        import transformers as tf

        from attention_chains import cases

        names, a.size, extra = list(cases(tf)), a.tokens, {"transformers": tf.__version__}
    else:
        names = a.models.split(",")
    t0 = time.time()
    rows = []
    for name in names:
        rows.append(survey_one(name, a.size, a.batch, a.llm))
        print(f"[{time.time() - t0:.0f}s] {name}: {rows[-1].get('error') or _pct(rows[-1]['region_share'])}",
              flush=True)
    import torch

    doc = {"command": "python bench/vision_coverage.py " + " ".join(__import__("sys").argv[1:]),
           "environment": {**environment(), "torch": torch.__version__, **extra}, "size": a.size, "batch": a.batch,
           "llm": a.llm, "seconds": round(time.time() - t0, 1), "rows": rows}
    write(base, doc, markdown(doc))


if __name__ == "__main__":
    main()
