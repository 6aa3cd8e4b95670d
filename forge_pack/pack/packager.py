"""Pack a finished run into a pip-installable accelerator package.

Reads the run store (each hotspot's best node, its evaluation, its baseline; the captured
tensors), re-confirms each winner in a fresh process (``forge_pack.evaluate.confirm``), and writes the
package described in the design (``templates/package/`` holds its static files; everything
generated is data: the manifest, the C++ binding and launchers, fixtures, the README):

    <out>/pyproject.toml, setup.py, MANIFEST.in, README.md
    <out>/csrc/binding.cpp, t0_<op>.cu|.cpp (verbatim), t0_launch.cu|.cpp
    <out>/<pkg>/__init__.py, _patch.py, __main__.py, manifest.json, manifest.schema.json, fixtures/
    <out>/<pkg>/_verdict_rules.py (forge_pack/evaluate/verdict_rules.py verbatim), _verify.py
    <out>/<pkg>/_targets/ (the target registry's runtime modules of forge_pack/targets, verbatim)
    <out>/<pkg>/_graph/ (compile mode's region matcher: forge_pack/graph's canonical form code, verbatim)

The package is staged next to ``out`` and moved into place only when complete, so a failed
pack never leaves half a package behind. No winner: no package, and the reason.
"""

from __future__ import annotations

import hashlib
import json
import keyword
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from forge_pack.pack import binding, manifest as manifest_mod
from forge_pack.core.candidate import Candidate
from forge_pack.core.errors import ForgeError
from forge_pack.core.progress_line import step
from forge_pack.core.hotspot import Hotspot
from forge_pack.core.winner import WIN_MARGIN, is_winner
from forge_pack.store import run_queries
from forge_pack.store.run_store import STORE_FILE, check_store, open_readonly
from forge_pack.store.vocabulary import HotspotStatus, MetaKey
from forge_pack.core.verdict import Baseline, Evaluation

# Fixtures ship inside the package: keep it small (a VAE group_norm capture alone is 0.5 GiB).
FIXTURE_BYTES_PER_TARGET = 16 << 20
FIXTURE_BYTES_TOTAL = 64 << 20
PACKAGE_VERSION = "0.1.0"
# Written at the top of every package directory: --force replaces a directory only when it holds this.
PACKAGE_MARKER = ".forge-pack-package"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_RESERVED = {"torch", "forge_pack", "test", "tests", "setuptools", "pip", "numpy", "safetensors", "jsonschema",
             "typer", "triton", "csrc", "build", "dist"}


@dataclass
class Winner:
    hotspot: Hotspot
    rank: int
    node_id: int
    candidate: Candidate
    evaluation: Evaluation
    baseline: Baseline | None
    stats: dict  # {"evaluations": n, "verdicts": {reason: n}}


@dataclass
class RunInfo:
    run_dir: Path
    model_path: str
    model_hash: str | None
    device: str
    dtype: str | None
    env: dict
    config: dict
    forward_us: float | None


@dataclass
class PackResult:
    written: bool
    message: str
    out_dir: str | None = None
    package: str | None = None
    targets: list[dict] = field(default_factory=list)
    dropped: list[dict] = field(default_factory=list)
    model_result: dict | None = None
    wheel: str | None = None
    notes: list[str] = field(default_factory=list)
    compile_result: dict | None = None  # the compile gate's summary (forge_pack.evaluate.compile_gate)

    def to_json(self) -> dict:
        return {"written": self.written, "message": self.message, "out_dir": self.out_dir, "package": self.package,
                "targets": [{"id": t["id"], "signature": t["signature"]["pretty"], "speedup": t["speedup"],
                             "time_share": t["time_share"]} for t in self.targets],
                "dropped": self.dropped, "model_result": self.model_result, "wheel": self.wheel, "notes": self.notes,
                "compile_result": self.compile_result}


# ------------------------------------------------------------------ names


def default_name(model_path: str) -> str:
    stem = re.sub(r"[^a-z0-9_]+", "_", Path(model_path).stem.lower()).strip("_") or "model"
    if not stem[0].isalpha():
        stem = "m_" + stem
    return f"{stem[:50]}_forge"


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise ForgeError(f"invalid package name {name!r}: it must be a Python module name in lower case "
                         "(a letter, then letters, digits or _, at most 64 characters)",
                         "e.g. --name resnet_kernels")
    if keyword.iskeyword(name) or name in _RESERVED or name in getattr(sys, "stdlib_module_names", ()):
        raise ForgeError(f"invalid package name {name!r}: it would shadow the Python module {name!r}",
                         f"choose another, e.g. --name {name}_kernels")
    return name


def _min_sm_count(cand, env: dict) -> dict:
    """{"min_sm_count": SMs} for a kernel whose grid is sized to every SM of the search GPU."""
    from forge_pack.search.families import is_co_resident

    sms = env.get("sm_count")
    if cand.origin == "template" and is_co_resident(cand.op, cand.backend, cand.family) and sms:
        return {"min_sm_count": int(sms)}
    return {}


def check_out_dir(out_dir: Path, force: bool, run_dir: str | Path | None = None) -> None:
    """Refuse, before any work, an --out that would lose something: the run directory or a folder
    holding it (whatever --force says), an existing path without --force, and with --force
    anything but a package directory forge-pack wrote (``PACKAGE_MARKER`` at its top) or an
    empty directory. --force replaces, it never deletes what is not ours."""
    out = Path(out_dir).resolve()
    if run_dir is not None:
        rd = Path(run_dir).resolve()
        if out == rd or out in rd.parents:
            what = "is" if out == rd else "holds"
            raise ForgeError(f"--out {out} {what} the run directory {rd}: writing the package there would delete "
                             "the run store and its captured inputs",
                             "choose an --out outside the run directory, e.g. --out "
                             f"{rd.parent / (rd.name + '-package')}")
    if out.exists() and not force:
        raise ForgeError(f"{out} already exists", "choose another --out, or pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise ForgeError(f"{out} exists and is not a directory", "choose another --out")
    if out.exists() and not is_our_package(out) and any(out.iterdir()):
        raise ForgeError(f"--force replaces only a package directory forge-pack wrote, and {out} is not one "
                         f"(it has no {PACKAGE_MARKER})",
                         f"choose another --out, or move {out} away yourself if nothing in it is needed")
    # the parent must be creatable and writable now, not after a search of many minutes
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ForgeError(f"cannot create {out}: {parent} is not a writable directory",
                         "choose an --out under a directory you can write to")


def is_our_package(directory: Path) -> bool:
    """Whether `directory` is a package forge-pack wrote: its marker file is there and says so."""
    try:
        doc = json.loads((Path(directory) / PACKAGE_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("written_by") == "forge-pack"


def write_marker(directory: Path, name: str) -> None:
    (directory / PACKAGE_MARKER).write_text(json.dumps(
        {"written_by": "forge-pack", "package": name, "forge_pack_version": manifest_mod.forge_version(),
         "note": "forge-pack build/pack --force may replace this directory; it replaces no directory without "
                 "this file"}, indent=2) + "\n")


# ------------------------------------------------------------------ reading the run


def read_run(run_dir: str | Path) -> RunInfo:
    rd = Path(run_dir)
    if not (rd / STORE_FILE).is_file():
        raise ForgeError(f"{rd} is not a forge-pack run directory (no run.db)",
                         "pass the run directory printed by `forge-pack search` or `forge-pack build`")
    check_store(rd)
    conn = open_readonly(rd)
    try:
        row = run_queries.latest_run(conn)
        meta = run_queries.meta(conn)
    finally:
        conn.close()
    if row is None:
        raise ForgeError(f"{rd} holds no run yet", "run `forge-pack search` or `forge-pack build` first")
    forward = meta.get(MetaKey.FORWARD_US)
    return RunInfo(rd, row["model_path"] or "", row["model_hash"] or None, row["device"] or "cpu", row["dtype"] or None,
                   json.loads(row["env_json"] or "{}"), json.loads(row["config_json"] or "{}"),
                   float(forward) if forward not in (None, "") else None)


def collect(run_dir: str | Path) -> tuple[list[Winner], list[dict]]:
    """Each searched hotspot's best kernel if it won (ok, >= WIN_MARGIN over eager), else why not."""
    conn = open_readonly(run_dir)
    winners, dropped = [], []
    try:
        for row in run_queries.hotspots(conn):
            if row["status"] == HotspotStatus.SKIPPED:
                continue
            h = Hotspot.from_json(json.loads(row["hotspot_json"]))
            evals = run_queries.verdict_reasons(conn, h.id)
            verdicts: dict[str, int] = {}
            for reason in evals:
                verdicts[reason] = verdicts.get(reason, 0) + 1
            stats = {"evaluations": len(evals), "verdicts": verdicts}
            note = {"hotspot_id": h.id, "op": h.op, "pretty": h.signature.pretty()}
            best = row["best_node_id"]
            if best is None:
                if evals:
                    dropped.append({**note, "reason": f"no candidate passed verification in {len(evals)} evaluations"})
                continue
            node = run_queries.candidate_json(conn, best)
            ev = run_queries.evaluation_json(conn, best)
            if node is None or ev is None:
                continue
            evaluation = Evaluation.from_json(ev)
            speedup = evaluation.speedup_vs_eager or 0.0
            if not evaluation.verdict.ok or not is_winner(speedup):
                dropped.append({**note, "reason": f"the best correct kernel ran at {speedup:.2f}x eager, under the "
                                                  f"{WIN_MARGIN:.2f}x needed to count as faster"})
                continue
            base = Baseline.from_json(json.loads(row["baseline_json"])) if row["baseline_json"] else None
            stats["within_noise"] = within_noise(conn, h.id, best, evaluation)
            winners.append(Winner(h, row["rank"], best, Candidate.from_json(node),
                                  evaluation, base, stats))
    finally:
        conn.close()
    return winners, dropped


# One kernel's median, timed again in another run on a busy 2-core CPU, moved by up to ~7% with a small
# IQR (two searches of tests/pack/e2e_model.py); a candidate this close to the winner can rank first in a
# rerun even when this run's IQRs say otherwise.
RERUN_SPREAD = 1.10


def within_noise(conn, hotspot_id: str, best_id: int, best: Evaluation) -> list[dict]:
    """The other correct candidates of a hotspot that a rerun, timing them again, could rank first:
    the winner is not faster than them by more than the measurement noise of the two timings, or by
    more than RERUN_SPREAD (the search keeps the first found unless a later one is faster beyond the
    noise: mcts.replaces_best)."""
    from forge_pack.core.winner import clearly_faster

    if best.timing is None:
        return []
    out = []
    for node_id, doc in run_queries.ok_evaluations(conn, hotspot_id):
        ev = Evaluation.from_json(doc)
        if node_id == best_id or ev.timing is None:
            continue
        if not clearly_faster(best.timing, ev.timing) or ev.timing.median_us <= best.timing.median_us * RERUN_SPREAD:
            out.append({"node_id": node_id, "speedup": ev.speedup_vs_eager, "median_us": ev.timing.median_us})
    return out


def rerun_notes(winners: list[Winner]) -> list[str]:
    """Why a rerun of the same model and budget may ship other kernels: for each winner, the
    candidates measured within noise of it."""
    notes = []
    for w in winners:
        near = w.stats.get("within_noise") or []
        if not near:
            continue
        best = w.evaluation.speedup_vs_eager or 0.0
        others = ", ".join(f"#{n['node_id']} {n['speedup']:.2f}x" for n in near[:4]) + (" ..." if len(near) > 4 else "")
        notes.append(f"{w.hotspot.signature.pretty()}: the winner #{w.node_id} ({best:.2f}x in the search) is within "
                     "measurement "
                     f"noise (or {100 * (RERUN_SPREAD - 1):.0f}%) of {len(near)} other correct "
                     f"kernel{'s' if len(near) != 1 else ''} ({others}): a rerun timing them again may ship "
                     "one of those instead (the search keeps the first found unless a later one is faster "
                     "beyond the noise)")
    return notes


# ------------------------------------------------------------------ the package


def templates_dir() -> Path:
    from forge_pack.evaluate.compile import templates_dir as tdir

    return tdir() / "package"


# The CPU instruction set the package's C++ code is compiled for (--cpu-isa). The search compiles
# with -march=native; a package is meant to move, so it defaults to a level every CPU of the last
# decade has: x86-64-v3 (AVX2, FMA: Intel from Haswell 2013, AMD from Excavator 2015) keeps the
# kernels' vector code, and the whole-model check measures the package as built with it. "native"
# (this CPU only, checked before loading) on request.
X86_ISAS = ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "native")
ARM_ISAS = ("armv8-a", "armv8.2-a", "native")


def cpu_isas() -> tuple[str, ...]:
    import platform

    return ARM_ISAS if platform.machine().lower() in ("aarch64", "arm64") else X86_ISAS


def default_cpu_isa() -> str:
    return "armv8-a" if cpu_isas() is ARM_ISAS else "x86-64-v3"


def check_cpu_isa(isa: str | None) -> str:
    isa = isa or default_cpu_isa()
    if isa not in cpu_isas():
        raise ForgeError(f"unknown --cpu-isa {isa!r} for this machine",
                         f"choose one of {', '.join(cpu_isas())} (default {default_cpu_isa()}; native: this CPU only)")
    return isa


def isa_macros(source: str) -> list[str]:
    """The CPU instruction-set macros (__AVX2__, ...) a kernel's preprocessor conditionals test: such a
    kernel was verified as compiled with -march=native, and another --cpu-isa could select other code."""
    from forge_pack.evaluate import build_parity as bp

    found = []
    for m in bp._CONDITIONAL.finditer(source):
        found += [n for n in bp._IDENT.findall(m.group(2)) if bp._ISA.match(n)]
    return list(dict.fromkeys(found))


def build_flags(backend: str, cpu_isa: str | None = None) -> dict:
    """Compiler flags of the package build: the search compiler's, minus what setup.py owns, with
    -march=native replaced by the chosen instruction set (host code of a CUDA package too)."""
    from forge_pack.evaluate import compile as comp

    isa = check_cpu_isa(cpu_isa)
    march = f"-march={isa}"
    drop = {"-shared", "-fPIC", "-v"}
    if backend == "cpu":
        cxx = [march if f.startswith("-march=") else f
               for f in comp.CPU_FLAGS if f not in drop and not f.startswith("-std=")]
        if march not in cxx:
            cxx.append(march)
        ld = ["-fopenmp"] if "-fopenmp" in cxx else []
        return {"cxx_flags": cxx, "nvcc_flags": [], "ldflags": ld, "cpu_isa": isa}
    nvcc, skip = [], False
    for f in comp.NVCC_FLAGS:  # drop -std (torch chooses) and the "-Xptxas -v" resource report
        if skip:
            skip = False
            continue
        if f == "-Xptxas":
            skip = True
            continue
        if not f.startswith("-std="):
            nvcc.append(f)
    return {"cxx_flags": ["-O3", march], "nvcc_flags": nvcc, "ldflags": [], "cpu_isa": isa}


def cuda_arch_list(env: dict) -> str:
    cc = env.get("compute_capability")
    if cc:
        return str(cc)
    forced = os.environ.get("FORGE_PACK_CUDA_ARCH", "")
    m = re.match(r"sm_(\d+)(\d)$", forced)
    if m:
        return f"{m.group(1)}.{m.group(2)}"
    raise ForgeError("the run does not record the GPU's compute capability, so the package cannot pick its CUDA "
                     "architecture", "set FORGE_PACK_CUDA_ARCH=sm_90 (for example) to the GPU the kernels were "
                                     "verified on")


def _header_dirs(backend: str) -> list[Path]:
    from forge_pack.evaluate.compile import templates_dir as tdir

    return [tdir() / "kernels" / backend]


def stage_package(stage: Path, name: str, info: RunInfo, winners: list[Winner], confirmations: dict,
                  dropped: list[dict], cpu_isa: str | None = None) -> dict:
    """Write the package into `stage` (manifest without the whole-model result); returns the manifest."""
    from forge_pack.evaluate import tolerance
    from forge_pack.targets.ops import with_output

    backend = "cuda" if info.device == "cuda" else "cpu"
    namespace = f"{name}_ops"
    csrc, pkg = stage / "csrc", stage / name
    (pkg / "fixtures").mkdir(parents=True)
    csrc.mkdir()
    write_marker(stage, name)
    env = manifest_mod.environment(info.device, info.env)
    version = manifest_mod.forge_version()
    codes, targets = [], []
    fixture_total = 0
    ext = "cu" if backend == "cuda" else "cpp"
    for i, w in enumerate(winners):
        tid = f"t{i}"
        sig = with_output(w.hotspot.signature)
        cand = w.candidate
        if cand.backend != backend:
            raise ForgeError(f"the winner for {sig.pretty()} is a {cand.backend} kernel in a {backend} run",
                             "the run store is inconsistent; run the search again")
        kernel_file, launcher_file = f"csrc/{tid}_{sig.op}.{ext}", f"csrc/{tid}_launch.{ext}"
        (stage / kernel_file).write_text(cand.source)
        for inc in binding.local_includes(cand.source):
            if (csrc / inc).exists():
                continue
            found = next((d / inc for d in _header_dirs(backend) if (d / inc).is_file()), None)
            if found is None:
                raise ForgeError(f"the kernel for {sig.pretty()} includes \"{inc}\", which forge-pack cannot find",
                                 "kernels may include only forge-pack's own helper headers")
            (csrc / inc).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(found, csrc / inc)
        launch = binding.resolve_launch(cand, sig, f"fp_{name}_{tid}")
        code = binding.TargetCode(tid, sig, cand, kernel_file, launcher_file, launch)
        (stage / launcher_file).write_text(binding.launcher_source(code, name, version))
        codes.append(code)
        conf = confirmations.get(w.hotspot.id)
        ev = conf.evaluation if conf is not None and conf.evaluation is not None else w.evaluation
        base = conf.baseline if conf is not None and conf.baseline is not None else w.baseline
        source = "confirm" if conf is not None and conf.evaluation is not None else "search"
        if base is None or ev.timing is None:
            raise ForgeError(f"the run has no eager timing for {sig.pretty()}", "run the search again")
        fixtures = []
        for j, rel in enumerate(w.hotspot.captures):
            src = info.run_dir / rel
            size = src.stat().st_size if src.is_file() else None
            if size is None or size > FIXTURE_BYTES_PER_TARGET or fixture_total + size > FIXTURE_BYTES_TOTAL:
                continue  # too large to ship: verify uses fresh random inputs of the same signature
            dest = f"fixtures/{tid}_{j}.safetensors"
            shutil.copy2(src, pkg / dest)
            fixtures.append(dest)
            fixture_total += size
        tol = tolerance.tolerance(sig, sig.output.dtype)
        kernel_t, eager_t, comp_t = ev.timing, base.eager, base.compiled
        targets.append({
            "id": tid, "hotspot_id": w.hotspot.id, "op": sig.op, "signature": sig.to_json(),
            "call_paths": list(w.hotspot.call_paths), "module_class": w.hotspot.module_class,
            "module_code": w.hotspot.module_code,
            "torch_op": f"{namespace}::{tid}",
            "kernel": {"backend": backend, "file": kernel_file, "launcher": launcher_file,
                       "symbols": [k["symbol"] for k in launch["kernels"]], "family": cand.family,
                       "params": dict(cand.params), "origin": cand.origin, "hash": cand.content_hash,
                       "source_sha256": _sha256(cand.source), **_min_sm_count(cand, env)},
            "launch": launch,
            "tolerance": {"atol": tol.atol, "rtol": tol.rtol, "reason": tol.reason,
                          "eager_slack": tolerance.EAGER_SLACK},
            "errors": {"captured": _errors(ev, "captured"), "fresh": _errors(ev, "fresh"), "source": source},
            "timing": {"eager": eager_t.to_json(), "compiled": comp_t.to_json() if comp_t else None,
                       "kernel": kernel_t.to_json(), "source": source},
            "speedup": {"vs_eager": eager_t.median_us / kernel_t.median_us,
                        "vs_compile": comp_t.median_us / kernel_t.median_us if comp_t else None},
            "time_share": min(max(w.hotspot.time_share, 0.0), 1.0), "calls_per_forward": w.hotspot.calls_per_forward,
            "search": {**w.stats, "best_node_id": w.node_id}, "fixtures": fixtures,
            "confirmed": source == "confirm",
            **(_attention_entry(w.hotspot, f"{namespace}::{tid}") or _region_entry(sig, f"{namespace}::{tid}"))})
    (csrc / "binding.cpp").write_text(binding.binding_source(codes, name, namespace, version))
    flags = build_flags(backend, cpu_isa)
    doc = {
        "schema_version": manifest_mod.SCHEMA_VERSION,
        "package": {"name": name, "version": PACKAGE_VERSION, "namespace": namespace},
        "forge_pack_version": version, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        # the file's name, not its path: a package records no folder of the build machine
        "model": {"name": Path(info.model_path).stem or "model", "path": Path(info.model_path).name,
                  "sha256": info.model_hash, "device": "cuda" if info.device == "cuda" else "cpu", "dtype": info.dtype},
        "environment": env, "backend": backend,
        "build": {"cuda_arch_list": cuda_arch_list(env) if backend == "cuda" else None, **flags,
                  "sources": ["csrc/binding.cpp"] + [c.launcher_file for c in codes]},
        "targets": targets, "dropped": dropped, "model_result": None,
    }
    from forge_pack.pack.conv_pack import conv_regions

    # conv chains first: compile mode tries regions in this order, and a chain holds a batch_norm region
    regions = conv_regions(winners, targets, info.run_dir, pkg, namespace) + _compile_regions(targets)
    if regions:
        doc["regions"] = regions
    _copy_static(stage, name, doc)
    doc["verify_rules"] = vendor_verify_rules(pkg, version)
    doc["targets_runtime"] = vendor_targets(pkg)
    doc["graph_runtime"] = vendor_graph(pkg)
    manifest_mod.write(pkg / "manifest.json", doc)
    shutil.copy2(manifest_mod.SCHEMA_PATH, pkg / "manifest.schema.json")
    return doc


def _compile_regions(targets: list[dict]) -> list[dict]:
    """The manifest's ``regions`` (what compile mode's graph pass swaps, docs/package.md): one per region
    target, under the target's id, so the compile gate's record for that id decides both."""
    entries = [{"id": t["id"], "name": t["region"]["name"], "form": t["region"]["form"], "op": t["region"]["entry"],
                "output": t["region"]["output"],
                **{k: t["region"][k] for k in ("args", "causal_mask", "window") if k in t["region"]}}
               for t in targets if t.get("region")]
    # an attention chain holds a softmax region: tried first, or that region's swap would break the chain's match;
    # of one form's attention regions, those computing a causal mask (each swapped only where its mask is proven
    # that one) before the one reading the mask, which is right for any mask and takes the matches left
    return sorted(entries, key=lambda e: ("args" not in e, "causal_mask" not in e))


def _attention_entry(hotspot, torch_op: str) -> dict:
    """An attention target found as an eager attention chain (``graph/attention_hotspots``): its region for
    compile mode, the op taking the form's inputs reordered by ``args`` (op argument j is form input args[j])."""
    att = (hotspot.extra or {}).get("attention")
    if not att:
        return {}
    present = [n for n, spec in hotspot.signature.inputs if spec is not None]  # the op's arguments, in order
    roles = [""] * len(att["form"]["inputs"])
    for name, i in zip(present, att["abi_order"]):
        roles[i] = name  # form input i is the op's argument `name`
    causal = att.get("causal_mask")
    window = {"window": att["window"]} if causal is not None and att.get("window") else {}
    if causal is not None:
        roles[causal] = "mask"  # read by the form, computed by the kernel
    return {"region": {"name": att["name"], "kind": "attention", "pattern": hotspot.extra["region"]["pattern"],
                       "key": att["key"], "form": att["form"], "entry": torch_op, "inputs": roles,
                       "args": list(att["abi_order"]), **({"causal_mask": causal} if causal is not None else {}),
                       **window,
                       "output": att["output"]}}


def _region_entry(sig, torch_op: str) -> dict:
    """What compile mode needs to swap a region's subgraph for the package's op ({} for an op kind):
    the canonical form and its JSON text (``Region.key``: the match), the op to call, and its ABI
    (the inputs in form order, one output of the given dtype, shape and strides)."""
    if sig.op != "region":
        return {}
    import json

    form = sig.param("form")
    return {"region": {"name": sig.param("name"), "kind": sig.param("kind"), "pattern": sig.param("pattern"),
                       "key": json.dumps(form, sort_keys=True, separators=(",", ":")), "form": form,
                       "entry": torch_op, "inputs": [n for n, _ in sig.inputs], "output": sig.output.to_json()}}


def _file_sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sha256(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def _errors(ev: Evaluation, kind: str) -> dict | None:
    checks = [c for c in ev.verdict.checks if c.input_kind.startswith(kind)]
    if not checks:
        return None
    return {"max_abs": max(c.max_abs_err for c in checks), "max_rel": max(c.max_rel_err for c in checks),
            "checks": len(checks)}


def _copy_static(stage: Path, name: str, doc: dict) -> None:
    t = templates_dir()
    desc = (f"forge-pack kernels for {doc['model']['name']}: "
            + ", ".join(x["signature"]["pretty"] for x in doc["targets"]))[:300]
    subs = {"PACKAGE_NAME": name, "PACKAGE_VERSION": doc["package"]["version"],
            "PACKAGE_DESCRIPTION": desc.replace('"', "'").replace("\\", "/")}
    for src, dest in (("pyproject.toml", "pyproject.toml"), ("setup.py", "setup.py"), ("MANIFEST.in", "MANIFEST.in"),
                      ("__init__.py", f"{name}/__init__.py"), ("_patch.py", f"{name}/_patch.py"),
                      ("__main__.py", f"{name}/__main__.py"), ("_integrity.py", f"{name}/_integrity.py"),
                      ("_compile.py", f"{name}/_compile.py"), ("_bench.py", f"{name}/_bench.py"),
                      ("_conv_regions.py", f"{name}/_conv_regions.py")):
        text = (t / src).read_text()
        for k, v in subs.items():
            text = text.replace(k, v)
        (stage / dest).write_text(text)


# The package's `verify` runs the build's own definition of "verified": this file, copied verbatim.
RULES_SOURCE = Path(__file__).resolve().parent.parent / "evaluate" / "verdict_rules.py"
RULES_FILE = "_verdict_rules.py"
RULES_HEADER_END = "# ---- end of forge-pack header ----\n"  # templates/package/_verify.py splits on it


def vendor_verify_rules(pkg: Path, version: str) -> dict:
    """Copy forge_pack/evaluate/verdict_rules.py byte for byte (under a generated header) and the verify
    command that runs it into the package; returns the manifest's ``verify_rules`` record."""
    body = RULES_SOURCE.read_bytes()
    digest = hashlib.sha256(body).hexdigest()
    header = (f"# GENERATED by forge-pack {version}: a verbatim copy of forge_pack/evaluate/verdict_rules.py, the rules the\n"
              f"# build's verification ran. Do not edit: `verify` refuses a copy whose text below the header\n"
              f"# does not hash to manifest.json's verify_rules.source_sha256 ({digest}).\n"
              + RULES_HEADER_END)
    (pkg / RULES_FILE).write_bytes(header.encode() + body)
    shutil.copy2(templates_dir() / "_verify.py", pkg / "_verify.py")
    return {"file": RULES_FILE, "source": "forge_pack/evaluate/verdict_rules.py", "source_sha256": digest}


# The package's runtime binds calls, draws inputs and computes references with the build's own
# target registry: these files, copied verbatim into <pkg>/_targets/.
TARGETS_SOURCE = Path(__file__).resolve().parent.parent / "targets"
TARGETS_DIR = "_targets"


def vendor_targets(pkg: Path) -> dict:
    """Copy the registry's runtime modules (``registry.RUNTIME_MODULES``) byte for byte into
    <pkg>/_targets/; returns the manifest's ``targets_runtime`` record (per-file sha256 and their
    digest, which the package's ``verify`` recomputes)."""
    from forge_pack.targets.registry import RUNTIME_MODULES

    integrity = manifest_mod._integrity()
    dest = pkg / TARGETS_DIR
    dest.mkdir(exist_ok=True)
    hashes = {}
    for module in RUNTIME_MODULES:
        body = (TARGETS_SOURCE / f"{module}.py").read_bytes()
        (dest / f"{module}.py").write_bytes(body)
        hashes[f"{module}.py"] = integrity.file_sha256(body)
    return {"dir": TARGETS_DIR, "source": "forge_pack/targets", "files": hashes,
            "source_sha256": integrity.files_digest(hashes)}


# Compile mode finds a region with the code that named it: these files of forge_pack/graph (torch
# only, relative imports), copied verbatim into <pkg>/_graph/.
GRAPH_SOURCE = Path(__file__).resolve().parent.parent / "graph"
GRAPH_DIR = "_graph"
GRAPH_RUNTIME_MODULES = ("__init__", "opclass", "canonical", "region_match", "conv_fold")


def vendor_graph(pkg: Path) -> dict:
    """Copy GRAPH_RUNTIME_MODULES byte for byte into <pkg>/_graph/; the manifest's ``graph_runtime``
    record (per-file sha256 and their digest; compile mode leaves regions to Inductor on a mismatch)."""
    integrity = manifest_mod._integrity()
    dest = pkg / GRAPH_DIR
    dest.mkdir(exist_ok=True)
    hashes = {}
    for module in GRAPH_RUNTIME_MODULES:
        body = (GRAPH_SOURCE / f"{module}.py").read_bytes()
        (dest / f"{module}.py").write_bytes(body)
        hashes[f"{module}.py"] = integrity.file_sha256(body)
    return {"dir": GRAPH_DIR, "source": "forge_pack/graph", "files": hashes,
            "source_sha256": integrity.files_digest(hashes)}


def vendored_rules_body(text: bytes) -> bytes:
    """The copied source inside a package's _verdict_rules.py (the generated header removed)."""
    i = text.find(RULES_HEADER_END.encode())
    return text[i + len(RULES_HEADER_END):] if i >= 0 else text


# ------------------------------------------------------------------ the whole flow


def pack(run_dir: str | Path, out_dir: str | Path, name: str | None = None, force: bool = False, wheel: bool = False,
         *, confirm: bool = True, model_check: bool = True, require_gain: bool = False, cpu_isa: str | None = None,
         say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
         compile_modes: tuple[str, ...] | None = None) -> PackResult:
    """Confirm the run's winners, then write the package to `out_dir` (and a wheel into out_dir/dist).
    require_gain: write nothing unless the whole-model check measured a gain (model_gain.judge_gain).
    compile_modes: the torch.compile modes the compile gate measures ("default" among them; None: the default mode
    and compile_gate.EXTRA_MODES for the device)."""
    from forge_pack.evaluate import confirm as confirm_mod
    from forge_pack.pack import readme

    info = read_run(run_dir)
    name = check_name(name or default_name(info.model_path))
    cpu_isa = check_cpu_isa(cpu_isa)
    out = Path(out_dir).resolve()
    check_out_dir(out, force, info.run_dir)
    winners, dropped = collect(info.run_dir)
    if cpu_isa != "native" and info.device != "cuda":
        kept = []
        for w in winners:
            macros = isa_macros(w.candidate.source)
            if macros:
                dropped.append({"hotspot_id": w.hotspot.id, "op": w.hotspot.op, "pretty": w.hotspot.signature.pretty(),
                                "reason": f"its source tests {', '.join(macros)}: verified as compiled with "
                                          f"-march=native, which a --cpu-isa {cpu_isa} build would not reproduce "
                                          "(--cpu-isa native ships it, for this CPU only)"})
            else:
                kept.append(w)
        winners = kept
    model_path = Path(info.model_path)
    check = model_check and confirm
    # the whole-model check gates the package: it must be able to run, and that is known before
    # minutes of confirmation
    if check and winners and not model_path.is_file():
        raise ForgeError(f"the whole-model check cannot run: the model file {model_path} is not there any more, "
                         "and no package is written unchecked",
                         f"put the model file back at {model_path}, or pass --no-confirm to package the search's "
                         "own measurements with neither confirmation nor whole-model check")
    if check and winners and info.model_hash and _file_sha256(model_path) != info.model_hash:
        raise ForgeError(f"the whole-model check cannot run: {model_path} changed since the run was profiled, "
                         "so the kernels would be checked against another model",
                         "restore the model file the run profiled, or search again; --no-confirm packages the "
                         "search's own measurements with neither confirmation nor whole-model check")
    confirmations: dict = {}
    if confirm and winners and info.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ForgeError("this run's kernels are CUDA kernels: confirming them needs a CUDA GPU, and none is "
                             "visible",
                             "run `forge-pack pack` on the GPU machine, or pass --no-confirm to package the search's "
                             "own measurements unconfirmed")
    if confirm and winners:
        say(f"confirming {len(winners)} winning kernel{'s' if len(winners) != 1 else ''} on unseen inputs, "
            f"in a fresh process")
        with step("confirming", say) as progress:
            confirmations = confirm_mod.confirm_kernels(info, winners, say=progress.say)
        kept = []
        for w in winners:
            c = confirmations.get(w.hotspot.id)
            if c is not None and not c.kept:
                dropped.append({"hotspot_id": w.hotspot.id, "op": w.hotspot.op, "pretty": w.hotspot.signature.pretty(),
                                "reason": f"dropped at confirmation: {c.reason}"})
                say(f"  dropped {w.hotspot.signature.pretty()}: {c.reason}")
            else:
                kept.append(w)
        winners = kept
    if not winners:
        why = "; ".join(f"{d['pretty']}: {d['reason']}" for d in dropped) or "no hotspot was searched"
        return PackResult(False, f"No faster kernel to pack, so no package was written ({why}).", dropped=dropped)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.parent / f".{out.name}.staging-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    result = PackResult(True, "", str(out), name, dropped=dropped, notes=rerun_notes(winners))
    try:
        def stage_for(kept: list[Winner]) -> dict:
            shutil.rmtree(stage, ignore_errors=True)
            return stage_package(stage, name, info, kept, confirmations, dropped, cpu_isa)

        if check:
            from forge_pack.evaluate.model_gate import run_gate

            say("checking the whole model: patched vs original, end-to-end latency (building the package first)")
            with step("whole-model check", say) as progress:
                gate = run_gate(winners, stage_for, lambda only: confirm_mod.check_model(stage, name, info, only=only),
                                say=progress.say)
            dropped.extend(gate.dropped)
            if gate.doc is None:
                why = "; ".join(f"{d['pretty']}: {d['reason']}" for d in dropped)
                return PackResult(False, f"No kernel passed the whole-model check, so no package was written ({why}).",
                                  dropped=dropped)
            doc, winners = gate.doc, gate.winners
            doc["dropped"], doc["model_result"] = dropped, gate.model_result
            from forge_pack.evaluate.compile_gate import run_compile_gate

            with step("compile-mode check", say) as progress:
                result.compile_result = run_compile_gate(stage, info, doc, say=progress.say, modes=compile_modes)
            if require_gain:
                from forge_pack.evaluate.model_gain import judge_gain, judge_compile_gain

                # A package is worth installing when either of its modes makes the model faster: regions
                # run only compiled, and a kernel can lose in eager's dispatch yet win inside Inductor's graph.
                verdict, compiled = judge_gain(gate.model_result), judge_compile_gain(result.compile_result)
                if not verdict.gain and not compiled.gain:
                    return PackResult(False, f"no whole-model gain: no package written (eager: {verdict.reason}; "
                                             f"compiled: {compiled.reason}).",
                                      dropped=dropped, model_result=gate.model_result,
                                      compile_result=result.compile_result)
        else:
            doc = stage_for(winners)
        manifest_mod.write(stage / name / "manifest.json", doc)
        (stage / "README.md").write_text(readme.render(doc))
        if out.exists():
            check_out_dir(out, force, info.run_dir)  # again, right before it goes: it may have changed since
            shutil.rmtree(out)
        os.replace(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    result.targets, result.model_result = doc["targets"], doc["model_result"]
    if wheel:
        result.wheel = build_wheel(out, say)
    n = len(doc["targets"])
    result.message = f"Wrote {out} ({name}: {n} kernel{'s' if n != 1 else ''})."
    return result


def build_wheel(package_dir: Path, say: Callable[[str], None]) -> str:
    dist = package_dir / "dist"
    say(f"building a wheel into {dist}")
    with step("pip wheel", say):
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
                            "-w", str(dist), str(package_dir)], capture_output=True, text=True)
    wheels = sorted(dist.glob("*.whl"))
    if r.returncode != 0 or not wheels:
        raise ForgeError(f"building the wheel failed:\n{(r.stdout + r.stderr)[-3000:]}",
                         f"the package itself is complete in {package_dir}; try `pip wheel --no-build-isolation .` "
                         "there to see the full log")
    return str(wheels[-1])
