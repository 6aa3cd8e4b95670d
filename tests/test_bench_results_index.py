"""bench/results/ holds one result per benchmark under a plain name, each listed in its README, and
every path into it that the repository's docs, scripts and code name exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
# written on a GPU machine by `make test-gpu` (bench/test_gpu.sh); named before it is recorded
WRITTEN_BY_MAKE_TEST_GPU = {"test-gpu.md", "test-gpu.log"}
# a run or call number in a file name: kernel_sweep_s6_call4.md, ncu_probe_call2.json, pytest_x_s5.log
RUN_NUMBERED = re.compile(r"_(s\d+|call\d+)(_|\.|$)")


def _result_files() -> list[str]:
    return sorted(p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md")


def _listed_in_readme() -> set[str]:
    """The file names the README's table names: `a.md`, `a.{md,json}`, `a.md/.json`."""
    readme = (RESULTS / "README.md").read_text()
    names = set()
    for stem, exts in re.findall(r"`([\w.-]+?)\.(\{[\w,]+\}|md|json|log)`", readme):
        for ext in exts.strip("{}").split(","):
            names.add(f"{stem}.{ext}")
    return names


def test_no_result_file_is_named_by_run_number():
    assert [n for n in _result_files() if RUN_NUMBERED.search(n)] == []


def test_no_pytest_log_is_kept_as_a_result():
    assert [n for n in _result_files() if n.startswith("pytest_")] == []


def test_every_result_file_is_listed_in_the_results_readme():
    assert sorted(set(_result_files()) - _listed_in_readme()) == []


def test_every_file_the_results_readme_lists_exists():
    missing = _listed_in_readme() - set(_result_files()) - WRITTEN_BY_MAKE_TEST_GPU
    assert sorted(missing) == []


def test_every_bench_results_path_named_in_the_repository_exists():
    sources = [ROOT / "README.md", ROOT / "Makefile", *(ROOT / "docs").glob("*.md"),
               *(ROOT / "bench").glob("*.py"), *(ROOT / "bench").glob("*.sh"), *(ROOT / "bench").glob("*.md"),
               *(ROOT / "forge_pack").rglob("*.py"), *(ROOT / "templates").rglob("*.md"),
               *(ROOT / "tests").glob("*.py")]
    broken = []
    for src in sources:
        if src == Path(__file__):
            continue
        for name in re.findall(r"bench/results/([\w-]+\.(?:md|json|log))", src.read_text()):
            if name not in WRITTEN_BY_MAKE_TEST_GPU and not (RESULTS / name).is_file():
                broken.append(f"{src.relative_to(ROOT)}: bench/results/{name}")
    assert broken == []


def test_no_doc_points_outside_the_repository():
    docs = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "bench" / "README.md",
            RESULTS / "README.md", *(ROOT / "bench").glob("*.py")]
    outside = [f"{d.relative_to(ROOT)}: {m}" for d in docs for m in re.findall(r"\.\./shared/\S+", d.read_text())]
    assert outside == []
