"""The emitted package's README, rendered from its manifest (templates/package/README.md)."""

from __future__ import annotations

from string import Template

from forge_pack.evaluate.model_accuracy import describe

FORGE_URL = "https://github.com/forge-pack/forge-pack"


def us(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v / 1000:.3f} ms" if v >= 1000 else f"{v:.1f} µs"


def timing(t: dict | None) -> str:
    if not t:
        return "n/a"
    return f"{us(t['median_us'])} (IQR {us(t['iqr_us'])}, n={t['n']})"


def x(v: float | None) -> str:
    return f"{v:.2f}x" if v else "n/a"


def err(e: dict | None) -> str:
    return "n/a" if not e or e.get("max_abs") is None else f"{e['max_abs']:.2e}"


def target_table(doc: dict) -> str:
    rows = ["| # | op call | share of model time | eager | torch.compile | kernel | vs eager | vs torch.compile "
            "| max abs err (captured / fresh) | tolerance (atol, rtol) | call paths |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in doc["targets"]:
        tm, s, tol = t["timing"], t["speedup"], t["tolerance"]
        rows.append(f"| {t['id']} | `{t['signature']['pretty']}` | {100 * t['time_share']:.1f}% "
                    f"| {timing(tm['eager'])} "
                    f"| {timing(tm['compiled'])} | {timing(tm['kernel'])} | **{x(s['vs_eager'])}** | {x(s['vs_compile'])} "
                    f"| {err(t['errors']['captured'])} / {err(t['errors']['fresh'])} | {tol['atol']:g}, {tol['rtol']:g} "
                    f"| {', '.join(t['call_paths'])} |")
    return "\n".join(rows)


def model_table(doc: dict) -> str:
    r = doc["model_result"]
    if not r:
        return "The whole model was not re-measured with the package applied (see `manifest.json`)."
    agree = f"{100 * r['argmax_agreement']:.2f}%" if r.get("argmax_agreement") is not None else "n/a"
    diff = f"{r['max_abs_diff']:.3e}" if r.get("max_abs_diff") is not None else "n/a"
    table = ("| whole model | eager | patched | end-to-end speedup | max output difference | argmax agreement |\n"
             "|---|---|---|---|---|---|\n"
             f"| {doc['model']['name']} on {doc['model']['device']} | {timing(r['eager'])} | {timing(r['patched'])} "
             f"| **{x(r['speedup'])}** | {diff} | {agree} |")
    acc = r.get("accuracy") or {}
    if describe(acc):
        table += (f"\n\nOutput accuracy, {describe(acc)}; within tolerance: "
                  f"{'yes' if r['within_tolerance'] else 'no'} ({acc['basis']}).")
    return table


def model_speed(r: dict) -> str:
    """The summary's end-to-end sentence: faster, or plainly slower (never "0.91x faster")."""
    s = r.get("speedup")
    if not s:
        return ""
    if s >= 1.0:
        return f" The whole model runs {x(s)} faster end to end on the user's inputs."
    return (f" The whole model runs slower end to end on the user's inputs ({x(s)} the original's speed): the "
            "kernels' gains do not survive the whole forward here; time it on the target machine before deploying.")


def retimed(doc: dict) -> str:
    """Whether the timings were re-measured in a fresh process (confirmation) or are the search's own
    (packed with --no-confirm): said per the manifest, not assumed."""
    ts = doc["targets"]
    done = [t["id"] for t in ts if t.get("confirmed")]
    fresh = "re-timed against eager PyTorch and `torch.compile` in a fresh process before packing"
    if done and len(done) == len(ts):
        return f", then {fresh}."
    if not done:
        return (". The timings are the search's own: the kernels were not re-timed in a fresh process before "
                "packing (packed unconfirmed).")
    return (f". {len(done)} of {len(ts)} kernels ({', '.join(done)}) were {fresh}; the others' timings are the "
            "search's own.")


def compile_note(doc: dict) -> str:
    """What compile mode uses, as measured by the compile gate (forge_pack.evaluate.compile_gate)."""
    c = doc.get("compile_result")
    if not c:
        return "This package was built without measuring compile mode, so `compile` uses none of its kernels."
    if c.get("error"):
        return f"`compile` uses none of the kernels here: {c['error'].splitlines()[0][:200]}."
    uses = {t["id"]: t.get("compile") or {} for t in doc["targets"]}
    if not c.get("used") or c.get("compiled_with_ms") is None:
        note = (f"Measured: none of the kernels beat Inductor's own code in context, so `compile` is plain "
                f"`torch.compile` ({c['compiled_ms']:.3f} ms).")
    else:
        note = (f"Measured: `torch.compile` {c['compiled_ms']:.3f} ms, with {', '.join(c['used'])} "
                f"{c['compiled_with_ms']:.3f} ms ({x(c['compiled_ms'] / c['compiled_with_ms'])}); "
                + "; ".join(f"{tid} not used: {u.get('reason', '')}" for tid, u in uses.items() if not u.get("use"))
                ).rstrip("; ") + "."
    return note + "".join(f" {_mode_note(m, r)}" for m, r in (c.get("modes") or {}).items())


def _mode_note(mode: str, r: dict) -> str:
    """What `compile(model, mode=...)` uses where the build measured that mode on its own."""
    head = f"With `mode=\"{mode}\"` (measured on its own):"
    if r.get("error"):
        return f"{head} none of the kernels: {r['error'].splitlines()[0][:200]}."
    if not r.get("used") or r.get("compiled_with_ms") is None:
        return f"{head} none of the kernels beat Inductor there, `torch.compile` {r['compiled_ms']:.3f} ms."
    return (f"{head} `torch.compile` {r['compiled_ms']:.3f} ms, with {', '.join(r['used'])} "
            f"{r['compiled_with_ms']:.3f} ms ({x(r['compiled_ms'] / r['compiled_with_ms'])}).")


def deploy_match(doc: dict) -> str:
    """The list of what a target machine must share with the build for the wheel to load there."""
    env, build = doc["environment"], doc["build"]
    cuda = doc["backend"] == "cuda"
    torch_line = ("torch: exactly the release and build the wheel requires (its `Requires-Dist: torch==...`, the "
                  f"torch it was compiled against; the kernels were measured with **{env['torch']}**")
    if cuda and env.get("cuda"):
        tag = "cu" + str(env["cuda"]).replace(".", "")
        torch_line += (f", CUDA {env['cuda']}); a CUDA build of torch comes from the PyTorch index, e.g. "
                       f"`pip install torch==<version> --index-url https://download.pytorch.org/whl/{tag}`")
    else:
        torch_line += ")"
    items = [torch_line,
             "CPython: any version from torch's minimum on when the wheel is tagged `abi3` (the binding uses only "
             "Python's stable ABI), else the same CPython minor version as the build",
             f"operating system and architecture: {env['platform']} (the wheel's platform tag)"]
    isa = build.get("cpu_isa")
    if isa == "native":
        items.append("CPU: one with every instruction-set feature of the build machine's CPU "
                     f"({env.get('cpu') or 'unknown'}); the code is compiled with -march=native")
    elif isa:
        items.append(f"CPU: one that implements {isa} (-march={isa}{', the C++ host code' if cuda else ''}); the "
                     "features it needs are checked before loading")
    if cuda:
        items.append(f"GPU: compute capability {build['cuda_arch_list']} (the wheel holds code for that "
                     "architecture only, the one the kernels were verified on) and a driver for CUDA "
                     f"{env.get('cuda') or 'of that torch'}")
    return "\n\n" + "\n".join(f"- {i}" for i in items)


def render(doc: dict) -> str:
    from forge_pack.evaluate.compile import templates_dir

    env = doc["environment"]
    where = env["gpu_name"] or env.get("cpu") or doc["model"]["device"]
    if env.get("compute_capability"):
        where += f" (compute capability {env['compute_capability']})"
    where += f", torch {env['torch']}"
    if env.get("cuda") and doc["backend"] == "cuda":
        where += f", CUDA {env['cuda']}"
    n = len(doc["targets"])
    r = doc["model_result"]
    summary = (f"{n} kernel{'s' if n != 1 else ''} replace{'s' if n == 1 else ''} "
               + ", ".join(f"`{t['op']}` ({x(t['speedup']['vs_eager'])} vs eager)" for t in doc["targets"]) + ".")
    if r:
        summary += model_speed(r)
    dropped = ""
    if doc["dropped"]:
        dropped = "\n\nNot accelerated:\n" + "\n".join(f"- `{d['pretty']}`: {d['reason']}" for d in doc["dropped"])
    if doc["backend"] == "cuda":
        build_note = (f"The kernels compile for compute capability {doc['build']['cuda_arch_list']} (the GPU they "
                      "were verified on); nvcc's CUDA major version must match torch's. On any other GPU the "
                      "package loads nothing and the model runs unchanged.")
    else:
        isa = doc["build"].get("cpu_isa")
        target = ("this CPU only" if isa == "native" or (isa is None and "-march=native" in doc["build"]["cxx_flags"])
                  else f"any CPU implementing {isa}" if isa else "this CPU")
        build_note = ("The kernels compile with " + " ".join(doc["build"]["cxx_flags"]) + f", for {target} (a C++ "
                      "compiler with OpenMP is needed).")
    paths = sorted({p for t in doc["targets"] for p in t["call_paths"]})
    text = (templates_dir() / "package" / "README.md").read_text()
    return Template(text).safe_substitute(
        name=doc["package"]["name"], model_name=doc["model"]["name"], model_path=doc["model"]["path"],
        model_hash_short=(doc["model"]["sha256"] or "unknown")[:12], forge_url=FORGE_URL,
        forge_version=doc["forge_pack_version"], measured_on=where, summary=summary,
        target_table=target_table(doc), model_table=model_table(doc), retimed=retimed(doc), dropped=dropped,
        install_path=".", build_note=build_note, deploy_match=deploy_match(doc), compile_note=compile_note(doc), paths=", ".join(f"`{p}`" for p in paths) or "none")
