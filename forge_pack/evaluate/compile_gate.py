"""The compile gate of ``build`` and ``pack``: which kernels the package uses under ``<pkg>.compile``.

A kernel that beats eager may still lose compiled: Inductor would have fused the op with its
neighbours, and the replacement cuts that fusion. So after the whole-model gate passes, the staged
package is measured compiled, in a subprocess (its ops are registered once per process):

1. the model compiled plainly (``torch.compile(model)``, Inductor) once, the yardstick of every
   comparison, and compiled with every candidate swapped in (the op targets that are one traced call
   and the manifest's regions: ``CompileMode(patcher, use=ids)``); a candidate none of whose traced
   calls or subgraphs matched is not used (once the bisection below has dropped some, the unmatched ones are
   compiled again with those kept: a dropped region may have hidden them, as a ResNet's conv regions hide the
   batch_norm + add + ReLU regions of the same subgraphs);
2. a set of replacements is used only if its compiled model is as accurate as the whole-model gate
   demands (``compare_outputs``'s ``within_tolerance``) against eager, or against the plain compiled model
   (what the user runs instead: where torch.compile's own output is that far from eager's, a replacement
   that leaves it as it is makes nothing less accurate; ResNet-50 bf16 B256 on an H100 compiles to outputs
   0.75 from eager's, 96-99% argmax agreement, and eager's yardstick alone dropped every conv region as less
   accurate, their outputs 0.5-0.75 from eager's), and is faster than
   the plain compiled model,
   timed interleaved with it (the whole-model gate's protocol: warm-up, alternating calls, medians and
   IQRs): slower by more than the noise of the two medians (two standard errors of their difference,
   from the IQRs) is "makes the compiled model slower", slower or equal within it is "not faster
   compiled";
3. a set that loses is bisected: each half is measured (and bisected while it loses) down to single
   replacements, which are dropped with the reason of their own measurement; two winning halves that
   lose together leave the one that gained less to Inductor. When everything wins together, that is
   two compiles in all; one bad replacement among n costs about 2 log2(n) more. A set whose compile or
   calls raise (CUDA graphs that cannot capture it, an op Inductor rejects) loses the same way, the error as
   its reason ("fails compiled: ..."): one replacement that breaks the compiled model is dropped alone, where
   the error used to end the whole mode's gate with nothing used.

Each target and region gets ``compile: {use, reason, compiled_ms, compiled_with_ms}`` in the manifest and the
document ``compile_result`` (plain and package compiled medians, compile times, what is used). A
model torch.compile cannot compile leaves the eager package as it is: every target ``use: false``
with that reason.

On a GPU the whole gate runs again with ``mode="reduce-overhead"`` on both sides (``EXTRA_MODES``, its own
subprocess): CUDA graphs remove the per-call host work that makes some replacements lose in the default
mode at a small batch, so ``<pkg>.compile(model, mode="reduce-overhead")`` follows that mode's own
decisions (each decision's and the summary's ``modes``); any other mode follows the default's.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from forge_pack.core.errors import ForgeError
from forge_pack.core.verdict import Timing
from forge_pack.core.winner import clearly_faster
from forge_pack.evaluate.confirm import _time_pair
from forge_pack.evaluate.model_accuracy import compare_outputs, precise_reference, seeded_forward
from forge_pack.evaluate.model_gate import difference_words, failure_words, passes

COMPILE_CHECK_TIMEOUT_S = 3600  # two Inductor compiles, more while bisecting: minutes for a large model on a small CPU
BUDGET_S = 10.0  # timing budget per compared pair: enough for 30 pairs of a 100 ms forward
MAX_N = 30  # timed pairs per comparison, as the eager whole-model check's order of magnitude
COMPOSITE_REASON = ("a module composite (several traced calls, not one op): compile mode leaves it to Inductor")
UNMATCHED_REASON = ("no call or subgraph in the compiled graphs matched the verified signature or form (shape, "
                    "dtype, strides, parameters, constants or device differ as traced, or the shapes are dynamic), "
                    "so Inductor keeps it")


def ms(t: Timing | None) -> float | None:
    return None if t is None else t.median_us / 1e3


def judge(plain: Timing, with_: Timing) -> tuple[bool, str]:
    """Use the replacement only if the compiled model is faster with it: slower beyond the noise of
    the two medians, or not faster within it, is a reason not to."""
    ratio = plain.median_us / max(with_.median_us, 1e-9)
    line = (f"{ratio:.2f}x the plain compiled model ({with_.median_us / 1e3:.3f} ms, IQR {with_.iqr_us / 1e3:.3f}, "
            f"n={with_.n}; without it {plain.median_us / 1e3:.3f} ms, IQR {plain.iqr_us / 1e3:.3f}, n={plain.n})")
    if clearly_faster(plain, with_):
        return False, f"makes the compiled model slower: {line}"
    # Within the noise, the bar is "strictly faster": Inductor's own fusion is the default, so a
    # replacement that cannot show any gain over it is left out.
    if with_.median_us >= plain.median_us:
        return False, f"not faster compiled (within measurement noise), so Inductor keeps it: {line}"
    return True, f"faster compiled: {line}"


def _raise_recompile_limit(n: int) -> None:
    """Each variant is another Dynamo cache entry of the same forward: allow them all (this process only)."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), n))


def accuracy(eager_out: Any, plain_out: Any, out: Any, gold: Any, gold_note: str | None) -> dict:
    """``compare_outputs`` of the model compiled with the package (`out`) against eager; where that fails, the same
    rule against the plain compiled model (`plain_out`) decides ``within_tolerance`` (the package left torch.compile's
    accuracy as it is: its differences in ``vs_compiled``; ``max_abs_diff`` stays the one against eager).
    ``against_compiled``: a clause for a failure's reason."""
    acc = compare_outputs(eager_out, out, gold, gold_note)
    if passes(acc):
        return {**acc, "against_compiled": ""}
    vs_plain = compare_outputs(plain_out, out, gold, gold_note)
    if passes(vs_plain):
        basis = (vs_plain.get("accuracy") or {}).get("basis", "")
        return {**acc, "within_tolerance": True,
                "vs_compiled": {k: vs_plain.get(k) for k in ("max_abs_diff", "argmax_agreement")},
                "accuracy": {**(vs_plain.get("accuracy") or {}),
                             "basis": f"against the model compiled without the package, {basis}"},
                "against_compiled": ""}
    return {**acc, "against_compiled": f"; and from the model compiled without it{difference_words(vs_plain)}, "
                                       "more than it allows too"}


def candidates(patcher: Any) -> list[str]:
    """What compile mode may swap in: the op targets that are one traced call, then the manifest's regions."""
    # a region target is swapped as a subgraph (its entry in ``regions``, same id), never as a traced call
    ops = [t.id for t in patcher.targets if not t.composite and t.op != "region"]
    return ops + [r["id"] for r in patcher.manifest.get("regions") or []]


def measure(target: Any, patcher: Any, compile_mode: Callable, *, budget_s: float = BUDGET_S, max_n: int = MAX_N,
            say: Callable[[str], None] = lambda s: None, compile_plain: Callable | None = None,
            mode: str | None = None) -> dict:
    """Compile target.module plainly and with the package's replacements (see the module doc); the
    result for ``record``. ``compile_mode``: the package's CompileMode class; ``compile_plain``: the
    yardstick, torch.compile (Inductor) unless a test gives another. ``mode``: torch.compile's mode for
    both sides (None: the default)."""
    import time

    import torch

    cuda = target.device == "cuda"
    module, args, kwargs, device = target.module, target.args, target.kwargs, target.device
    ids = candidates(patcher)
    records: dict[str, dict] = {t.id: {"use": False, "reason": COMPOSITE_REASON, "compiled_ms": None,
                                       "compiled_with_ms": None} for t in patcher.targets if t.composite}
    _raise_recompile_limit(2 * len(ids) + 4)  # the bisection's compiles at most
    with torch.inference_mode():
        ref = seeded_forward(module, args, kwargs, device)
    gold, gold_note = precise_reference(module, args, kwargs, device)

    def first(fn) -> tuple[float, Any]:
        """The first call compiles: its time is the compile time; its output is compared."""
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = seeded_forward(fn, args, kwargs, device)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0, out

    def call(fn) -> Callable[[], None]:
        return lambda: fn(*args, **kwargs)

    def noop() -> None:
        return None

    # no_grad, not inference_mode: the inputs seeded_forward copies and the user's own must be the same
    # kind of tensor (inference tensors lack a dispatch key Dynamo guards on: each switch recompiles)
    kw = {"mode": mode} if mode else {}
    with torch.no_grad():
        plain = compile_plain(module) if compile_plain else torch.compile(module, **kw)
        compile_s, plain_out = first(plain)
        plain_acc = compare_outputs(ref, plain_out, gold, gold_note)
        say(f"  compiled without the package: compile {compile_s:.0f} s; {len(ids)} candidates to measure")

        def trial(used: list[str]) -> dict:
            """The model compiled with exactly `used` swapped in, against the plain compiled model; a compile or
            call that raises is that set's loss (its reason the error), bisected like any other."""
            cm = compile_mode(patcher, use=used)
            try:
                return measured(cm, used)
            except Exception as e:  # noqa: BLE001 - a replacement that breaks the compiled model is dropped, not fatal
                # what matched before the error (else, failing before any match was counted, every one of them)
                failed = _matched(cm, used)[1]
                why = f"fails compiled: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
                say(f"  compiled with {len(failed)} swapped in ({_listed(failed)}): {why}")
                return {"used": failed, "ok": False, "why": why, "plain": None, "with": None, "with_s": None,
                        "acc": {}, "hit": {tid: 1 for tid in failed}, "gain": 0.0}

        def measured(cm: Any, used: list[str]) -> dict:
            compiled = cm.compile(module, **kw)
            with_s, out = first(compiled)
            # the candidates that matched nothing replaced nothing: the compile is the others' alone
            hit, used = _matched(cm, used)
            acc = accuracy(ref, plain_out, out, gold, gold_note)
            t_plain, t_with = _time_pair(call(plain), call(compiled), noop, noop, cuda, budget_s, max_n)
            if not passes(acc):
                alone = "with only this kernel, " if len(used) == 1 else f"with {', '.join(used)} together, "
                ok, why = False, f"less accurate compiled: {alone}{failure_words(acc)}{acc['against_compiled']}"
            else:
                ok, why = judge(t_plain, t_with)
            say(f"  compiled with {len(used)} swapped in ({_listed(used)}): compile {with_s:.0f} s, "
                f"{ms(t_with):.3f} ms against {ms(t_plain):.3f} ms: {'wins' if ok else 'loses'}")
            return {"used": list(used), "ok": ok, "why": why, "plain": t_plain, "with": t_with, "with_s": with_s,
                    "acc": acc, "hit": hit, "gain": t_plain.median_us / max(t_with.median_us, 1e-9)}

        def keep_all(t: dict) -> None:
            why = t["why"] if len(t["used"]) == 1 else f"{t['why']} (with {', '.join(t['used'])} swapped in together)"
            for tid in t["used"]:
                records[tid] = {"use": True, "reason": why, "compiled_ms": ms(t["plain"]), "compiled_with_ms": ms(t["with"])}

        def settle(used: list[str], t: dict | None = None) -> tuple[list[str], dict | None]:
            """The largest part of `used` this bisection keeps, and its measurement: a set that wins is kept
            whole; one that loses is split in halves, each settled; two winning halves that lose together
            leave the one that gained less to Inductor."""
            t = t or trial(used)
            if t["ok"]:
                keep_all(t)
                return t["used"], t
            if len(used) == 1:
                records[used[0]] = {"use": False, "reason": t["why"], "compiled_ms": ms(t["plain"]),
                                    "compiled_with_ms": ms(t["with"])}
                say(f"  compiled, {used[0]}: not used: {t['why']}")
                return [], None
            half = len(used) // 2
            (a, ta), (b, tb) = settle(used[:half]), settle(used[half:])
            if not a or not b:
                return (a, ta) if a else (b, tb)
            both = t if a + b == used else trial(a + b)  # both halves whole: `used` itself, measured already
            if both["ok"]:
                keep_all(both)
                return a + b, both
            (lose, t_lose), (win, t_win) = sorted(((a, ta), (b, tb)), key=lambda p: p[1]["gain"])
            alone = "alone" if len(lose) == 1 else f"with {', '.join(lose)}"
            for tid in lose:
                records[tid].update(use=False, reason=f"faster compiled {alone}, but the kernels used together lose "
                                                      f"({both['why']}); it gained least {alone}, so it is left to "
                                                      f"Inductor")
            say(f"  compiled together: {both['why']}; leaving {', '.join(lose)} to Inductor")
            return win, t_win

        # one compile with every candidate: calls and regions that never occur drop out here
        kept: list[str] = []
        final: dict | None = None
        if ids:
            everything = trial(ids)
            for tid in ids:
                if not everything["hit"].get(tid):
                    records[tid] = {"use": False, "reason": UNMATCHED_REASON, "compiled_ms": None,
                                    "compiled_with_ms": None}
                    say(f"  compiled, {tid}: not used: {UNMATCHED_REASON}")
            matched = [tid for tid in ids if everything["hit"].get(tid)]
            if matched:
                kept, final = settle(matched, everything)  # its "used": the matched ones
            unmatched = [tid for tid in ids if tid not in matched]
            if unmatched and len(kept) < len(matched):
                # a region can hide another: the conv regions of a ResNet take the batch_norm + add + ReLU
                # subgraphs a region of their epilogue alone would match. With some dropped, what they hid is
                # tried with what is kept (one more compile; what matches then is settled with it)
                again = trial(kept + unmatched)
                newly = [tid for tid in unmatched if again["hit"].get(tid)]
                if newly:
                    for tid in newly:
                        say(f"  compiled, {tid}: matched once {', '.join(t for t in matched if t not in kept)} "
                            "were left to Inductor")
                    kept, final = settle(kept + newly, again)  # measured again, the kept ones with them
        for tid in kept:
            say(f"  compiled, {tid}: used: {records[tid]['reason']}")
        if final is not None:
            together = {"compiled": final["plain"].to_json(), "compiled_with": final["with"].to_json(),
                        "compile_with_s": final["with_s"], "max_abs_diff": final["acc"].get("max_abs_diff"),
                        "within_tolerance": final["acc"].get("within_tolerance")}
        else:  # nothing used: the plain compiled model against itself is what runs
            t_plain, _ = _time_pair(call(plain), call(plain), noop, noop, cuda, budget_s, max_n)
            together = {"compiled": t_plain.to_json(), "compiled_with": None, "compile_with_s": None,
                        "max_abs_diff": None, "within_tolerance": None}
    return {"targets": records, "used": kept, "compile_s": compile_s, "mode": mode or "default",
            "compiled_max_abs_diff": plain_acc.get("max_abs_diff"), **together}


def _matched(cm: Any, used: list[str]) -> tuple[dict, list[str]]:
    """What a compile mode's pass swapped in, by id, and the ids of ``used`` among them (all of ``used`` when none
    is: a compile that matched nothing, or failed before counting)."""
    hit = {**cm.replaced, **getattr(cm, "matched", {})}
    return hit, [tid for tid in used if hit.get(tid)] or list(used)


def _listed(ids: list[str], at_most: int = 4) -> str:
    return ", ".join(ids[:at_most]) + (f" and {len(ids) - at_most} more" if len(ids) > at_most else "")


def _decision(result: dict, tid: str) -> dict:
    return (result.get("targets") or {}).get(tid) or {"use": False, "reason": result.get("error") or UNMATCHED_REASON,
                                                      "compiled_ms": None, "compiled_with_ms": None}


def _medians_ms(result: dict) -> dict:
    """The gate result's whole-model medians in ms: plain compiled, and with the used kernels (None: not timed)."""
    return {f"{k}_ms": ms(Timing.from_json(result[k])) if result.get(k) else None for k in ("compiled", "compiled_with")}


def record(doc: dict, result: dict, modes: dict[str, dict] | None = None) -> dict:
    """Write the compile gate's result into the staged manifest: each target's ``compile`` and the
    document's ``compile_result``; the latter is returned. ``modes``: the gate's result under each other
    torch.compile mode measured (``EXTRA_MODES``), written as each decision's and the summary's ``modes``."""
    for t in [*doc["targets"], *(doc.get("regions") or [])]:
        t["compile"] = _decision(result, t["id"])
        if modes:
            t["compile"]["modes"] = {m: dict(_decision(r, t["id"])) for m, r in modes.items()}
    summary = {k: result.get(k) for k in ("used", "compile_s", "compile_with_s", "mode", "compiled_max_abs_diff",
                                          "max_abs_diff", "within_tolerance")}
    summary["used"] = list(summary["used"] or [])
    summary.update(_medians_ms(result))
    if result.get("error"):
        summary["error"] = result["error"]
    if modes:
        summary["modes"] = {}
        for m, r in modes.items():
            s = {"used": list(r.get("used") or []), **_medians_ms(r)}
            if r.get("error"):
                s["error"] = r["error"]
            summary["modes"][m] = s
    doc["compile_result"] = summary
    return summary


GATE_LINE = "forge-pack compile gate: "  # how the gate's subprocess marks a progress line for the build's output
TAIL_CHARS = 2000  # of the subprocess's other output, kept for the error of a check that wrote no result


def check_compiled(package_dir: Path, info: Any, timeout_s: float = COMPILE_CHECK_TIMEOUT_S,
                   mode: str | None = None, say: Callable[[str], None] | None = None) -> dict:
    """Run ``measure`` on the staged package in a subprocess (one per mode: a mode that crashes, CUDA graphs
    that cannot capture, leaves the others' results); its result (``error`` set when torch.compile could
    not compile the model there: the eager package stands, compile mode uses nothing in that mode). The
    subprocess's progress lines (each compile, its time and its measurement; each decision) reach ``say`` as
    they are printed: the check of a large model takes minutes."""
    import threading

    out = Path(package_dir) / f".compile_check{'.' + mode if mode else ''}.json"
    cmd = [sys.executable, "-m", "forge_pack.evaluate.compile_gate", str(package_dir), info.model_path,
           "--device", info.device, "--out", str(out), "--build-root", str(Path(info.run_dir) / "package-builds")]
    if info.dtype:
        cmd += ["--dtype", info.dtype]
    if mode:
        cmd += ["--mode", mode]
    tail = ""

    def read(stream) -> None:
        nonlocal tail
        for line in stream:
            if not line.startswith(GATE_LINE):
                tail = (tail + line)[-TAIL_CHARS:]
            elif say is not None:
                say(line[len(GATE_LINE):].rstrip("\n"))

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    reader = threading.Thread(target=read, args=(proc.stdout,), daemon=True)
    reader.start()
    try:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"the compiled-model check ran longer than {timeout_s:.0f} s"}
        finally:  # past its time, or Ctrl-C in the build: the check does not go on without it
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            reader.join(timeout=10)
        try:
            return json.loads(out.read_text())
        except (OSError, ValueError):
            return {"error": f"the compiled-model check wrote no result (exit {proc.returncode}): {tail}"}
    finally:
        out.unlink(missing_ok=True)


# torch.compile modes the gate measures besides the default, per device: CUDA graphs remove the per-call host
# work that can make a replacement lose in the default mode at a small batch (ResNet-50 B1 on an H100, the
# conv regions: 0.74x of torch.compile in the default mode, 1.13x of it with mode="reduce-overhead" on both
# sides; bench/results/vision.md), so that mode gets its own decisions. Not on the CPU: no CUDA graphs there.
EXTRA_MODES = {"cuda": ("reduce-overhead",)}


MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's modes


def extra_modes(device: str | None, modes: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The modes the gate measures besides the default: those of ``modes`` (``--compile-modes``), or without it
    ``EXTRA_MODES`` for the device."""
    if modes is None:
        return EXTRA_MODES.get(device or "", ())
    return tuple(m for m in modes if m != "default")


def parse_modes(text: str) -> tuple[str, ...]:
    """``--compile-modes``: a comma-separated list of torch.compile modes, ``default`` among them (every other
    mode's decisions are measured against the default's and follow them where not measured)."""
    modes = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ForgeError(f"--compile-modes: unknown torch.compile mode {bad[0]!r}",
                         f"choose from {', '.join(MODES)}, e.g. --compile-modes default,reduce-overhead")
    if "default" not in modes:
        raise ForgeError("--compile-modes must include default (the mode every other one is measured beside)",
                         f"e.g. --compile-modes default{',' + ','.join(modes) if modes else ''}")
    return modes


def run_compile_gate(package_dir: Path, info: Any, doc: dict, say: Callable[[str], None] = lambda s: None,
                     check: Callable[..., dict] | None = None, modes: tuple[str, ...] | None = None) -> dict:
    """Measure the staged package compiled (the default mode, then each other mode of ``modes``, by default
    ``EXTRA_MODES`` for the device) and record the outcome in `doc`; the ``compile_result``."""
    if check is None:
        def check(package_dir, info, mode=None):
            return check_compiled(package_dir, info, mode=mode, say=say)
    say("checking the whole model compiled: torch.compile with and without each kernel")
    result = check(package_dir, info)
    if result.get("error"):
        say(f"  compile mode uses no kernel: {result['error'].splitlines()[0][:300]}")
    measured = {}
    # a model torch.compile cannot compile in the default mode is not tried again in another
    for m in () if result.get("error") else extra_modes(getattr(info, "device", None), modes):
        say(f"checking the whole model compiled with mode={m!r}: torch.compile with and without each kernel")
        measured[m] = check(package_dir, info, mode=m)
        if measured[m].get("error"):
            say(f"  compile mode {m!r} uses no kernel: {measured[m]['error'].splitlines()[0][:300]}")
    return record(doc, result, measured)


def summary_line(model_result: dict | None, compile_result: dict | None) -> str | None:
    """'Eager 2.10 ms, eager+package 1.90 ms, compile 1.20 ms, compile+package 1.10 ms (t0, t2)'."""
    if not compile_result:
        return None
    parts = []
    if model_result and model_result.get("eager"):
        parts += [f"eager {model_result['eager']['median_us'] / 1e3:.3f} ms",
                  f"eager+package {model_result['patched']['median_us'] / 1e3:.3f} ms"]
    c, w = compile_result.get("compiled_ms"), compile_result.get("compiled_with_ms")
    if c is not None:
        parts.append(f"compile {c:.3f} ms")
    used = compile_result.get("used") or []
    if w is not None:
        parts.append(f"compile+package {w:.3f} ms ({c / w:.2f}x, using {', '.join(used)})")
    else:
        parts.append("compile+package: no kernel used compiled (each loses to Inductor's own code in context)"
                     if not compile_result.get("error") else f"compile mode unavailable: "
                                                               f"{compile_result['error'].splitlines()[0][:200]}")
    for m, r in (compile_result.get("modes") or {}).items():  # the modes measured on their own (EXTRA_MODES)
        c, w = r.get("compiled_ms"), r.get("compiled_with_ms")
        if r.get("error") or c is None:
            parts.append(f"mode={m}: no kernel used ({(r.get('error') or 'not measured').splitlines()[0][:120]})")
        elif w is None:
            parts.append(f"mode={m}: compile {c:.3f} ms, no kernel used")
        else:
            parts.append(f"mode={m}: compile {c:.3f} ms, compile+package {w:.3f} ms ({c / w:.2f}x, using "
                         f"{', '.join(r.get('used') or [])})")
    return "Whole model: " + ", ".join(parts)


# ------------------------------------------------------------------ the subprocess


def _compile_module(package_dir: Path, name: str):
    path = package_dir / name / "_compile.py"
    spec = importlib.util.spec_from_file_location(f"_forge_dev_{name}_compile", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def compile_check(package_dir: str, model: str, device: str, dtype: str | None, build_root: str | None,
                  mode: str | None = None) -> dict:
    from forge_pack.evaluate.confirm import dev_patcher
    from forge_pack.profile.load import load

    patcher = dev_patcher(package_dir, build_root)
    if not patcher.load():
        return {"error": f"the package's extension did not load: {patcher.load_error}"}
    cm = _compile_module(Path(package_dir), patcher.package)
    if patcher.manifest.get("regions"):
        # a graph Inductor loads from its cache skips the region pass, so its matches would not be counted
        import torch._inductor.config as inductor_config

        inductor_config.force_disable_caches = True
    target = load(model, device, dtype)
    return measure(target, patcher, cm.CompileMode, say=lambda s: print(GATE_LINE + s, file=sys.stderr, flush=True),
                   mode=mode)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m forge_pack.evaluate.compile_gate")
    p.add_argument("package_dir")
    p.add_argument("model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--build-root", default=None)
    p.add_argument("--mode", default=None, help="torch.compile's mode on both sides (default: its default)")
    a = p.parse_args(argv)
    try:
        result = compile_check(a.package_dir, a.model, a.device, a.dtype, a.build_root, a.mode)
    except ForgeError as e:
        result = {"error": f"{e.message} ({e.hint})" if e.hint else e.message}
    except SystemExit as e:
        result = {"error": f"the model called sys.exit({e.code!r}) during the compiled-model check"}
    except Exception as e:  # noqa: BLE001 - torch.compile failing on the model: reported, the eager package stands
        result = {"error": f"torch.compile failed on the model: {type(e).__name__}: {str(e)[:2000]}"}
    from forge_pack.store.run_store import finite

    Path(a.out).write_text(json.dumps(finite(result)))
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
