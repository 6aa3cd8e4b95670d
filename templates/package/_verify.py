"""``python -m <package> verify``: the build's final check, run again on this machine.

"Verified" is defined once, in ``_verdict_rules.py``: a byte-for-byte copy of the forge-pack module
the build's workers ran (its sha256 is in manifest.json's ``verify_rules`` and checked here first).
What each target kind is (its float64 reference, eager call, input generators, tolerance rows)
comes from ``_targets/``, the build's target registry copied verbatim (its digest is in
``targets_runtime``, checked here too).
Per target this runs the same input kinds as the build's final check:

- ``captured[i]``: the model's own tensors shipped in fixtures/ (those that fit the size cap);
- ``fresh[i]``: random inputs drawn from a seed chosen per run (printed; ``--seed`` repeats it);
- ``derived:<kind>``: the same transforms (scale, shift, permutation, per-row magnitudes, sign
  flips) of a captured set, or of a fresh one where the target ships no fixture, seeded per run;
- ``adversarial:<kind>``: the same generators (large values, large offsets, -inf rows, constants).

Conv epilogue regions (compile mode: conv -> batch_norm folded at build time (-> add) (-> activation)):
per region the compile gate kept and per build instance (one folded weight file each), the path the
op runs (cuDNN's fused call, or the folded convolution and the package's epilogue kernel) on fresh
activations, against the same folded tensors computed in float64. The bound is a forward error
bound of that computation (``conv_bound``): the convolution's accumulation over its K products, the
roundings of the output dtype, the activation's slope. A wrong, missing or misplaced bias, residual,
activation, channel or layout exceeds it. (That the folding equals the original chain was checked
by the build on the model's own tensors; at run time a model whose parameters differ from the
folded ones runs the original ops.)

The build also tries odd sizes; the package's guard sends every call whose shape is not the
verified one to the original op, so no odd size can ever reach a shipped kernel and none is run.

Per input set: the float64 reference and eager PyTorch's own error (the allowance by magnitude)
from the copied rules, then two calls of the kernel, each checked as the build checks it: output
elements still holding the NaN sentinel (unwritten_output), values out of tolerance (mismatch; for a
region rounded in 16-bit floats, judged once more under its second key, each element's sensitivity
to those roundings, as the build judges: ``rejudge`` in the copied rules), NaN/Inf parity (nan),
every input bitwise unchanged (input_mutated), the second output bitwise equal to the first
(nondeterministic). The op allocates its own output, so the sentinel is written
into the block the allocator hands out next; the row says whether the op got that block.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from pathlib import Path

import torch

from . import _PATCHER
from . import _verdict_rules as rules
from ._integrity import file_sha256, files_digest
from ._patch import DTYPES, ORIGINALS, TARGETS

HERE = Path(__file__).resolve().parent
# The line that ends the generated header of _verdict_rules.py (forge_pack.pack.packager writes it).
HEADER_END = b"# ---- end of forge-pack header ----\n"


def rules_sha256() -> str:
    """sha256 of the copied rules without the generated header: the forge-pack source's hash."""
    text = (HERE / "_verdict_rules.py").read_bytes()
    i = text.find(HEADER_END)
    return hashlib.sha256(text[i + len(HEADER_END):] if i >= 0 else text).hexdigest()


def targets_sha256() -> str:
    """The digest of the shipped target registry (_targets/*.py), as forge-pack recorded it."""
    files = sorted((HERE / "_targets").glob("*.py"))
    return files_digest({f.name: file_sha256(f.read_bytes()) for f in files})


def _lookup(owner: str, attr: str):
    """The PyTorch function as it was when the package was imported: never a patched one."""
    fn = ORIGINALS.get((owner, attr))
    if fn is None:
        fn = getattr({"torch": torch, "torch.nn.functional": torch.nn.functional}[owner], attr)
    return fn


def _plain_inputs(t: dict) -> list:
    return [(n, None if s is None else (s["dtype"], tuple(s["shape"]), tuple(s["strides"])))
            for n, s in t["signature"]["inputs"]]


def _params(t: dict) -> dict:
    return {k: v for k, v in t["signature"]["params"]}


def _spec(t: dict):
    """The target's spec: its kind's, or a region's built from the canonical form in its parameters."""
    return TARGETS.spec_for_entry(t["op"], _params(t))


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & ((1 << 63) - 1)


def eager(t: dict):
    """The original PyTorch op of target `t`, as a function of the named tensors."""
    return _spec(t).eager(_params(t), t["signature"]["output"]["dtype"], _lookup)


def draw(t: dict, kind: str, seed: int, device) -> dict:
    """One input set of kind 'fresh' or an adversarial kind, from the copied generators."""
    return _spec(t).make_inputs(_plain_inputs(t), kind, torch.Generator().manual_seed(seed), device)


def _fixture(t: dict, rel: str, device) -> dict:
    from safetensors.torch import load_file

    raw = load_file(str(HERE / rel))
    out = {}
    for name, spec in _plain_inputs(t):
        if spec is None:
            out[name] = None
            continue
        tensor = torch.empty_strided(spec[1], spec[2], dtype=DTYPES[spec[0]], device=device)
        tensor.copy_(raw[f"in.{name}"].view(spec[1]))
        out[name] = tensor
    return out


def derive(t: dict, kind: str, sources: list, seed: int) -> dict:
    """One derived set (kind of DERIVED_KINDS): the copied rules pick one of ``sources`` (makers of
    the captured sets, else of the fresh ones) and transform it, from one generator, as the build
    does; only the picked source is loaded."""
    gen = torch.Generator().manual_seed(seed)
    source = sources[rules.derived_source(len(sources), gen)]()
    return rules.derive_inputs(_spec(t), _params(t), kind, source, gen)


def input_sets(t: dict, device, seed: int, fresh: int):
    """(kind, make) per input set: captured, fresh, derived, adversarial."""
    captured = [lambda rel=rel: _fixture(t, rel, device) for rel in t["fixtures"]]
    drawn = [lambda i=i: draw(t, "fresh", _seed(seed, t["id"], "fresh", i), device) for i in range(fresh)]
    # the build derives from its captured sets, else from its fresh draw: here from the shipped
    # fixtures, else from this run's fresh draws (fresh[0]'s draw even under --random 0)
    sources = captured or drawn or [lambda: draw(t, "fresh", _seed(seed, t["id"], "fresh", 0), device)]
    sets = [(f"captured[{i}]", make) for i, make in enumerate(captured)]
    sets += [(f"fresh[{i}]", make) for i, make in enumerate(drawn)]
    sets += [(f"derived:{k}", lambda k=k: derive(t, k, sources, _seed(seed, t["id"], "derived", k)))
             for k in rules.DERIVED_KINDS]
    sets += [(f"adversarial:{k}", lambda k=k: draw(t, k, _seed(seed, t["id"], "adversarial", k), device))
             for k in _spec(t).adversarial]
    return sets


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# c10's CPU allocator can fill every new block with this 32-bit pattern (its junk-fill debug flag):
# a quiet NaN whose payload no arithmetic produces, like the sentinel. Where the output still holds
# it, the kernel never wrote.
_JUNK = 0x7FEDBEEF


def _cpu_junk_fill() -> bool:
    """Turn c10's junk fill on for this verify process; False where this torch build lacks the flag."""
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
        ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_cpu_allocator_do_junk_fill").value = True
    except (OSError, ValueError):
        return False
    probe = torch.empty(2, dtype=torch.int32)
    return bool((probe == _JUNK).all())


def _junk_to_sentinel(out: torch.Tensor) -> None:
    """Rewrite elements still holding the allocator's junk into the rules' sentinel, so the rules'
    own count finds them. 2-byte dtypes: only the NaN half of the pattern (0x7fed) counts, the
    other half (0xbeef) is an ordinary number a kernel may well write."""
    int_dtype, bits = rules.SENTINEL[rules.dtype_name(out.dtype)]
    n = out.untyped_storage().nbytes()
    raw = torch.tensor([_JUNK], dtype=torch.int32).repeat((n + 3) // 4).view(torch.uint8)[:n]
    pattern = raw.view(int_dtype).as_strided(out.shape, out.stride(), out.storage_offset())
    junk = out.view(int_dtype) == pattern
    if out.element_size() == 2:
        junk &= pattern == 0x7FED
    out.view(int_dtype)[junk] = bits


def _call(fn, args: list, out_spec: dict, device: str, junk: bool) -> tuple[torch.Tensor, bool]:
    """Call the op with the sentinel waiting in the memory its output gets; returns the output and
    whether the sentinel check applies. On CPU, c10 junk-fills every new block (``junk``). On CUDA,
    a block of the output's exact size, filled with the sentinel, is the only free block in the
    caching allocator when the op asks for its output, so the op gets it."""
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # no other free block of the output's size for the op to take
        block = torch.empty_strided(out_spec["shape"], out_spec["strides"], dtype=DTYPES[out_spec["dtype"]],
                                    device=device)
        rules.fill_sentinel(block)
        _sync(device)
        ptr = block.data_ptr()
        del block
    with torch.inference_mode():
        out = fn(*args)
    _sync(device)
    if not device.startswith("cuda"):
        if junk:
            _junk_to_sentinel(out)
        return out, junk
    return out, out.data_ptr() == ptr


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return sa.nbytes() > 0 and sb.nbytes() > 0 and a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes()


def check_set(t: dict, fn, kind: str, x: dict, device: str, junk: bool = False) -> dict:
    """One input set through the kernel, judged by the copied rules. A row: kind, errors, the rule,
    the reason of the first failed check (None when it passed, 'skipped' when eager itself breaks
    NaN/Inf parity there, as the build skips it)."""
    spec, out_spec = _spec(t), t["signature"]["output"]
    row = {"kind": kind, "max_abs": None, "max_rel": None, "atol": None, "rtol": None, "allowance": None,
           "sentinel": False, "reason": None, "detail": "", "binding": None}
    with torch.inference_mode():
        ref = spec.reference64(_params(t), x, _lookup)
        eager_out = eager(t)(x)
    _sync(device)
    mag = rules.magnitude(spec, x)
    allow = rules.allowance(eager_out, ref, out_spec["dtype"], spec, mag)
    del eager_out
    if allow is None:
        return {**row, "reason": "skipped", "detail": "eager PyTorch itself differs from float64 in NaN/Inf positions"}
    row["allowance"] = float(allow.max())
    present = [x[n] for n, s in t["signature"]["inputs"] if s is not None]
    names = [n for n, s in t["signature"]["inputs"] if s is not None]
    saved = [v.clone() for v in present]

    def damage(out: torch.Tensor, run: str) -> tuple[str, str] | None:
        for n, v, s in zip(names, present, saved):
            if _overlaps(out, v):
                return "aliasing", f"{kind}: the output shares memory with input {n}"
            changed = rules.input_change(n, v, s, kind, run)
            if changed is not None:
                return changed
        got = (rules.dtype_name(out.dtype), list(out.shape), list(out.stride()))
        want = (out_spec["dtype"], list(out_spec["shape"]), list(out_spec["strides"]))
        if got != want:
            return "layout", f"{kind}: output {got[0]}{got[1]} strides {got[2]}, verified {want[0]}{want[1]} {want[2]}"
        return None

    try:
        first, armed = _call(fn, present, out_spec, device, junk)
    except RuntimeError as e:  # the op refused the call or the kernel failed to launch
        return {**row, "reason": "launch_error", "detail": f"{kind}: {str(e).splitlines()[0][:300]}"}
    row["sentinel"] = armed
    bad = damage(first, "first")
    if bad is None:
        cmp, reason, detail = rules.judge_output(first, ref, out_spec["dtype"], spec, allow, kind, mag)
        if reason == "mismatch":  # the kind's second key, as the build judges (verdict_rules.rejudge)
            with torch.inference_mode():
                again = rules.rejudge(first, ref, out_spec["dtype"], spec, kind, x, lambda: eager(t)(x))
            if again is not None and again[1] is None:
                cmp, reason, detail, allow, mag = again
                row["allowance"] = float(allow.max())
        row.update(max_abs=cmp.max_abs_err, max_rel=cmp.max_rel_err, atol=cmp.atol, rtol=cmp.rtol)
        if reason in (None, "mismatch"):
            row["binding"] = binding_element(first, ref, allow, cmp.atol, cmp.rtol, mag)
        bad = (reason, detail) if reason is not None else None
    if bad is None:
        second, armed2 = _call(fn, present, out_spec, device, junk)
        row["sentinel"] = armed and armed2
        bad = damage(second, "second") or rules.repeat_change(second, first, kind)
    if bad is not None:
        row["reason"], row["detail"] = bad
    return row


def binding_element(out: torch.Tensor, ref: torch.Tensor, allow: torch.Tensor, atol: float, rtol: float,
                    mag: torch.Tensor | None) -> dict | None:
    """The element closest to failing, with its bound spelled out: the same per-element bound the
    copied rules apply (max(atol, eager allowance at that magnitude) + rtol x |ref|), and the element
    of the largest relative error with the term that lets it pass. None when no element is finite."""
    best = rel_best = None
    table = allow.to(ref.device)
    flat_out, flat_ref = out.reshape(-1), ref.reshape(-1)
    for start in range(0, flat_ref.numel(), rules._CHUNK):
        o = flat_out[start:start + rules._CHUNK].to(torch.float64)
        r = flat_ref[start:start + rules._CHUNK].to(torch.float64)
        fin = torch.isfinite(o) & torch.isfinite(r)
        if not fin.any():
            continue
        zero = torch.zeros_like(r)
        err = torch.where(fin, (o - r).abs(), zero)
        floor = table[rules._bucket(torch.where(fin, rules._key(r, mag, start), zero))]
        absolute = floor.clamp_min(atol)
        bound = absolute + rtol * r.abs()
        ratio = torch.where(fin, err / bound.clamp_min(1e-300), torch.full_like(r, -1.0))
        rel = torch.where(fin, err / r.abs().clamp_min(max(atol, 1e-300)), torch.full_like(r, -1.0))
        for which, score in (("bind", ratio), ("rel", rel)):
            i = int(score.argmax())
            row = {"err": float(err[i]), "ref": float(r[i]), "absolute": float(absolute[i]),
                   "allowance": float(floor[i]), "bound": float(bound[i]), "ratio": float(ratio[i]),
                   "rel": float(rel[i]), "score": float(score[i])}
            if which == "bind" and (best is None or row["score"] > best["score"]):
                best = row
            if which == "rel" and (rel_best is None or row["score"] > rel_best["score"]):
                rel_best = row
    if best is None:
        return None
    return {**best, "atol": atol, "rtol": rtol, "max_rel": rel_best}


def explain(b: dict | None) -> str:
    """One line: the binding element's error against its bound, and why the largest relative error
    passes when it exceeds rtol (the absolute term dominates where |ref| is near zero)."""
    if b is None:
        return "no finite element to compare"
    term = (f"atol {b['atol']:.1e}" if b["absolute"] <= b["atol"] else
            f"eager allowance {b['absolute']:.1e} (above atol {b['atol']:.1e})")
    ok = b["ratio"] <= 1
    share = f"{100 * b['ratio']:.0f}% of the bound" if b["ratio"] < 10 else f"{b['ratio']:.3g}x the bound"
    # not the word FAIL: the row above carries the verdict, and a grep for failing rows must count it once
    text = (f"closest to its bound: |err| {b['err']:.1e} at ref {b['ref']:.1e}: bound {term} + rtol {b['rtol']:.0e} "
            f"x |ref| = {b['bound']:.1e} -> {'ok' if ok else 'out of tolerance'} ({share})")
    r = b["max_rel"]
    if r is not None and r["rel"] > b["rtol"] and r["err"] <= r["bound"]:
        text += (f"; max rel err {r['rel']:.1e} > rtol is at ref {r['ref']:.1e}, where |err| {r['err']:.1e} is "
                 f"within the absolute term {r['absolute']:.1e} (near-zero |ref|: rtol x |ref| = "
                 f"{b['rtol'] * abs(r['ref']):.1e} allows almost nothing there)")
    return text


def _fmt(v: float | None, width: int) -> str:
    return f"{'-':>{width}}" if v is None else f"{v:>{width}.2e}"


def run(device: str, fresh: int = 3, seed: int | None = None, say=print) -> int:
    """Verify every target; print a row per target and input set; 0 when all pass, else 1."""
    if not _PATCHER.load():
        say(f"FAIL: cannot verify on this machine: {_PATCHER.load_error}")
        return 1
    m = _PATCHER.manifest
    failures = 0
    recorded = (m.get("verify_rules") or {}).get("source_sha256")
    have = rules_sha256()
    if recorded != have:
        say(f"FAIL rules: _verdict_rules.py (sha256 {have[:16]}) is not the file this package was built with "
            f"({(recorded or 'none recorded')[:16]}): reinstall the package")
        failures += 1
    runtime = m.get("targets_runtime")
    if runtime is not None and runtime.get("source_sha256") != targets_sha256():
        say(f"FAIL targets: _targets/ (digest {targets_sha256()[:16]}) is not the target registry this package was "
            f"built with ({str(runtime.get('source_sha256'))[:16]}): reinstall the package")
        failures += 1
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    junk = device == "cpu" and _cpu_junk_fill()
    say(f"verification rules: forge_pack/evaluate/verdict_rules.py sha256 {have[:16]} (the build's final check); "
        f"fresh and derived inputs seed {seed}; device {device}")
    say("an element passes when |out - ref| <= max(atol, eager allowance) + rtol * |ref| against float64; "
        "allowance: 2x eager PyTorch's own error at that magnitude. 'max rel' is |out - ref| / max(|ref|, atol): "
        "where |ref| is near zero the absolute term sets the bound, so a relative error above rtol passes there "
        "while the absolute error stays within it. Under each row: the element closest to its bound.")
    say(f"{'target':<7} {'input':<24} {'max abs':>9} {'max rel':>9} {'atol':>9} {'allow<=':>9} {'rtol':>9} "
        f"{'sentinel':>8}  result")
    checks = 0
    for t in m["targets"]:
        fn = next(p for p in _PATCHER.targets if p.id == t["id"]).fn
        out_dtype = t["signature"]["output"]["dtype"]
        tol = rules.tolerance(_spec(t), out_dtype)
        mt = t["tolerance"]
        if (mt["atol"], mt["rtol"], mt.get("eager_slack")) != (tol.atol, tol.rtol, rules.EAGER_SLACK):
            say(f"{t['id']:<7} FAIL tolerance: the manifest records atol {mt['atol']}, rtol {mt['rtol']}, "
                f"slack {mt.get('eager_slack')}; the rules say {tol.atol}, {tol.rtol}, {rules.EAGER_SLACK}")
            failures += 1
        for kind, make in input_sets(t, device, seed, fresh):
            r = check_set(t, fn, kind, make(), device, junk)
            if r["reason"] == "skipped":
                say(f"{t['id']:<7} {kind:<24} skipped: {r['detail']}")
                continue
            checks += 1
            ok = r["reason"] is None
            failures += not ok
            say(f"{t['id']:<7} {kind:<24} {_fmt(r['max_abs'], 9)} {_fmt(r['max_rel'], 9)} {_fmt(r['atol'], 9)} "
                f"{_fmt(r['allowance'], 9)} {_fmt(r['rtol'], 9)} {'armed' if r['sentinel'] else 'no':>8}  "
                + ("PASS" if ok else f"FAIL {r['reason']}: {r['detail']}"))
            if r.get("binding") is not None:
                say(f"{'':<7} {'':<24} {explain(r['binding'])}")
    conv_checks, conv_failures = _verify_conv_regions(m, device, seed, say)
    checks, failures = checks + conv_checks, failures + conv_failures
    n = len(m["targets"])
    say(f"{'PASS' if failures == 0 else 'FAIL'}: {n} kernel{'s' if n != 1 else ''}, {failures} failing checks on "
        f"{device} ({checks} input sets, seed {seed})")
    return 0 if failures == 0 else 1


# ---------------------------------------------------------------- conv epilogue regions

UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24}
TF32_ROUNDOFF = 2.0 ** -11  # an fp32 convolution on a GPU may round its inputs to TF32 (cudnn.allow_tf32)
ACTIVATION_SLOPE = {"": 1.0, "relu": 1.0, "silu": 1.1, "gelu": 1.13, "gelu_tanh": 1.13}  # max |f'|, rounded up
EPILOGUE_ROUNDINGS = 3  # (y + b), (+ r) and the activation, each at most once in the output dtype


def _activation64(name: str, z: torch.Tensor) -> torch.Tensor:
    if name == "relu":
        return z.clamp_min(0.0)
    if name == "silu":
        return torch.nn.functional.silu(z)
    if name in ("gelu", "gelu_tanh"):
        return torch.nn.functional.gelu(z, approximate="tanh" if name == "gelu_tanh" else "none")
    if name:
        raise ValueError(f"unknown activation {name!r}")
    return z


def conv_bound(op, digest: str, x: torch.Tensor, r: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 chain, per-element error bound) of conv region ``op`` on the folded tensors of ``digest``:
    z = conv(x, w) + b (+ r), out = act(z), all in float64; the bound is
    atol + slope * (u * ROUNDINGS * (|conv| + |b| + |r|) + (K * 2^-24 + tf32) * conv(|x|, |w|)) + u * |out|,
    u the output dtype's unit roundoff, K the products per output element."""
    w, b, _ = op.folded(digest, x.device)
    a = op.args
    conv = torch.ops.aten.convolution.default
    y = conv(x.double(), w.double(), None, *a)
    mag = conv(x.double().abs(), w.double().abs(), None, *a)
    shape = [1, -1] + [1] * (y.dim() - 2)
    b64 = b.reshape(-1).double().view(shape)
    z = y + b64
    size = y.abs() + b64.abs()
    if r is not None:
        z = z + r.double()
        size = size + r.double().abs()
    out = _activation64(op.conv["activation"], z)
    dtype = op.entry["output"]["dtype"]
    u = UNIT_ROUNDOFF[dtype]
    k = w.numel() // w.shape[0]  # products per output element: one output channel's weights
    tf32 = TF32_ROUNDOFF if (x.dtype == torch.float32 and x.is_cuda and torch.backends.cudnn.allow_tf32) else 0.0
    slope = ACTIVATION_SLOPE[op.conv["activation"]]
    bound = rules.TABLE[dtype].atol + slope * (u * EPILOGUE_ROUNDINGS * size + (k * 2.0 ** -24 + 2 * tf32) * mag) \
        + u * out.abs()
    return out, bound


def _drawn(spec: dict, gen: torch.Generator, device: str) -> torch.Tensor:
    t = torch.empty_strided(tuple(spec["shape"]), tuple(spec["strides"]), dtype=DTYPES[spec["dtype"]], device=device)
    return t.copy_(torch.randn(tuple(spec["shape"]), generator=gen, device=device))


def check_conv_instance(op, digest: str, device: str, seed: int) -> dict:
    """{reason (None: pass), detail, max_abs, excess}: the op's path for build instance ``digest`` on one fresh
    draw of the activation (and residual), checked as the build checks a kernel: layout, every input unchanged,
    NaN/Inf where the float64 chain has them, each element within ``conv_bound``."""
    form = op.entry["form"]["inputs"]
    gen = torch.Generator(device=device).manual_seed(seed)
    x = _drawn(form[op.ix], gen, device)
    r = _drawn(form[op.ir], gen, device) if op.ir is not None else None
    saved = [t.clone() for t in (x, r) if t is not None]
    row = {"reason": None, "detail": "", "max_abs": None, "excess": None}
    try:
        with torch.no_grad():
            got = op.run_folded(digest, x, r)
            _sync(device)
    except Exception as e:  # a folded file that is not the build's (CorruptFolded), or the call failing
        row.update(reason="integrity" if type(e).__name__ == "CorruptFolded" else "error",
                   detail=f"{type(e).__name__}: {e}")
        return row
    with torch.no_grad():
        want, bound = conv_bound(op, digest, x, r)
    o = op.entry["output"]
    if got.dtype != DTYPES[o["dtype"]] or tuple(got.shape) != tuple(o["shape"]) or \
            tuple(got.stride()) != tuple(o["strides"]):
        row.update(reason="layout", detail=f"{got.dtype} {tuple(got.shape)} strides {tuple(got.stride())}, the region's "
                                           f"{o['dtype']} {tuple(o['shape'])} strides {tuple(o['strides'])}")
        return row
    if any(not torch.equal(a, b) for a, b in zip([t for t in (x, r) if t is not None], saved)):
        row.update(reason="input_mutated", detail="an input changed")
        return row
    g = got.double()
    finite = torch.isfinite(want)
    if not torch.equal(finite, torch.isfinite(g)):
        row.update(reason="nan", detail="NaN/Inf where the float64 chain has none, or the other way round")
        return row
    err = (g - want).abs()[finite]
    row["max_abs"] = err.max().item() if err.numel() else 0.0
    over = (err - bound[finite])
    row["excess"] = over.max().item() if over.numel() else float("-inf")
    if row["excess"] > 0:
        i = int(over.argmax())
        row.update(reason="mismatch", detail=f"|out - ref| {err[i].item():.4g} above its bound {bound[finite][i].item():.4g} "
                                             f"(ref {want[finite][i].item():.4g}, out {g[finite][i].item():.4g})")
    return row


def _verify_conv_regions(m: dict, device: str, seed: int, say=print) -> tuple[int, int]:
    """(checks, failures) over the manifest's conv regions (module docstring); a row per instance."""
    regions = [r for r in (m.get("regions") or []) if r.get("conv")]
    if not regions:
        return 0, 0
    from . import _compile

    checks = failures = 0
    for r in regions:
        if not (r.get("compile") or {}).get("use", True):
            say(f"{r['id']:<7} {'conv region':<24} skipped: not used ({(r.get('compile') or {}).get('reason', '')})")
            continue
        try:
            op = _compile._register_conv_region(_compile._Region(r, _PATCHER.namespace), _PATCHER)
        except Exception as e:  # a package whose conv runtime does not load: one failing row, not a traceback
            failures += 1
            say(f"{r['id']:<7} {'conv region':<24} FAIL load: {type(e).__name__}: {e}")
            continue
        for i, inst in enumerate(r["conv"]["instances"]):
            checks += 1
            row = check_conv_instance(op, inst["digest"], device, _seed(seed, r["id"], i))
            ok = row["reason"] is None
            failures += not ok
            label = f"{r['conv']['candidate']} #{i}"
            say(f"{r['id']:<7} {label[:24]:<24} {_fmt(row['max_abs'], 9)}  "
                + ("PASS" if ok else f"FAIL {row['reason']}: {row['detail']}")
                + f"  ({r['conv']['pattern']}, {inst.get('module') or inst['digest'][:12]})")
    return checks, failures
