"""Confirmation before packing: does each winner still win on inputs it has never seen?

1. Per kernel (``confirm_kernels``): a fresh Evaluator (new worker processes) re-verifies each
   winning candidate with ``final=True`` (input sets drawn for the final check only, never used in
   the search) and re-times it against eager PyTorch and torch.compile, timed again in that same
   fresh worker. A winner that fails verification, or whose kernel is measured slower than eager
   (by more than the noise or by less), is dropped with the reason.
2. Whole model (``check_model``): the staged package's sources are compiled with the same
   generated binding (``torch.utils.cpp_extension.load``, cached per source hash) and patched in by
   the package's own ``_patch.py``, in a subprocess (a torch op namespace can be registered once
   per process); the model runs on the user's inputs, original and patched: max output difference,
   argmax agreement for classifier/LM-shaped outputs, end-to-end latency of both. ``only``
   restricts the patching to some targets of the same compiled package (``model_gate`` checks
   each kernel alone that way, without timing).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from forge_pack.core.errors import ForgeError
from forge_pack.core.winner import clearly_faster
from forge_pack.evaluate.device_pool import confirm_pool, first_gpu
from forge_pack.evaluate.model_accuracy import compare_outputs, precise_reference, seeded_forward
from forge_pack.core.verdict import Baseline, Evaluation, Timing

CONFIRM_FILE = "confirm.json"
MODEL_CHECK_TIMEOUT_S = 3600  # the first build compiles the extension (torch headers): minutes on a small CPU


@dataclass
class KernelConfirmation:
    hotspot_id: str
    node_id: int
    cand_hash: str
    kept: bool
    reason: str  # why it was dropped; a note when kept
    evaluation: Evaluation | None
    baseline: Baseline | None

    def to_json(self) -> dict:
        return {"hotspot_id": self.hotspot_id, "node_id": self.node_id, "cand_hash": self.cand_hash,
                "kept": self.kept, "reason": self.reason,
                "evaluation": self.evaluation.to_json() if self.evaluation else None,
                "baseline": self.baseline.to_json() if self.baseline else None}

    @staticmethod
    def from_json(d: dict) -> "KernelConfirmation":
        return KernelConfirmation(d["hotspot_id"], d["node_id"], d["cand_hash"], d["kept"], d["reason"],
                                  Evaluation.from_json(d["evaluation"]) if d.get("evaluation") else None,
                                  Baseline.from_json(d["baseline"]) if d.get("baseline") else None)


def judge(evaluation: Evaluation, baseline: Baseline) -> tuple[bool, str]:
    """Keep, or drop with the reason. Dropped: wrong on unseen inputs, or measured slower than eager
    at all (by more than the noise of the two medians, two standard errors of their difference
    from the IQRs: "did not hold"; by less: still slower, never shipped)."""
    v = evaluation.verdict
    if not v.ok:
        first = (v.detail or "").strip().splitlines()[0][:300] if v.detail else ""
        return False, f"failed verification on unseen inputs ({v.reason}{': ' + first if first else ''})"
    k, e = evaluation.timing, baseline.eager
    if k is None or k.median_us <= 0:
        return False, "no timing came back from the fresh process"
    speedup = e.median_us / k.median_us
    line = (f"{speedup:.2f}x eager in a fresh process (kernel {k.median_us:.1f} µs, IQR {k.iqr_us:.1f}, n={k.n}; "
            f"eager {e.median_us:.1f} µs, IQR {e.iqr_us:.1f}, n={e.n})")
    if clearly_faster(e, k):
        return False, f"the speedup did not hold: {line}"
    if speedup < 1.0:
        # Within the noise, the bar is "not slower" (as fast as eager is kept): the search already
        # demanded WIN_MARGIN; confirmation only refuses a kernel that may slow the op down.
        return False, f"slower than eager (within measurement noise, but not faster), so not shipped: {line}"
    return True, line


def _load_cached(run_dir: Path) -> dict[str, KernelConfirmation]:
    path = run_dir / CONFIRM_FILE
    try:
        return {k: KernelConfirmation.from_json(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _default_evaluator(info, backend: str):
    from forge_pack.evaluate.evaluator import Evaluator

    cfg = info.config or {}
    # A seed the search never used: the baselines' and the final check's random inputs are new too.
    seed = int(cfg.get("seed", 0) or 0) + 1_000_003
    return Evaluator(backend=backend, workers=1, timeout_s=float(cfg.get("timeout_s", 60.0) or 60.0), seed=seed,
                     run_dir=info.run_dir, pool=confirm_pool(cfg, backend))


def confirm_kernels(info, winners: list, *, say: Callable[[str], None] = lambda s: None,
                    evaluator_factory: Callable[[Any, str], Any] | None = None, reuse: bool = True
                    ) -> dict[str, KernelConfirmation]:
    """Re-verify and re-time every winner in a fresh Evaluator; results saved in the run dir."""
    run_dir = Path(info.run_dir)
    cached = _load_cached(run_dir) if reuse else {}
    out: dict[str, KernelConfirmation] = {}
    todo = []
    for w in winners:
        c = cached.get(w.hotspot.id)
        if c is not None and c.node_id == w.node_id and c.cand_hash == w.candidate.content_hash:
            out[w.hotspot.id] = c
        else:
            todo.append(w)
    if todo:
        backend = "cuda" if info.device == "cuda" else "cpu"
        try:
            evaluator = (evaluator_factory or _default_evaluator)(info, backend)
        except ForgeError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. no worker process could start
            raise ForgeError(f"the {backend} evaluator for the confirmation could not start: {type(e).__name__}: {e}",
                             "`forge-pack doctor` checks the toolchain; --no-confirm packs without confirmation")
        try:
            for w in todo:
                sig = w.hotspot.signature.pretty()
                say(f"  {sig}: re-timing eager and torch.compile, re-verifying {w.candidate.label}")
                try:
                    base = evaluator.baseline(w.hotspot)
                except Exception as e:  # noqa: BLE001 - one broken baseline drops one kernel, not the pack
                    out[w.hotspot.id] = KernelConfirmation(w.hotspot.id, w.node_id, w.candidate.content_hash, False,
                                                           f"eager could not be re-timed: {e}", None, None)
                    continue
                ev = evaluator.evaluate(w.candidate, w.hotspot, base, final=True)
                kept, reason = judge(ev, base)
                out[w.hotspot.id] = KernelConfirmation(w.hotspot.id, w.node_id, w.candidate.content_hash, kept, reason,
                                                       ev, base)
                say(f"    {'kept' if kept else 'DROPPED'}: {reason}")
        finally:
            close = getattr(evaluator, "close", None)
            if callable(close):
                close()
    merged = {**cached, **out}
    tmp = run_dir / f".{CONFIRM_FILE}.tmp"
    from forge_pack.store.run_store import finite

    tmp.write_text(json.dumps(finite({k: v.to_json() for k, v in merged.items()}), indent=2))
    os.replace(tmp, run_dir / CONFIRM_FILE)
    return out


# ------------------------------------------------------------------ development loader


def sources_hash(package_dir: Path, doc: dict) -> str:
    h = hashlib.sha256(json.dumps(doc["build"], sort_keys=True).encode())
    for p in sorted((package_dir / "csrc").rglob("*")):
        if p.is_file():
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def dev_patcher(package_dir: str | Path, build_root: str | Path | None = None, verbose: bool = False,
                only: list[str] | None = None):
    """A Patcher for an (uninstalled) package directory: its sources compiled by cpp_extension.load
    with the manifest's flags, its own _patch.py driving the patching. One per process. ``only``:
    the target ids it patches (the extension still holds them all: it is built once per sources)."""
    d = Path(package_dir)
    name = next(p.parent.name for p in d.glob("*/_patch.py"))
    spec = importlib.util.spec_from_file_location(f"_forge_dev_{name}_patch", d / name / "_patch.py")
    assert spec is not None and spec.loader is not None
    patch_mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = patch_mod
    spec.loader.exec_module(patch_mod)
    doc = patch_mod.load_manifest(d / name)
    digest = sources_hash(d, doc)
    if only is not None:
        # a subset of the sealed manifest no longer matches its digest: drop the seal, not a warning
        doc = {**{k: v for k, v in doc.items() if k != "integrity"},
               "targets": [t for t in doc["targets"] if t["id"] in only]}
    build_dir = Path(build_root or Path.home() / ".cache" / "forge-pack" / "package-builds") / f"{name}-{digest}"

    def load_extension() -> None:
        if doc["backend"] == "cuda":
            _ensure_cuda_home()
        from torch.utils import cpp_extension

        build = doc["build"]
        if doc["backend"] == "cuda":
            os.environ["TORCH_CUDA_ARCH_LIST"] = build["cuda_arch_list"]
        build_dir.mkdir(parents=True, exist_ok=True)
        cpp_extension.load(name=f"{name}_dev_{digest}", sources=[str(d / s) for s in build["sources"]],
                           extra_cflags=build["cxx_flags"], extra_cuda_cflags=build["nvcc_flags"],
                           extra_ldflags=build["ldflags"], build_directory=str(build_dir),
                           with_cuda=doc["backend"] == "cuda", is_python_module=False, verbose=verbose)

    return patch_mod.Patcher(doc, name, load_extension)


def _ensure_cuda_home() -> None:
    """Point torch's extension builder at a CUDA toolkit with headers (same rule as the package's setup.py)."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    import shutil

    nvcc = shutil.which("nvcc")
    candidates = [Path(os.path.realpath(nvcc)).parent.parent] if nvcc else []
    candidates += [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"), reverse=True)]
    for home in candidates:
        if (home / "include" / "cuda_runtime_api.h").is_file() and (home / "bin" / "nvcc").exists():
            os.environ["CUDA_HOME"] = str(home)
            if "torch.utils.cpp_extension" in sys.modules:
                sys.modules["torch.utils.cpp_extension"].CUDA_HOME = str(home)
            return


# ------------------------------------------------------------------ whole model


def check_model(package_dir: Path, name: str, info, timeout_s: float = MODEL_CHECK_TIMEOUT_S,
                only: list[str] | None = None) -> dict:
    """Run the whole-model comparison in a subprocess; the result dict for the manifest. ``only``:
    patch just these target ids and skip the timing (the gate's per-kernel attribution)."""
    out = Path(package_dir) / ".model_check.json"
    cmd = [sys.executable, "-m", "forge_pack.evaluate.confirm", "model-check", str(package_dir), info.model_path,
           "--device", info.device, "--out", str(out), "--build-root", str(Path(info.run_dir) / "package-builds")]
    if info.dtype:
        cmd += ["--dtype", info.dtype]
    if only is not None:
        cmd += ["--only", ",".join(only)]
    gpu = first_gpu(info.config or {}) if info.device == "cuda" else None
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu) if gpu else None  # a --gpus run: its first GPU's model
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise ForgeError(f"the whole-model check ran longer than {timeout_s:.0f} s", "see the run dir, or use --debug")
    try:
        result = json.loads(out.read_text())
    except (OSError, ValueError):
        result = None
    finally:
        out.unlink(missing_ok=True)
    if r.returncode != 0 or result is None or "error" in (result or {}):
        detail = (result or {}).get("error") or (r.stdout + r.stderr)[-4000:]
        raise ForgeError(f"the package failed its whole-model check:\n{detail}",
                         "this is a forge-pack bug if it is a compile error in csrc/; --debug keeps more detail")
    return result


def _time_pair(run_a: Callable, run_b: Callable, enter_b: Callable, exit_b: Callable, cuda: bool, budget_s: float,
               max_n: int) -> tuple[Timing, Timing]:
    """Interleaved timing of two forwards, so drift hits both alike; B runs between enter_b() and
    exit_b() (apply / revert), which stay outside the timed region. Medians and IQRs."""
    import torch

    from forge_pack.evaluate.timing import summarize

    def once(fn) -> float:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e6

    def b() -> float:
        enter_b()
        try:
            return once(run_b)
        finally:
            exit_b()

    for _ in range(2):  # warm-up: allocator, lazy init, OpenMP pools
        once(run_a)
        b()
    ta, tb = [], []
    start = time.perf_counter()
    while len(ta) < max_n and (len(ta) < 5 or time.perf_counter() - start < budget_s):
        ta.append(once(run_a))
        tb.append(b())
    return summarize(ta, "monotonic"), summarize(tb, "monotonic")


def model_check(package_dir: str, model: str, device: str, dtype: str | None, build_root: str | None,
                only: list[str] | None = None) -> dict:
    from forge_pack.profile.load import load

    patcher = dev_patcher(package_dir, build_root, only=only)
    if not patcher.load():
        return {"error": f"the package's extension did not load: {patcher.load_error}"}
    target = load(model, device, dtype)
    return compare_patched(target, patcher, timed=only is None)


def compare_patched(target, patcher, timed: bool = True) -> dict:
    """The model's output, original and patched (and the float64/float32 yardstick), each forward
    seeded alike on fresh inputs and its output cloned (model_accuracy.seeded_forward): a forward
    that draws random numbers, writes into its inputs or returns a buffer it reuses is compared
    with itself, not with another draw or the same buffer. Then interleaved latency of both."""
    import torch

    cuda = target.device == "cuda"
    module, args, kwargs, device = target.module, target.args, target.kwargs, target.device
    with torch.inference_mode():
        ref = seeded_forward(module, args, kwargs, device)
    gold, gold_note = precise_reference(module, args, kwargs, device)
    with torch.inference_mode():
        if not patcher.apply(module):
            return {"error": f"the package did not apply: {patcher.load_error}"}
        try:
            got = seeded_forward(module, args, kwargs, device)
            calls = dict(patcher.kernel_calls)
            fallbacks = dict(patcher.fallback_calls)
            patcher.revert()

            def forward() -> None:
                target.forward()

            if timed:
                t_eager, t_patched = _time_pair(forward, forward, lambda: patcher.apply(target.module),
                                                patcher.revert, cuda, budget_s=20.0, max_n=50)
        finally:
            patcher.revert()
    result = compare_outputs(ref, got, gold, gold_note)
    result.update(kernel_calls=calls, fallback_calls=fallbacks)
    if timed:
        result.update(eager=t_eager.to_json(), patched=t_patched.to_json(),
                      speedup=t_eager.median_us / max(t_patched.median_us, 1e-9))
    if not calls:
        result["note"] = "no call of the model reached a kernel (every call fell back to PyTorch)"
    return result


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m forge_pack.evaluate.confirm")
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model-check")
    m.add_argument("package_dir")
    m.add_argument("model")
    m.add_argument("--device", default="cpu")
    m.add_argument("--dtype", default=None)
    m.add_argument("--out", required=True)
    m.add_argument("--build-root", default=None)
    m.add_argument("--only", default=None, help="comma-separated target ids: patch only these, no timing")
    a = p.parse_args(argv)
    try:
        only = [t for t in a.only.split(",") if t] if a.only is not None else None
        result = model_check(a.package_dir, a.model, a.device, a.dtype, a.build_root, only)
    except ForgeError as e:
        result = {"error": f"{e.message} ({e.hint})" if e.hint else e.message}
    except SystemExit as e:  # the model's own sys.exit outside load()'s guard (a forward run here)
        result = {"error": f"the model called sys.exit({e.code!r}) during the whole-model check"}
    except Exception as e:  # noqa: BLE001 - reported to the parent with the traceback
        import traceback

        result = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-4000:]}"}
    from forge_pack.store.run_store import finite

    Path(a.out).write_text(json.dumps(finite(result)))
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
