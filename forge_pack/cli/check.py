"""`forge-pack check KERNEL`: verify and time a hand-written kernel exactly as the search would.

    forge-pack check my_softmax.cu --op softmax --signature "x: bf16[1,8,2048,2048], dim=-1, dtype=float32"
    forge-pack check my_norm.cpp --spec my_norm.json --run-dir runs/vae --hotspot 1

Prints the verdict (with the first mismatching element, the compiler log or the crash), the
errors against a float64 reference per input set, and timings against eager PyTorch and
torch.compile. Exit status 0 when the kernel passes, 1 when it is rejected or the input is wrong.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Optional

import typer

from forge_pack.core.errors import ForgeError
from forge_pack.core.hotspot import Hotspot

EXTENSIONS = {".cu": "cuda", ".cuh": "cuda", ".cpp": "cpu", ".cc": "cpu", ".cxx": "cpu", ".c": "cpu"}


def backend_for(kernel: Path, device: str | None) -> str:
    by_ext = EXTENSIONS.get(kernel.suffix.lower())
    if device is not None:
        if device not in ("cuda", "cpu"):
            raise ForgeError(f"unknown device {device!r}", "use --device cuda or --device cpu")
        if by_ext is not None and by_ext != device:
            raise ForgeError(f"{kernel.name} looks like a {by_ext} kernel but --device is {device}",
                             "CUDA kernels are .cu files, CPU kernels .cpp files")
        return device
    if by_ext is None:
        raise ForgeError(f"cannot tell the backend of {kernel.name}", "name it .cu or .cpp, or pass --device")
    return by_ext


def hotspot_from_run(run_dir: Path, ref: str) -> Hotspot:
    from forge_pack.store.run_queries import hotspots
    from forge_pack.store.run_store import STORE_FILE, check_store, open_readonly

    if not (run_dir / STORE_FILE).is_file():
        raise ForgeError(f"{run_dir} is not a run directory (no run.db)", "pass the folder `forge-pack build` wrote")
    check_store(run_dir)
    conn = open_readonly(run_dir)
    try:
        rows = hotspots(conn)
    finally:
        conn.close()
    for row in rows:
        if ref == row["id"]:
            return Hotspot.from_json(json.loads(row["hotspot_json"]))
    if ref.isdigit() and 1 <= int(ref) <= len(rows):  # 1 = the largest hotspot
        return Hotspot.from_json(json.loads(rows[int(ref) - 1]["hotspot_json"]))
    known = ", ".join(f"{i}={r['id']}" for i, r in enumerate(rows, 1)) or "none"
    raise ForgeError(f"no hotspot {ref!r} in {run_dir}", f"hotspots (rank=id): {known}")


def format_report(cand, hotspot, sig, ev, base) -> str:
    v = ev.verdict
    names = ", ".join(k.name for k in cand.spec.kernels)
    lines = [f"kernel    {names} ({cand.backend})", f"target    {sig.pretty()}"]
    status = "PASS" if v.ok else f"REJECTED: {v.reason}"
    lines.append(f"verdict   {status}")
    if v.detail:
        for i, line in enumerate(v.detail.strip().splitlines()[:40]):
            lines.append(("detail    " if i == 0 else "          ") + line)
    if v.max_abs_err is not None:
        lines.append(f"errors    max abs {v.max_abs_err:.3g}, max rel {v.max_rel_err:.3g} (vs float64)")
    for c in v.checks:
        mark = "ok " if c.passed else "BAD"
        lines.append(f"  {mark} {c.input_kind:<26} abs {c.max_abs_err:9.3g}  rel {c.max_rel_err:9.3g}  "
                     f"(atol {c.atol:.2g}, rtol {c.rtol:.2g})" + (f"  {c.first_mismatch}" if c.first_mismatch else ""))
    res = ev.extra.get("resources") or {}
    compile_line = f"compile   {ev.compile_s:.2f} s" + (" (cached)" if ev.extra.get("cached_build") else "")
    for name, r in res.items():
        compile_line += (f"; {name}: {r.get('registers', 0)} registers, {r.get('spill_stores', 0)} B spilled, "
                         f"{r.get('smem_bytes', 0)} B static smem")
    lines.append(compile_line)
    if ev.compile_cmd:
        lines.append(f"          {ev.compile_cmd}")
    if base is not None:
        def t(x):
            return f"{x.median_us:10.2f} ± {x.iqr_us / 2:.2f}" if x is not None else f"{'-':>10}"

        lines.append(f"time µs   {'median ± IQR/2':>17}   n")
        if ev.timing is not None:
            lines.append(f"  kernel        {t(ev.timing)}   {ev.timing.n}")
        lines.append(f"  eager         {t(base.eager)}   {base.eager.n}")
        if base.compiled is not None:
            lines.append(f"  torch.compile {t(base.compiled)}   {base.compiled.n}")
        elif base.compile_error:
            lines.append(f"  torch.compile failed: {base.compile_error.splitlines()[0][:200]}")
        lines.append(f"  floor         {base.floor_us:10.2f}        (bytes moved / {base.copy_bandwidth_gbs:.0f} GB/s copy)")
    if ev.timing is not None:
        parts = []
        if ev.speedup_vs_eager:
            parts.append(f"{ev.speedup_vs_eager:.2f}x vs eager")
        if ev.speedup_vs_compile:
            parts.append(f"{ev.speedup_vs_compile:.2f}x vs torch.compile")
        if ev.bandwidth_fraction:
            parts.append(f"{ev.bandwidth_fraction * 100:.0f}% of copy bandwidth")
        if parts:
            lines.append("speedup   " + ", ".join(parts))
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    @app.command("check")
    def check_cmd(
        kernel: Path = typer.Argument(..., help="Kernel source (.cu for cuda, .cpp for cpu), spec embedded or --spec."),
        op: Optional[str] = typer.Option(None, "--op", help="Target op, e.g. softmax, group_norm."),
        signature: Optional[str] = typer.Option(None, "--signature", help="e.g. \"x: bf16[1,8,2048,2048], dim=-1, "
                                                                           "dtype=float32\""),
        spec: Optional[Path] = typer.Option(None, "--spec", help="Launch spec JSON (else embedded in the source "
                                                                 "between /* forge-pack-spec and */)."),
        device: Optional[str] = typer.Option(None, "--device", help="cuda or cpu (default: from the file extension)."),
        dtype: Optional[str] = typer.Option(None, "--dtype", help="Override every tensor dtype of the signature."),
        run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Check against a hotspot of this run "
                                                                       "(its captured real tensors)."),
        hotspot: Optional[str] = typer.Option(None, "--hotspot", help="Hotspot id or rank (1 = largest) in --run-dir."),
        timeout: float = typer.Option(60.0, "--timeout", help="Seconds per candidate before it counts as hung."),
        reps: int = typer.Option(50, "--reps", min=1, help="Timed calls (CUDA uses at least 30)."),
        no_compile: bool = typer.Option(False, "--no-compile-baseline", help="Skip timing torch.compile."),
        final: bool = typer.Option(False, "--final", help="Use the final-check input seeds."),
        seed: int = typer.Option(0, "--seed", help="Seed of the random inputs."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Verify and time your own kernel against eager PyTorch and torch.compile."""
        from forge_pack.core.candidate import load_candidate_files
        from forge_pack.evaluate.evaluator import Evaluator
        from forge_pack.evaluate.timing import TimingConfig

        from forge_pack.cli.search import check_seconds

        check_seconds("--timeout", timeout, "60")
        backend = backend_for(kernel, device)
        if run_dir is not None:
            if signature:
                raise ForgeError("pass either --signature or --run-dir/--hotspot, not both", "")
            h = hotspot_from_run(run_dir, hotspot or "1")
            op = op or h.op
            if op != h.op:
                raise ForgeError(f"--op {op} but hotspot {h.id} is {h.op}", "drop --op")
        else:
            if not signature:
                raise ForgeError("no target: pass --signature (with --op) or --run-dir and --hotspot",
                                 'e.g. --op softmax --signature "x: f32[4096,1024], dim=-1"')
            from forge_pack.targets.sigparse import parse_signature

            sig = parse_signature(op, signature, dtype)
            op = sig.op
            from forge_pack.targets import abi

            why = abi.supports(sig)
            if why:  # say so now, not after timing eager and torch.compile
                raise ForgeError(f"forge-pack kernels cannot target {sig.pretty()}: {why}",
                                 "check a signature with a supported dtype, layout and a non-empty shape")
            h = Hotspot(sig, ("check",), 1.0, 0.0, 0.0, 0.0, (), backend)
        cand = load_candidate_files(str(kernel), str(spec) if spec else None, op, backend)
        if backend == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ForgeError("no CUDA GPU is visible to torch", "check a .cpp kernel with --device cpu instead")
        cfg = TimingConfig(reps=reps, compile_baseline=not no_compile)
        with tempfile.TemporaryDirectory(prefix="forge-check-") as logs:
            with Evaluator(backend, workers=1, timeout_s=timeout, seed=seed, timing=cfg,
                           run_dir=str(run_dir) if run_dir else None, log_dir=logs) as ev:
                sig = ev.signature(h)
                base = None
                try:
                    base = ev.baseline(h)
                except RuntimeError as e:
                    typer.echo(f"warning: eager baseline failed: {e}", err=True)
                result = ev.evaluate(cand, h, base, final=final, bounds=True)  # guard pages too
        if as_json:
            typer.echo(json.dumps({"kernel": str(kernel), "signature": sig.to_json(), "ok": result.verdict.ok,
                                   "evaluation": result.to_json(), "baseline": base.to_json() if base else None}))
        else:
            typer.echo(format_report(cand, h, sig, result, base))
        if not result.verdict.ok:
            raise typer.Exit(1)
