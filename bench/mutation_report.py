"""bench/results/mutation.md and .json from mutmut's results; the CI comparison against them.

    python bench/mutation_report.py --configure PYPROJECT SOURCE.py... TEST...   (used by mutation.sh)
    python bench/mutation_report.py --write M... [--work W]   merge fresh results of modules M into the results
                                                     (from build/mutation/W: e.g. _check, the --check run)
    python bench/mutation_report.py --check M...     exit 1 if a fresh score of M is below the committed one
    python bench/mutation_report.py --names M...     mutmut name globs of the mutants to run: each module's SCOPE, else all of it
                                                     (MUTATION_SAMPLE=DIGITS: only mutants whose number ends in one of them)
    python bench/mutation_report.py --file M         the files module M mutates (FILES), space-separated

A module's score excludes the mutants listed as equivalent in bench/mutation/equivalent.tsv (a
mutant name, a tab, the one-line reason); timeouts count as killed (the suite did not pass with
the mutant in place), "no tests" and "not checked" count as survived.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
EQUIVALENT = ROOT / "bench" / "mutation" / "equivalent.tsv"
ORDER = ["verdict", "tolerance", "static_check", "verdict_rules", "object_check", "model_gate", "verify", "evaluate", "timing",
         "package_verify", "attention", "region"]
# module key -> the files it mutates (mutmut names a mutant by its file's dotted path). Most are
# one file of a stage subpackage; "evaluate" is the parent side (evaluator.py) and the worker's
# judge (judge.py); "verdict_rules" is the generic rules plus the per-kind facts they are given
# (forge_pack/targets/<kind>.py, the TargetSpecs); package_verify is the shipped
# `python -m <package> verify` (templates/package/_verify.py).
_KINDS = ["avg_pool", "batch_norm", "group_norm", "layer_norm", "norm_common", "rms_norm", "softmax"]
FILES = {
    "verdict": ["forge_pack/core/verdict.py"],
    "tolerance": ["forge_pack/evaluate/tolerance.py"],
    "static_check": ["forge_pack/evaluate/static_check.py"],
    "verdict_rules": ["forge_pack/evaluate/verdict_rules.py"] + [f"forge_pack/targets/{k}.py" for k in _KINDS],
    "object_check": ["forge_pack/evaluate/object_check.py", "forge_pack/evaluate/x86_listing.py"],
    "model_gate": ["forge_pack/evaluate/model_gate.py"],
    "verify": ["forge_pack/evaluate/verify.py"],
    "evaluate": ["forge_pack/evaluate/evaluator.py", "forge_pack/evaluate/judge.py"],
    "timing": ["forge_pack/evaluate/timing.py"],
    "package_verify": ["templates/package/_verify.py"],
    # the attention target's facts (binders, what it supports, its float64 reference and eager forms), apart from
    # verdict_rules: its tests run searches and kernel compiles, too slow for every mutant of the generic rules
    "attention": ["forge_pack/targets/attention.py"],
    # a region's target: its signature, roles and main input, the float64 reference (its graph run in float64) and
    # eager forms, its verification inputs, and the rounding sensitivity its tolerance is built from
    "region": ["forge_pack/targets/region_target.py", "forge_pack/targets/region_sensitivity.py"],
}


def sources(module: str) -> list[str]:
    return FILES[module]


def source(module: str) -> str:
    """The module's label in the results: its file, or its files joined with " + "."""
    return " + ".join(FILES[module])


def mutmut_module(path: str) -> str:
    """The dotted name mutmut gives a file's mutants (its path)."""
    return path[:-len(".py")].replace("/", ".")


# Modules measured on part of their functions only (mutmut name globs; every other mutant of the file
# is neither run nor counted). timing.py: the CPU protocol and everything that decides the
# plausibility gate's inputs and the figures, and the CUDA protocol (_time_cuda, its queue lead and the
# rerun of a batch the host outlasted: lead_us, queue_lead, spun_us, outlasted), which
# tests/test_timing_protocol.py runs on a simulated stream (tests/sim_gpu.py); gpu_cycles_per_us and
# _cuda_l2_bytes ask the real device and are left out (docs/testing.md).
SCOPE = {
    "timing": [f"forge_pack.evaluate.timing.{f}__mutmut_*" for f in (
        "x_summarize", "x__cpu_llc_bytes", "x__cpu_llc_domains", "x_cache_bytes", "x_flush_bytes", "x_cold_cache",
        "xǁFlusherǁ__init__", "xǁFlusherǁ__call__", "x_time_calls", "x__nothing", "x__never", "x__batches",
        "x__time_cpu", "x_copy_bandwidth_gbs", "x_rotation_count", "xǁTimingConfigǁto_json",
        "xǁTimingConfigǁfrom_json", "x_lead_us", "x_queue_lead", "x_spun_us", "x_outlasted", "x__time_cuda")],
}

# mutmut 3 exit codes (mutmut.stats.status_by_exit_code), folded into what the score needs
KILLED = {1: "killed", 3: "killed", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", 36: "timeout",
          -11: "segfault", -9: "segfault", 35: "suspicious"}
NOT_KILLED = {0: "survived", None: "not checked", 5: "no tests", 33: "no tests", 34: "skipped"}


def configure(pyproject: Path, modules: list[str], tests: list[str]) -> None:
    """Point the copy's [tool.mutmut] table at the modules and their tests."""
    text = pyproject.read_text()
    head, sep, rest = text.partition("[tool.mutmut]")
    if not sep:
        sys.exit(f"{pyproject} has no [tool.mutmut] table")
    tail = re.search(r"^\[", rest, flags=re.M)
    after = rest[tail.start():] if tail else ""
    table = "\n".join([
        "[tool.mutmut]",
        # forge_pack always: the tests import it from the copy, never from an installed checkout
        f"source_paths = {json.dumps(sorted({'forge_pack'} | {m.split('/')[0] for m in modules}))}",
        f"only_mutate = {json.dumps(modules)}",
        'also_copy = ["templates", "bench"]',
        'pytest_add_cli_args = ["-p", "no:randomly", "-p", "no:cacheprovider", "-p", "forge_mutmut_hits"]',
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        "",
    ])
    pyproject.write_text(head + table + ("\n" + after if after else ""))


def equivalents() -> dict[str, str]:
    out = {}
    if EQUIVALENT.exists():
        for line in EQUIVALENT.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, _, reason = line.partition("\t")
                out[name.strip()] = reason.strip()
    return out


def fresh(module: str, work: str = "") -> dict | None:
    """One module's counts from the run in build/mutation/WORK (default: the module's own run)."""
    work_dir = ROOT / "build" / "mutation" / (work or module)
    codes = _codes(work_dir, module)
    if codes is None:
        return None
    if module in SCOPE:
        codes = {k: v for k, v in codes.items() if in_scope(module, k)}
    eq = equivalents()
    entry = {"mutants": 0, "killed": 0, "timeouts": 0, "survivors": [], "equivalent": []}
    for name, code in sorted(codes.items(), key=lambda kv: _natural(kv[0])):
        if name in eq:
            entry["equivalent"].append(name)
            continue
        entry["mutants"] += 1
        if code in KILLED:
            entry["killed"] += 1
            entry["timeouts"] += KILLED[code] == "timeout"
        else:
            entry["survivors"].append(f"{name} ({NOT_KILLED.get(code, f'exit {code}')})")
    if len(sources(module)) > 1:  # per file: where in a several-file module the survivors are
        entry["by_file"] = {}
        for path in sources(module):
            prefix = mutmut_module(path) + "."
            mine = [n for n in codes if n.startswith(prefix) and n not in eq]
            entry["by_file"][path] = [len(mine), sum(codes[n] in KILLED for n in mine)]
    entry["tests"] = _selection(work_dir)
    entry["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    return entry


def _codes(work_dir: Path, module: str) -> dict | None:
    """mutmut's exit code per mutant of every file of the module; None if a file has no results."""
    codes = {}
    for path in sources(module):
        meta = work_dir / "mutants" / f"{path}.meta"
        if not meta.exists():
            return None
        codes.update(json.loads(meta.read_text())["exit_code_by_key"])
    return codes


def in_scope(module: str, name: str) -> bool:
    import fnmatch

    return module not in SCOPE or any(fnmatch.fnmatch(name, g) for g in SCOPE[module])


def _selection(work_dir: Path) -> list[str]:
    import tomllib

    cfg = tomllib.loads((work_dir / "pyproject.toml").read_text())
    return cfg["tool"]["mutmut"]["pytest_add_cli_args_test_selection"]


def _natural(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def pct(k: int, m: int) -> str:
    return f"{100.0 * k / m:.1f}%" if m else "n/a"


def line(label: str, m: int, k: int) -> str:
    return f"{label}: {m} mutants, {k} killed ({pct(k, m)})"


def label(module: str, entry: dict) -> str:
    """A result's file(s): the entry's own where it was measured on an earlier layout."""
    return entry.get("file", source(module))


def write(modules: list[str], work: str = "") -> None:
    path = RESULTS / "mutation.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    for m in modules:
        entry = fresh(m, work)
        if entry is not None:
            data[m] = entry  # a fresh run replaces an earlier layout's result (and its "file"/"measured_on")
    data = {m: data[m] for m in sorted(data, key=lambda m: ORDER.index(m) if m in ORDER else len(ORDER))}
    path.write_text(json.dumps(data, indent=1) + "\n")
    eq = equivalents()
    # results measured on an earlier layout of the code are shown apart: they do not describe it now
    now = {m: e for m, e in data.items() if "measured_on" not in e}
    old = {m: e for m, e in data.items() if "measured_on" in e}
    lines = [line(label(m, e), e["mutants"], e["killed"]) for m, e in now.items()]
    total_m = sum(e["mutants"] for e in now.values())
    total_k = sum(e["killed"] for e in now.values())
    md = [
        "# Mutation testing of the trust core",
        "",
        "Written by `bench/mutation_report.py` from mutmut's results; command: `make mutation` "
        "(`bash bench/mutation.sh [MODULE ...]`, docs/testing.md). Equivalent mutants are left out of the "
        "counts; a timeout counts as killed.",
        "",
        "```",
        *lines,
        line("total", total_m, total_k),
        "```",
        "",
    ]
    parts = [f"{path}: {m_} mutants, {k_} killed ({pct(k_, m_)})"
             for e in now.values() for path, (m_, k_) in e.get("by_file", {}).items()]
    if parts:
        md += ["By file, for the modules of several files:", "", "```", *parts, "```", ""]
    if old:
        md += ["Not yet re-run on the current code (measured on an earlier layout of it; the scores describe "
               "that code, not this):", "", "```"]
        md += [f"{line(label(m, e), e['mutants'], e['killed'])} [{e['measured_on']}]" for m, e in old.items()]
        md += ["```", ""]
    md += [
        "Scoped: " + "; ".join(f"{source(m)} counts only {', '.join(g.split('.')[-1].replace('__mutmut_*', '') for g in gs)}"
                               for m, gs in SCOPE.items() if m in data) + " (docs/testing.md says why).",
        "",
        "| module | tests run against it | mutants | killed | of which timeouts | survived | equivalent | run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m, e in data.items():
        when = e["date"] + (f" ({e['measured_on']})" if "measured_on" in e else "")
        md.append(f"| {label(m, e)} | {', '.join(e['tests'])} | {e['mutants']} | {e['killed']} | {e['timeouts']} "
                  f"| {len(e['survivors'])} | {len(e['equivalent'])} | {when} |")
    md += ["", "## Survivors", ""]
    for m, e in data.items():
        if e["survivors"]:
            md.append(f"- {label(m, e)}: " + ", ".join(s.split(".")[-1] for s in e["survivors"]))
    md += ["", "## Equivalent mutants (bench/mutation/equivalent.tsv)", ""]
    for m, e in data.items():
        for name in e["equivalent"]:
            md.append(f"- `{name}`: {eq.get(name, '')}")
    (RESULTS / "mutation.md").write_text("\n".join(md) + "\n")
    print("\n".join(lines + [line("total", total_m, total_k)]))


def check(modules: list[str]) -> int:
    base = json.loads((RESULTS / "mutation.json").read_text())
    bad = 0
    for m in modules:
        e = fresh(m, "_check")
        if e is None:
            print(f"{m}: no fresh results under build/mutation/_check")
            bad += 1
            continue
        b = base.get(m)
        now, then = e["killed"] / max(e["mutants"], 1), (b["killed"] / max(b["mutants"], 1)) if b else 0.0
        ok = now >= then - 1e-9
        print(f"{line(source(m), e['mutants'], e['killed'])}; committed {pct(b['killed'], b['mutants']) if b else 'none'}"
              f" -> {'ok' if ok else 'DROPPED'}")
        if not ok:
            print("   survivors now: " + ", ".join(s for s in e["survivors"] if s not in (b or {}).get("survivors", [])))
            bad += 1
    return 1 if bad else 0


def sample_digits() -> str:
    """MUTATION_SAMPLE: the last digits of the mutant numbers a sampled check runs ("" = every mutant)."""
    digits = os.environ.get("MUTATION_SAMPLE", "").strip()
    if digits and not re.fullmatch(r"[0-9]+", digits):
        raise SystemExit(f"MUTATION_SAMPLE must be decimal digits (the last digits of the mutant numbers to run), "
                         f"not {digits!r}")
    return digits


def names(modules: list[str], digits: str = "") -> list[str]:
    """mutmut globs of the mutants to run; with `digits`, only those whose number ends in one of them."""
    out = []
    for g in (g for m in modules for g in SCOPE.get(m, [mutmut_module(f) + ".*" for f in sources(m)])):
        if digits:
            stem = g.rstrip("*")
            g = f"{stem}*[{digits}]" if stem.endswith("__mutmut_") else f"{stem}*__mutmut_*[{digits}]"
        out.append(g)
    return out


def check_sample(modules: list[str], digits: str) -> int:
    """The sampled check (CI): every sampled mutant must be killed, equivalent, or a survivor the committed
    results already list; a new survivor is a guard some test no longer holds."""
    base = json.loads((RESULTS / "mutation.json").read_text())
    eq = equivalents()
    bad = 0
    for m in modules:
        codes = _codes(ROOT / "build" / "mutation" / "_check", m)
        if codes is None:
            print(f"{m}: no fresh results under build/mutation/_check")
            bad += 1
            continue
        ran = {k: v for k, v in codes.items() if v is not None and k not in eq and in_scope(m, k)}
        known = {s.split(" (")[0] for s in (base.get(m) or {}).get("survivors", [])}
        killed = sum(v in KILLED for v in ran.values())
        new = sorted((k for k, v in ran.items() if v not in KILLED and k not in known), key=_natural)
        print(f"{source(m)}: {len(ran)} sampled mutants (numbers ending in {', '.join(digits)}), {killed} killed, "
              f"{len(ran) - killed - len(new)} listed survivors -> {'DROPPED' if new else 'ok'}")
        if new:
            print("   survivors not in the committed results: " + ", ".join(
                f"{k} ({NOT_KILLED.get(ran[k], f'exit {ran[k]}')})" for k in new))
            bad += 1
    return 1 if bad else 0


def partial(modules: list[str]) -> None:
    """The mutants a MUTANTS-restricted run checked, per module (unchecked ones left out)."""
    for m in modules:
        codes = {k: v for k, v in (_codes(ROOT / "build" / "mutation" / m, m) or {}).items() if v is not None}
        killed = [k for k, v in codes.items() if v in KILLED]
        print(f"{m} (partial): {len(codes)} checked, {len(killed)} killed")
        for k, v in sorted(codes.items(), key=lambda kv: _natural(kv[0])):
            if v not in KILLED:
                print(f"   {k}: {NOT_KILLED.get(v, f'exit {v}')}")


def _is_source(item: str) -> bool:
    return item.endswith(".py") and not item.startswith(("tests/", "-"))


def main() -> int:
    if sys.argv[1:2] == ["--file"]:
        print(" ".join(sources(sys.argv[2])))
        return 0
    if sys.argv[1:2] == ["--names"]:
        print(" ".join(names(sys.argv[2:], sample_digits())))
        return 0
    if sys.argv[1:2] == ["--configure"]:  # by hand: test arguments may be pytest options (--deselect=...)
        items = sys.argv[3:]
        configure(Path(sys.argv[2]), [i for i in items if _is_source(i)],
                  [i for i in items if not _is_source(i)])
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--configure", nargs="+", metavar="ARG")
    ap.add_argument("--write", nargs="+", metavar="MODULE")
    ap.add_argument("--check", nargs="+", metavar="MODULE")
    ap.add_argument("--partial", nargs="+", metavar="MODULE")
    ap.add_argument("--work", default="", help="with --write: read the results of build/mutation/WORK "
                    "(e.g. _check, the CI run over all its modules) instead of each module's own run")
    a = ap.parse_args()
    if a.configure:
        items = a.configure[1:]
        configure(Path(a.configure[0]), [i for i in items if _is_source(i)],
                  [i for i in items if not _is_source(i)])
        return 0
    if a.write:
        write(a.write, a.work)
        return 0
    if a.check:
        digits = sample_digits()
        return check_sample(a.check, digits) if digits else check(a.check)
    if a.partial:
        partial(a.partial)
        return 0
    ap.error("one of --configure, --write, --check")
    return 2


if __name__ == "__main__":
    sys.exit(main())
