"""Issue 8: forge-pack on real architectures (ResNet-50, SD3.5 VAE decode, Gemma 4 and Qwen3.5-MoE
prefill), per op and end to end, eager vs patched vs torch.compile of the whole model.

    python bench/real_models.py OUT_DIR [--models resnet50 ...] [--device cuda] [--budget N]
        [--time-limit S] [--deadline S] [--previous FILE] [--compile-mode default] [--iters N] [--small]

Per model (bench/models/<name>.py):
  1. build:   python -m forge_pack build MODEL --device D --out WORK/<m>/pkg --name <m>_forge --budget N
              --run-dir WORK/<m>/run --top K --min-share X --json   (a run dir left by a cut-off call is
              continued: forge_pack search --resume RUN, then forge_pack pack RUN --out ...)
  2. install: pip install --no-build-isolation --no-deps --no-index --target WORK/<m>/site WORK/<m>/pkg
  3. measure, in a fresh process with the package on PYTHONPATH, under torch.no_grad(): the model's own
     inputs; eager and patched (apply()/revert() outside the timed region) interleaved in blocks; then
     torch.compile(model, mode=--compile-mode) of the whole (unpatched) model; CUDA events around each
     forward (perf_counter on CPU), warm-up first, median of --iters (>= 10); max |patched - eager|;
     a torch.profiler pass of eager and patched (device busy time vs wall, top kernels).

Writes, after every phase (so a call cut off at its time limit keeps what finished):
  OUT_DIR/seed_table.json  the rows issue 8 asks for: {model, op, signature, eager_us, compile_us, kernel_us,
                           speedup_vs_eager, speedup_vs_compile, bandwidth_fraction}, per packed (or searched)
                           op from the package manifest / search, plus one {model, op: "end_to_end", ...}
  OUT_DIR/real_models.json everything (state per model, builds, manifests' targets, measurements, env); the
                           resume state: a model whose status is "done" (or "failed", unless --retry-failed)
                           is skipped; "partial" ones continue (from WORK when it is still there, else the
                           model starts again)
  OUT_DIR/real_models.md   the bench/results/README.md section (published figures side by side)
  OUT_DIR/real_models.log  the tail of every subprocess's output
  OUT_DIR/<model>_pkg.tar.gz  the built package of a model not finished in this run (if under 15 MiB), so
                           the next run, on a fresh machine too, skips its build

To continue over several runs (e.g. on a machine that limits how long one command may run), keep each
run's files in a directory and pass its real_models.json with --previous (the tarballs beside it are
used). --deadline (seconds) makes a run stop cleanly before such a limit. --report-only rebuilds the three
result files from --previous without running anything, and --update-readme FILE replaces the section
between the markers in FILE (bench/results/README.md). The commands: bench/results/README.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = ROOT / "bench" / "models"
BEGIN, END = "<!-- real_models:begin -->", "<!-- real_models:end -->"
LOG_TAIL = 60_000  # characters of each subprocess's output kept in real_models.log
TARBALL_MAX = 15 << 20  # the device tool brings back files of at most 16 MiB

# The published per-kernel figures (vs eager, GB10, after 50 iterations) and issue 8's goals.
MODELS: dict[str, dict] = {
    "resnet50": dict(
        title="ResNet-50, batch 256, 224x224, bf16", published=("adaptive_avg_pool2d", 1.52, "ResNet-50"),
        main="[256,2048,7,7]", goal_e2e=1.2,
        # avgpool is one small call (~0.5% of the forward): search every signature to reach it
        top=40, min_share=0.0),
    "sd35_vae_decode": dict(
        title="SD3.5 VAE decode, latent (1,16,128,128) -> 1024x1024, bf16",
        published=("group_norm", 1.70, "SD3.5 Medium"), main="[1,128,1024,1024]", goal_e2e=2.0,
        top=8, min_share=0.0),
    "gemma4_prefill": dict(
        title="Gemma 4 E2B-like text model, 6 layers, prefill 2048, eager attention, bf16",
        published=("softmax", 2.83, "Gemma 4 E2B"), main="[1,8,2048,2048]", goal_e2e=None,
        top=8, min_share=0.0),
    "qwen35_moe_prefill": dict(
        title="Qwen3.5-35B-A3B-like MoE text model, 4 layers (3 linear + 1 full attention), prefill 2048, bf16",
        published=("softmax", 1.54, "Qwen3.5 35B-A3B"), main="[1,16,2048,2048]", goal_e2e=None,
        top=8, min_share=0.0),
}
ROW_KEYS = ("model", "op", "signature", "eager_us", "compile_us", "kernel_us", "speedup_vs_eager",
            "speedup_vs_compile", "bandwidth_fraction")


# ----------------------------------------------------------------------------------------------------
# measuring (runs in a fresh process: `real_models.py measure ...`)
# ----------------------------------------------------------------------------------------------------

def _timer(cuda: bool):
    import torch

    def once(fn) -> float:
        if cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) * 1e3
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    return once


def _stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) >= 4 else [xs[0], 0, xs[-1]]
    return {"median_us": statistics.median(xs), "iqr_us": q[2] - q[0], "min_us": xs[0], "n": len(xs)}


def _outputs(obj) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _outputs(o)]
    return []


def _diff(a, b) -> dict:
    ta, tb = _outputs(a), _outputs(b)
    if not ta or len(ta) != len(tb):
        return {"max_abs_diff": None, "ref_max_abs": None}
    return {"max_abs_diff": max(float((x.float() - y.float()).abs().max()) for x, y in zip(ta, tb)),
            "ref_max_abs": max(float(x.float().abs().max()) for x in ta),
            "finite": all(bool(y.float().isfinite().all()) for y in tb)}


def _profile(fn, cuda: bool, n: int = 3) -> dict:
    """Device busy time vs wall per forward, and the top kernels (best effort: profiler APIs move)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    fn()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        for _ in range(n):
            fn()
        if cuda:
            torch.cuda.synchronize()
    wall_us = (time.perf_counter() - t0) * 1e6 / n
    avgs = prof.key_averages()
    out: dict = {"wall_us_per_forward": wall_us}
    if cuda:
        def dev_t(e) -> float:
            for name in ("self_device_time_total", "self_cuda_time_total"):
                v = getattr(e, name, None)
                if v is not None:
                    return float(v)
            return 0.0

        # device events, less the GPU-side copies of record_function ranges (they span kernels already counted)
        kernels = [e for e in avgs if "cuda" in str(getattr(e, "device_type", "")).lower()
                   and not getattr(e, "is_user_annotation", False)]
        busy = sum(dev_t(e) for e in kernels) / n
        out["device_busy_us_per_forward"] = busy
        out["device_busy_fraction"] = busy / wall_us if wall_us else None
        top = sorted(kernels, key=dev_t, reverse=True)[:12]
        out["top"] = [{"name": e.key[:120], "us_per_forward": dev_t(e) / n, "calls_per_forward": e.count / n,
                       "share": dev_t(e) / n / busy if busy else None} for e in top]
    else:
        top = sorted(avgs, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
        out["top"] = [{"name": e.key[:120], "us_per_forward": e.self_cpu_time_total / n,
                       "calls_per_forward": e.count / n} for e in top]
    return out


def measure(model: str, package: str | None, device: str, iters: int, warmup: int, compile_mode: str | None,
            do_profile: bool) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    from forge_pack.profile.load import load

    t_start = time.time()
    target = load(model, device, None)
    cuda = target.device == "cuda"
    once = _timer(cuda)
    fwd = target.forward
    res: dict = {"device": target.device, "iters": iters, "warmup": warmup,
                 "inputs": [{"shape": list(a.shape), "dtype": str(a.dtype).replace("torch.", "")}
                            for a in target.args if isinstance(a, torch.Tensor)]}
    with torch.no_grad():
        ref = fwd()
        pkg = None
        if package:
            try:
                pkg = importlib.import_module(package)
            except Exception as e:  # the package did not install or load: eager / compile still measured
                res["package_error"] = f"{type(e).__name__}: {e}"
        for _ in range(warmup):
            once(fwd)
        eager, patched = [], []
        if pkg is not None:
            applied = pkg.apply(target.module)
            out = fwd()
            res["applied"] = applied if isinstance(applied, (bool, int, str, list, dict)) else str(applied)
            try:
                res["status"] = pkg.status()
            except Exception as e:
                res["status"] = {"error": str(e)}
            res.update(_diff(ref, out))
            for _ in range(warmup):
                once(fwd)
            pkg.revert()
            res["bitwise_after_revert"] = all(torch.equal(a, b) for a, b in zip(_outputs(ref), _outputs(fwd())))
        blocks = 3
        per = max(1, -(-iters // blocks))
        for _ in range(blocks):  # interleaved blocks: clock / thermal drift hits both alike
            eager += [once(fwd) for _ in range(per)]
            if pkg is not None:
                pkg.apply(target.module)
                try:
                    patched += [once(fwd) for _ in range(per)]
                finally:
                    pkg.revert()
        res["eager"] = _stats(eager)
        res["patched"] = _stats(patched) if patched else None
        if do_profile:
            try:
                res["profile_eager"] = _profile(fwd, cuda)
                if pkg is not None:
                    pkg.apply(target.module)
                    try:
                        res["profile_patched"] = _profile(fwd, cuda)
                    finally:
                        pkg.revert()
            except Exception as e:
                res["profile_error"] = f"{type(e).__name__}: {e}"
        if cuda:
            res["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
        if compile_mode:
            res.update(_time_compiled(target, compile_mode, ref, once, warmup, per * blocks, cuda))
            if pkg is not None:  # both at once: the package applied, then the whole model compiled
                res.update(_compiled_patched(target, pkg, compile_mode, ref, once, warmup, per * blocks, cuda))
        res["compile_mode"] = compile_mode
    res["measure_s"] = time.time() - t_start
    return res


def _time_compiled(target, compile_mode: str, ref, once, warmup: int, n: int, cuda: bool, sfx: str = "") -> dict:
    """torch.compile of the whole model: the first call's time (compilation), the output's difference
    to eager, then `n` timed forwards; keys compile{sfx}_s, compile{sfx}_diff, compiled{sfx} (None and
    compile{sfx}_error when it fails)."""
    import torch

    try:
        cm = torch.compile(target.module, mode=None if compile_mode == "default" else compile_mode)
        t0 = time.time()
        got = cm(*target.args, **target.kwargs)
        if cuda:
            torch.cuda.synchronize()
        out = {f"compile{sfx}_s": time.time() - t0, f"compile{sfx}_diff": _diff(ref, got)}
        run = lambda: cm(*target.args, **target.kwargs)  # noqa: E731
        for _ in range(warmup):
            once(run)
        out[f"compiled{sfx}"] = _stats([once(run) for _ in range(n)])
        return out
    except Exception as e:
        return {f"compiled{sfx}": None, f"compile{sfx}_error": f"{type(e).__name__}: {str(e)[:2000]}"}


def _compiled_patched(target, pkg, compile_mode: str, ref, once, warmup: int, n: int, cuda: bool) -> dict:
    """torch.compile of the model with the package applied: Dynamo traces into the package's wrappers
    and each verified call becomes the package's custom op inside the compiled graph. Timed after
    the plain compiled model (not interleaved: both compiled graphs cannot live side by side)."""
    import torch

    torch._dynamo.reset()  # the plain compiled model's graphs must not be reused
    pkg.apply(target.module)
    try:
        return _time_compiled(target, compile_mode, ref, once, warmup, n, cuda, "_patched")
    finally:
        pkg.revert()
        torch._dynamo.reset()


# ----------------------------------------------------------------------------------------------------
# orchestration
# ----------------------------------------------------------------------------------------------------

class Deadline(Exception):
    pass


class Runner:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.t0 = time.monotonic()
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = self.out / "real_models.log"

    def remaining(self) -> float | None:
        if self.a.deadline is None:
            return None
        return self.a.deadline - (time.monotonic() - self.t0)

    def sh(self, cmd: list[str], env: dict | None = None, what: str = "") -> subprocess.CompletedProcess:
        """Runs cmd in its own process group; past the deadline the whole group is killed (Deadline)."""
        left = self.remaining()
        if left is not None and left < 20:
            raise Deadline(f"no time left to start {what or cmd[0]}")
        timeout = None if left is None else left - 10
        print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
        t0 = time.time()
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            so, se = p.communicate()
            self._log(cmd, so, se, None, time.time() - t0)
            raise Deadline(f"{what or cmd[0]} was cut off at the deadline after {time.time() - t0:.0f} s")
        self._log(cmd, so, se, p.returncode, time.time() - t0)
        return subprocess.CompletedProcess(cmd, p.returncode, so, se)

    def _log(self, cmd, so, se, rc, secs) -> None:
        with self.log.open("a") as f:
            f.write(f"\n===== {time.strftime('%H:%M:%S')} rc={rc} {secs:.1f}s $ {' '.join(cmd)}\n")
            f.write((so or "")[-LOG_TAIL // 3:])
            f.write("\n----- stderr\n")
            f.write((se or "")[-LOG_TAIL:])


def _env(extra_path: list[str] | None = None, small: bool = False) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    parts = [*(extra_path or []), str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
    if small:
        env["FORGE_BENCH_SMALL"] = "1"
    return env


def _last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON document in the output")


def build_phase(r: Runner, name: str, st: dict, work: Path) -> None:
    a, spec = r.a, MODELS[name]
    pkg_name = f"{name}_forge"
    run_dir, pkg_dir = work / "run", work / "pkg"
    manifest = pkg_dir / pkg_name / "manifest.json"
    if st.get("build", {}).get("done") and st["build"].get("written") and not manifest.is_file():
        _unpack(r, name, work)  # a fresh machine: the package an earlier run built, from its tarball
    if st.get("build", {}).get("done") and (manifest.is_file() or not st["build"].get("written")):
        return
    env = _env(small=a.small)
    py = [sys.executable, "-m", "forge_pack"]
    model = str(MODELS_DIR / f"{name}.py")
    knobs = ["--budget", str(a.budget)] + (["--time-limit", str(a.time_limit)] if a.time_limit else [])
    top = str(a.top if a.top is not None else spec["top"])
    min_share = str(a.min_share if a.min_share is not None else spec["min_share"])
    t0 = time.time()
    doc = None
    if (run_dir / "run.db").is_file():  # a cut-off build: continue its search, then pack
        st.setdefault("notes", []).append(f"resumed the search in {run_dir}")
        rs = r.sh(py + ["search", "--resume", str(run_dir), "--json"] + knobs, env, "search --resume")
        if rs.returncode == 0:
            rp = r.sh(py + ["pack", str(run_dir), "--out", str(pkg_dir), "--name", pkg_name, "--force", "--json"],
                      env, "pack")
            if rp.returncode == 0:
                doc = {"search": _last_json(rs.stdout), "pack": _last_json(rp.stdout), "resumed": True}
            else:
                st["build"] = {"done": False, "error": rp.stderr[-3000:]}
                raise RuntimeError(f"forge-pack pack failed: {rp.stderr.strip().splitlines()[-2:]}")
        else:
            st["notes"].append(f"search --resume failed ({rs.stderr.strip()[-300:]}); building afresh")
            shutil.rmtree(run_dir, ignore_errors=True)
    if doc is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = py + ["build", model, "--device", a.device, "--out", str(pkg_dir), "--name", pkg_name,
                    "--run-dir", str(run_dir), "--top", top, "--min-share", min_share, "--force", "--json"] + knobs
        rb = r.sh(cmd, env, "build")
        if rb.returncode != 0:
            st["build"] = {"done": False, "error": (rb.stdout[-1000:] + rb.stderr[-3000:])}
            raise RuntimeError("forge-pack build failed: " + " | ".join(rb.stderr.strip().splitlines()[-2:]))
        doc = _last_json(rb.stdout)
    st["build"] = {"done": True, "seconds": round(time.time() - t0, 1), "budget": a.budget, "top": int(top),
                   "min_share": float(min_share), "time_limit": a.time_limit, "resumed": bool(doc.get("resumed")),
                   "written": bool(doc["pack"].get("written")), "message": doc["pack"].get("message"),
                   "dropped": doc["pack"].get("dropped"), "model_result": doc["pack"].get("model_result"),
                   "notes": doc["pack"].get("notes")}
    st["search"] = {k: doc["search"].get(k) for k in ("status", "elapsed_s", "forward_us", "budget")}
    st["search"]["hotspots"] = [
        {k: h.get(k) for k in ("id", "rank", "op", "signature", "time_share", "skipped", "eager_us", "compile_us",
                               "compile_error", "floor_us", "winner", "speedup", "verdict")}
        | {"best": h.get("best")} for h in doc["search"].get("hotspots", [])]
    st["targets"] = []
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        st["environment"] = m.get("environment")
        for t in m["targets"]:
            tm = t["timing"]
            st["targets"].append({
                "id": t["id"], "op": t["op"], "signature": t["signature"]["pretty"],
                "eager_us": tm["eager"]["median_us"], "compile_us": (tm.get("compiled") or {}).get("median_us"),
                "kernel_us": tm["kernel"]["median_us"], "speedup_vs_eager": t["speedup"]["vs_eager"],
                "speedup_vs_compile": t["speedup"]["vs_compile"], "time_share": t["time_share"],
                "calls_per_forward": t["calls_per_forward"], "family": t["kernel"]["family"],
                "params": t["kernel"]["params"], "confirmed": t.get("confirmed"),
                "errors": t.get("errors")})
        st["build"]["model_result"] = m.get("model_result") or st["build"]["model_result"]
        _pack_tarball(r, name, st, pkg_dir)


def _pack_tarball(r: Runner, name: str, st: dict, pkg_dir: Path) -> None:
    """OUT/<model>_pkg.tar.gz: the built package, so a later call on a fresh machine skips the build."""
    import tarfile

    dest = r.out / f"{name}_pkg.tar.gz"
    with tarfile.open(dest, "w:gz") as tf:
        tf.add(pkg_dir, arcname="pkg")
    if dest.stat().st_size > TARBALL_MAX:
        dest.unlink()
        st.setdefault("notes", []).append("the package is too large to come back as a tarball; a cold machine "
                                          "rebuilds it")
    else:
        st["build"]["tarball"] = dest.name


def _unpack(r: Runner, name: str, work: Path) -> None:
    import tarfile

    dirs = [Path(r.a.previous).resolve().parent] if r.a.previous else []
    for d in dirs + [r.out]:
        tb = d / f"{name}_pkg.tar.gz"
        if tb.is_file():
            shutil.rmtree(work / "pkg", ignore_errors=True)
            with tarfile.open(tb) as tf:
                try:
                    tf.extractall(work, filter="data")
                except TypeError:  # Python without extraction filters
                    tf.extractall(work)
            print(f"[real_models] {name}: package restored from {tb}", file=sys.stderr)
            if tb.parent != r.out:
                shutil.copy2(tb, r.out / tb.name)  # comes back again with this call's files
            return


def install_phase(r: Runner, name: str, st: dict, work: Path) -> None:
    pkg_name = f"{name}_forge"
    pkg_dir, site = work / "pkg", work / "site"
    if not st["build"].get("written"):
        st["install"] = {"done": True, "skipped": "no package was written"}
        return
    if st.get("install", {}).get("done") and (site / pkg_name / "__init__.py").is_file():
        return
    shutil.rmtree(site, ignore_errors=True)
    t0 = time.time()
    ri = r.sh([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", "-q",
               "--target", str(site), str(pkg_dir)], _env(small=r.a.small), "pip install")
    st["install"] = {"done": ri.returncode == 0, "seconds": round(time.time() - t0, 1)}
    if ri.returncode != 0:
        st["install"]["error"] = (ri.stdout + ri.stderr)[-3000:]
        raise RuntimeError("pip install of the package failed")
    rv = r.sh([sys.executable, "-m", pkg_name, "verify"], _env([str(site)], r.a.small), "verify")
    st["install"]["verify_rc"] = rv.returncode
    st["install"]["verify"] = (rv.stdout + rv.stderr)[-2000:]


def measure_phase(r: Runner, name: str, st: dict, work: Path) -> None:
    a = r.a
    package = f"{name}_forge" if st["build"].get("written") and st["install"].get("done") else None
    res_file = work / "measure.json"
    res_file.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "measure", str(MODELS_DIR / f"{name}.py"),
           "--device", a.device, "--iters", str(a.iters), "--warmup", str(a.warmup),
           "--compile-mode", a.compile_mode, "--json-out", str(res_file)]
    if package:
        cmd += ["--package", package]
    if a.no_profile:
        cmd += ["--no-profile"]
    rm = r.sh(cmd, _env([str(work / "site")] if package else None, a.small), "measure")
    if rm.returncode != 0 or not res_file.is_file():
        st["measure"] = {"error": rm.stderr[-3000:]}
        raise RuntimeError("measurement failed: " + " | ".join(rm.stderr.strip().splitlines()[-2:]))
    st["measure"] = json.loads(res_file.read_text())


def run_model(r: Runner, name: str, doc: dict) -> bool:
    """True to go on with the next model, False when the deadline stopped this one."""
    st = doc["models"].setdefault(name, {"status": "pending"})
    work = Path(r.a.work) / name
    work.mkdir(parents=True, exist_ok=True)
    st["status"] = "partial"
    st.pop("error", None)
    t0 = time.time()
    try:
        for phase, fn in (("build", build_phase), ("install", install_phase), ("measure", measure_phase)):
            st["phase"] = phase
            fn(r, name, st, work)
            save(r, doc)
        st["status"] = "done"
        st.pop("phase", None)
        (r.out / f"{name}_pkg.tar.gz").unlink(missing_ok=True)  # only unfinished models need theirs next call
        st.get("build", {}).pop("tarball", None)
        return True
    except Deadline as e:
        st["status"] = "partial"
        st["error"] = f"cut off: {e}; run again with --previous to continue"
        return False
    except Exception as e:
        st["status"] = "failed"
        st["error"] = f"{type(e).__name__}: {e}"
        return True
    finally:
        st["seconds"] = round(st.get("seconds", 0) + time.time() - t0, 1)
        save(r, doc)


# ----------------------------------------------------------------------------------------------------
# results
# ----------------------------------------------------------------------------------------------------

def _f(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def _x(x):
    return "-" if x is None else f"{x:.2f}x"


def rows_for(name: str, st: dict) -> list[dict]:
    rows = []
    floors = {h["signature"]: h.get("floor_us") for h in st.get("search", {}).get("hotspots", [])}
    packed = set()
    for t in st.get("targets", []):
        packed.add(t["signature"])
        floor = floors.get(t["signature"])
        rows.append({"model": name, "op": t["op"], "signature": t["signature"], "eager_us": t["eager_us"],
                     "compile_us": t["compile_us"], "kernel_us": t["kernel_us"],
                     "speedup_vs_eager": t["speedup_vs_eager"], "speedup_vs_compile": t["speedup_vs_compile"],
                     "bandwidth_fraction": (floor / t["kernel_us"]) if floor and t["kernel_us"] else None})
    for h in st.get("search", {}).get("hotspots", []):  # searched, nothing packed: still a row, kernel_us null
        if h.get("skipped") or h["signature"] in packed:
            continue
        rows.append({"model": name, "op": h["op"], "signature": h["signature"], "eager_us": h.get("eager_us"),
                     "compile_us": h.get("compile_us"), "kernel_us": None, "speedup_vs_eager": None,
                     "speedup_vs_compile": None, "bandwidth_fraction": None})
    m = st.get("measure") or {}
    if m.get("eager"):
        e = m["eager"]["median_us"]
        p = (m.get("patched") or {}).get("median_us")
        c = (m.get("compiled") or {}).get("median_us")
        sig = "forward(" + ", ".join(f"{i['dtype']}{i['shape']}".replace(" ", "") for i in m.get("inputs", [])) + ")"
        rows.append({"model": name, "op": "end_to_end", "signature": sig, "eager_us": e, "compile_us": c,
                     "kernel_us": p, "speedup_vs_eager": e / p if p else None,
                     "speedup_vs_compile": c / p if (c and p) else None, "bandwidth_fraction": None})
    return rows


def _published(name: str, st: dict) -> dict:
    op, fig, label = MODELS[name]["published"]
    mine = [t for t in st.get("targets", []) if t["op"] == op]
    main = next((t for t in mine if MODELS[name]["main"] in t["signature"].replace(" ", "")), None)
    if main is None and mine:
        main = max(mine, key=lambda t: t["time_share"])
    best = max(mine, key=lambda t: t["speedup_vs_eager"]) if mine else None
    searched = [h for h in st.get("search", {}).get("hotspots", []) if h["op"] == op]
    return {"op": op, "published": fig, "label": label, "main": main, "best": best, "n_packed": len(mine),
            "searched": searched}


def _projection(st: dict) -> float | None:
    """Amdahl: the end-to-end speedup the packed kernels' per-op speedups and time shares allow."""
    ts = st.get("targets") or []
    if not ts:
        return None
    saved = sum(t["time_share"] * (1 - 1 / t["speedup_vs_eager"]) for t in ts if t["speedup_vs_eager"])
    return 1 / max(1 - saved, 1e-9)


def markdown(doc: dict) -> str:
    env = doc.get("env", {})
    cfg = doc.get("config", {})
    L = [BEGIN, "## Real architectures (issue 8)", "",
         f"GPU: {env.get('gpu') or 'none, CPU ' + str(env.get('cpu'))}; torch {env.get('torch')}, "
         f"CUDA {env.get('cuda')}, "
         f"Python {env.get('python')}, transformers {env.get('transformers')}, diffusers {env.get('diffusers')}, "
         f"torchvision {env.get('torchvision')}.", "",
         "Random weights, the models' own inputs (`bench/models/`); each model's search budget (evaluations "
         "and seconds per hotspot, hotspots searched) is in the notes below"
         + (", **small CPU smoke sizes (FORGE_BENCH_SMALL=1), not the real ones**" if cfg.get("small") else "")
         + f". End to end: {'CUDA events' if env.get('gpu') else 'perf_counter'} around each forward, "
         f"{cfg.get('warmup')} warm-ups, median of {_iters_text(doc)} timed forwards per variant, "
         "eager and patched interleaved in 3 blocks, "
         f"`torch.compile(model, mode=\"{cfg.get('compile_mode')}\")`"
         " of the whole model, then the same with the package applied first (timed after it, not "
         "interleaved). Per op: the package manifest (forge-pack's timing: L2 flushed, median of >= 30, "
         "compile = `torch.compile(op, mode=\"max-autotune-no-cudagraphs\")`); bandwidth fraction = bytes read "
         "and written once over the measured copy bandwidth, divided by the kernel's time.", "",
         "### Published per-kernel figures side by side", "",
         f"| model | op | published (GB10) vs eager | ours ({env.get('gpu') or 'CPU'}), main signature | vs eager "
         "| vs compile "
         "| ours, best signature | beaten? |", "|---|---|---|---|---|---|---|---|"]
    for name in MODELS:
        st = doc["models"].get(name)
        op, fig, label = MODELS[name]["published"]
        if not st or not st.get("search"):
            L.append(f"| {label} | {op} | {fig:.2f}x | not measured yet | | | | |")
            continue
        p = _published(name, st)
        if p["main"] is None:
            why = "; ".join(f"{h['signature'][:60]}: {h.get('skipped') or h.get('verdict')}" for h in p["searched"][:2])
            L.append(f"| {label} | {op} | {fig:.2f}x | no {op} kernel packed ({why or 'not among the hotspots'}) "
                     f"| | | | no |")
            continue
        mn, bs = p["main"], p["best"]
        beaten = "yes" if bs["speedup_vs_eager"] > fig else f"no ({bs['speedup_vs_eager'] / fig:.2f} of it)"
        L.append(f"| {label} | {op} | {fig:.2f}x | `{mn['signature']}` | {_x(mn['speedup_vs_eager'])} | "
                 f"{_x(mn['speedup_vs_compile'])} | {_x(bs['speedup_vs_eager'])} (`{bs['signature'][:70]}`) | "
                 f"{beaten} |")
    L += ["", "### End to end", "",
          "| model | eager ms | patched ms | torch.compile ms | patched + torch.compile ms | patched vs eager "
          "| patched vs compile | goal | kernels | Amdahl bound | max abs diff | device busy (eager) |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, spec in MODELS.items():
        st = doc["models"].get(name) or {}
        m = st.get("measure") or {}
        if not m.get("eager"):
            L.append(f"| {spec['title']} | {st.get('status', 'not run')}"
                     + (f": {str(st['error'])[:120]}" if st.get("error") else "") + " | | | | | | | | | | | |")
            continue
        e, p = m["eager"]["median_us"], (m.get("patched") or {}).get("median_us")
        c = (m.get("compiled") or {}).get("median_us")
        sp = e / p if p else None
        goal = spec["goal_e2e"]
        gtxt = "-" if goal is None else (f">= {goal}x: " + ("met" if sp and sp >= goal else
                                                            f"missed by {goal - (sp or 1):.2f}x"))
        prof = m.get("profile_eager") or {}
        busy = prof.get("device_busy_fraction")
        cp = (m.get("compiled_patched") or {}).get("median_us")
        cp_txt = (_f(cp / 1e3, 3) if cp else "failed" if m.get("compile_patched_error")
                  else "not measured" if p else "-")
        c_txt = _f(c and c / 1e3, 3) if c else "failed" if m.get("compile_error") else "-"
        L.append(f"| {spec['title']} | {e / 1e3:.3f} | {_f(p and p / 1e3, 3)} | {c_txt} | {cp_txt} | {_x(sp)} | "
                 f"{_x(c / p if c and p else None)} | {gtxt} | {len(st.get('targets', []))} | {_x(_projection(st))} | "
                 f"{_f(m.get('max_abs_diff'), 3) if m.get('max_abs_diff') is not None else '-'} | "
                 f"{'-' if busy is None else f'{100 * busy:.0f}% of wall'} |")
    L += ["", "### Per op (every packed kernel; searched hotspots with nothing packed have no kernel time)", "",
          "| model | signature | eager µs | compile µs | kernel µs | vs eager | vs compile | bandwidth fraction "
          "| share |", "|---|---|---|---|---|---|---|---|---|"]
    for name in MODELS:
        st = doc["models"].get(name) or {}
        shares = {t["signature"]: t["time_share"] for t in st.get("targets", [])}
        shares.update({h["signature"]: h["time_share"] for h in st.get("search", {}).get("hotspots", [])
                       if h["signature"] not in shares})
        for row in rows_for(name, st):
            if row["op"] == "end_to_end":
                continue
            bw = row["bandwidth_fraction"]
            sh = shares.get(row["signature"])
            L.append(f"| {name} | `{row['signature']}` | {_f(row['eager_us'])} | {_f(row['compile_us'])} | "
                     f"{_f(row['kernel_us'])} | {_x(row['speedup_vs_eager'])} | {_x(row['speedup_vs_compile'])} | "
                     f"{'-' if bw is None else f'{100 * bw:.0f}%'} | {'-' if sh is None else f'{100 * sh:.1f}%'} |")
    notes = []
    for name, spec in MODELS.items():
        st = doc["models"].get(name) or {}
        m = st.get("measure") or {}
        for key in ("error",):
            if st.get(key):
                notes.append(f"- {name}: {st[key][:300]}")
        if m.get("compile_error"):
            notes.append(f"- {name}: torch.compile failed: {m['compile_error'][:300]}")
        if m.get("package_error"):
            notes.append(f"- {name}: the package did not load: {m['package_error'][:300]}")
        b = st.get("build") or {}
        if b.get("done"):
            notes.append(f"- {name}: built with a budget of {b.get('budget')} evaluations"
                         + (f" and {b['time_limit']:g} s" if b.get("time_limit") else "")
                         + f" per hotspot, top {b.get('top')} hotspots, in {b.get('seconds')} s")
        for d in b.get("dropped") or []:
            notes.append(f"- {name}: not packed: `{d.get('pretty', '')[:100]}`: {str(d.get('reason', ''))[:200]}")
        goal = spec["goal_e2e"]
        if goal and m.get("patched") and m["eager"]["median_us"] / m["patched"]["median_us"] < goal:
            prof = m.get("profile_patched") or m.get("profile_eager") or {}
            top = ", ".join(f"{t['name'][:50]} " + (f"{100 * t['share']:.0f}%" if t.get("share") is not None
                                                     else f"{t['us_per_forward']:.0f} µs")
                            for t in (prof.get("top") or [])[:4])
            notes.append(f"- {name}: end-to-end goal {goal}x missed: the packed kernels cover "
                         f"{100 * sum(t['time_share'] for t in st.get('targets', [])):.0f}% of the eager forward, "
                         f"so Amdahl allows {_x(_projection(st))}; patched profile's top kernels: {top or 'n/a'}")
        if m.get("patched"):
            e, p = m["eager"], m["patched"]
            gap = abs(e["median_us"] - p["median_us"])
            if gap < max(e.get("iqr_us") or 0, p.get("iqr_us") or 0):
                notes.append(f"- {name}: eager and patched medians differ by {gap / 1e3:.1f} ms, less than the "
                             f"spread of the timed forwards (IQR eager {e['iqr_us'] / 1e3:.1f} ms, patched "
                             f"{p['iqr_us'] / 1e3:.1f} ms; fastest forward eager {e['min_us'] / 1e3:.1f} ms, patched "
                             f"{p['min_us'] / 1e3:.1f} ms): within noise")
        if m.get("compile_s") is not None:
            notes.append(f"- {name}: torch.compile took {m['compile_s']:.0f} s to compile")
        if m.get("compile_patched_error"):
            notes.append(f"- {name}: torch.compile of the patched model failed: {m['compile_patched_error'][:300]}")
        elif (m.get("compile_patched_diff") or {}).get("max_abs_diff") is not None:
            d = m["compile_patched_diff"]
            notes.append(f"- {name}: patched + torch.compile: compiled in {m['compile_patched_s']:.0f} s, max |out - "
                         f"eager| {d['max_abs_diff']:.3g} (torch.compile alone: "
                         f"{_f((m.get('compile_diff') or {}).get('max_abs_diff'), 3)})")
    if notes:
        L += ["", "Notes:", ""] + notes
    L += ["", "Commands (each run resumes from the previous run's real_models.json):", "",
          "```", *doc.get("commands", []), "```", "", END]
    return "\n".join(L) + "\n"


def _iters_text(doc: dict) -> str:
    """How many forwards each model's medians come from: one number, or one per model when they differ."""
    per = {name: (st.get("measure") or {}).get("iters") for name, st in doc["models"].items()
           if (st.get("measure") or {}).get("eager")}
    counts = set(per.values())
    if len(counts) <= 1:
        return str(next(iter(counts), (doc.get("config") or {}).get("iters")))
    return "(" + ", ".join(f"{name} {n}" for name, n in per.items()) + ")"


def environment(a) -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "host": platform.node(), "cpu": platform.processor() or platform.machine()}
    if torch.cuda.is_available() and a.device == "cuda":
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, capability=f"{p.major}.{p.minor}")
    for mod in ("transformers", "diffusers", "torchvision"):
        try:
            env[mod] = importlib.import_module(mod).__version__
        except Exception:
            env[mod] = None
    sys.path.insert(0, str(ROOT / "bench"))
    from _common import commit

    env["forge_pack_commit"] = commit()
    return env


def save(r: Runner, doc: dict) -> None:
    write_results(r.out, doc)


def write_results(out: Path, doc: dict) -> None:
    from forge_pack.store.run_store import finite

    out.mkdir(parents=True, exist_ok=True)
    rows = [row for name in MODELS if name in doc["models"] for row in rows_for(name, doc["models"][name])]
    (out / "seed_table.json").write_text(json.dumps(finite(rows), indent=1))
    (out / "real_models.json").write_text(json.dumps(finite(doc), indent=1))
    (out / "real_models.md").write_text(markdown(doc))


def update_readme(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section.strip() + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + section
    path.write_text(text)
    print(f"updated {path}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["measure"]:
        p = argparse.ArgumentParser(prog="real_models.py measure")
        p.add_argument("model")
        p.add_argument("--package", default=None)
        p.add_argument("--device", default="cuda")
        p.add_argument("--iters", type=int, default=30)
        p.add_argument("--warmup", type=int, default=5)
        p.add_argument("--compile-mode", default="default")
        p.add_argument("--no-profile", action="store_true")
        p.add_argument("--json-out", required=True)
        a = p.parse_args(argv[1:])
        res = measure(a.model, a.package, a.device, a.iters, a.warmup,
                      None if a.compile_mode == "none" else a.compile_mode, not a.no_profile)
        Path(a.json_out).write_text(json.dumps(res, indent=1, default=str))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", nargs="?", default=None,
                   help="output directory (default: $OUT, else bench/results; with --small runs/real_models_small)")
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget", type=int, default=12, help="evaluations per hotspot (forge-pack build --budget)")
    p.add_argument("--time-limit", type=float, default=None, help="seconds of search per hotspot")
    p.add_argument("--top", type=int, default=None, help="override each model's --top")
    p.add_argument("--min-share", type=float, default=None, help="override each model's --min-share")
    p.add_argument("--iters", type=int, default=30, help="timed forwards per variant (median; at least 10)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile-mode", default="default",
                   help="torch.compile mode for the whole model: default, max-autotune-no-cudagraphs, ... or none")
    p.add_argument("--no-profile", action="store_true", help="skip the torch.profiler pass")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds from start: stop (killing the running step) and save before this")
    p.add_argument("--previous", default=None, help="a real_models.json from an earlier run to continue from")
    p.add_argument("--retry-failed", action="store_true")
    p.add_argument("--redo", nargs="*", default=[], help="models to run again even if done")
    p.add_argument("--work", default=str(ROOT / "runs" / "real_models"),
                   help="run dirs, packages and install targets (kept between calls while the machine is warm)")
    p.add_argument("--small", action="store_true", help="FORGE_BENCH_SMALL=1: CPU smoke-test sizes")
    p.add_argument("--report-only", action="store_true", help="only rewrite the result files from --previous")
    p.add_argument("--update-readme", default=None, help="replace the real_models section of this README")
    a = p.parse_args(argv)
    if a.out is None:
        a.out = os.environ.get("OUT") or str(ROOT / ("runs/real_models_small" if a.small else "bench/results"))
    if a.iters < 10:
        p.error("--iters must be at least 10")
    sys.path.insert(0, str(ROOT))
    r = Runner(a)
    doc: dict = {"models": {}}
    for src in (a.previous, r.out / "real_models.json"):
        if src and Path(src).is_file():
            prev = json.loads(Path(src).read_text())
            doc["models"].update(prev.get("models", {}))
            for k in ("env", "config", "commands"):
                doc.setdefault(k, prev.get(k))
    if not a.report_only:
        doc["env"] = environment(a)
        doc["config"] = {k: getattr(a, k) for k in ("device", "budget", "time_limit", "top", "min_share", "iters",
                                                    "warmup", "compile_mode", "small")}
        shown = ["$OUT" if x == os.environ.get("OUT") else shlex.quote(x) for x in argv]
        cmd = "python3 bench/real_models.py " + " ".join(shown)
        doc["commands"] = list(dict.fromkeys([*(doc.get("commands") or []), cmd.strip()]))
        write_results(r.out, doc)
        for name in a.models:
            st = doc["models"].get(name, {})
            if name not in a.redo and (st.get("status") == "done" or (st.get("status") == "failed"
                                                                        and not a.retry_failed)):
                print(f"[real_models] {name}: {st['status']} in an earlier run, skipped", file=sys.stderr)
                continue
            if name in a.redo:
                doc["models"].pop(name, None)
                shutil.rmtree(Path(a.work) / name, ignore_errors=True)
            print(f"[real_models] {name} ...", file=sys.stderr, flush=True)
            if not run_model(r, name, doc):
                print(f"[real_models] {name}: cut off at the deadline, state saved", file=sys.stderr)
                break
            st = doc["models"][name]
            print(f"[real_models] {name}: {st['status']} in {st['seconds']:.0f} s"
                  + (f" ({st['error']})" if st.get("error") else ""), file=sys.stderr, flush=True)
    write_results(r.out, doc)
    section = markdown(doc)
    print(section)
    if a.update_readme:
        update_readme(Path(a.update_readme), section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
