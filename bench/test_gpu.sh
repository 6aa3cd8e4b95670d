#!/usr/bin/env bash
# The GPU suite (`make test-gpu`): every `gpu` test, the CUDA anti-cheat fixtures of
# tests/test_verify_gpu.py first, and a skipped gpu test counts as a failure (FORGE_PACK_REQUIRE_GPU=1,
# see tests/conftest.py). Writes the log and $RESULTS/test-gpu.md (pytest's summary line, the counts
# as "N passed, N failed, N skipped", torch, CUDA and the GPU); exits with pytest's status.
#   bash bench/test_gpu.sh                          (the image's python3; on a dev box: PYTHON=.venv/bin/python)
#   RESULTS=/tmp/out bash bench/test_gpu.sh         (results to another directory)
#   PYTEST_ARGS="-x" bash bench/test_gpu.sh         (extra pytest arguments)
#   PART=pack TESTS=tests/test_pack_cuda.py bash bench/test_gpu.sh
#                         (one part of the suite, for machines whose calls are time-limited: writes
#                          test-gpu-<PART>.md/log; `python bench/test_gpu_summary.py DIR` then writes
#                          test-gpu.md with every part and the total)
#   LIMIT_S=280 bash bench/test_gpu.sh
#                         (pytest is interrupted (SIGINT) after that many seconds: it still prints its
#                          summary of the tests that ran, and the part's .md says it was cut off)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
RESULTS=${RESULTS:-bench/results}
mkdir -p "$RESULTS"
NAME=test-gpu${PART:+-$PART}
TESTS=${TESTS:-tests}
LOG="$RESULTS/$NAME.log"
export PYTHONUNBUFFERED=1 FORGE_PACK_REQUIRE_GPU=1
# On a machine without network access, wheels placed in .whl/ (jsonschema, openai, ...) go to /tmp/site.
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# test_ui_browser.py skips itself at import when Playwright or Chromium is missing; it has no gpu
# test, and its module-level skip would otherwise show up in the summary.
limit=()
[ -n "${LIMIT_S:-}" ] && limit=(timeout -s INT -k 30 "$LIMIT_S")
"${limit[@]}" "$PYTHON" -m pytest -m gpu -p no:randomly -p no:cacheprovider -rfEs --durations=15 \
  --ignore=tests/test_ui_browser.py ${PYTEST_ARGS:-} $TESTS 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
summary=$(grep -E '^=+ .*(passed|failed|error|skipped|no tests ran).* in [0-9.]+s' "$LOG" | tail -1 | sed -E 's/^=+ //; s/ =+$//')
count() { echo "$summary" | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }
passed=$(count passed); failed=$(count failed); skipped=$(count skipped); errors=$(count error)
# the tree's commit as every bench script records it (bench/_common.commit: "+ uncommitted changes to N files"
# where the tree differs from HEAD, as on the device, whose HEAD can lag the tree it runs)
commit_of_tree() {
  "$PYTHON" -c 'import sys; sys.path.insert(0, "bench"); import _common; print(_common.commit() or "unknown")'
}
versions=$("$PYTHON" - <<'PY'
import platform, torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (torch sees no CUDA device)"
print(f"- python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
print(f"- GPU: {gpu}")
PY
)
{
  echo "# make test-gpu"
  echo
  echo "Every \`gpu\` test with FORGE_PACK_REQUIRE_GPU=1 (a skipped gpu test fails), the CUDA anti-cheat"
  echo "fixtures first; written by bench/test_gpu.sh ($(date -u +%Y-%m-%dT%H:%MZ), commit $(commit_of_tree))."
  echo
  echo "$versions"
  echo "- pytest exit status: $rc"
  echo
  echo '```'
  echo "$summary"
  echo "$passed passed, $((failed + errors)) failed, $skipped skipped"
  echo '```'
  echo "- tests: $TESTS"
  [ -n "${LIMIT_S:-}" ] && [ "$rc" -eq 124 -o "$rc" -eq 2 ] && grep -q KeyboardInterrupt "$LOG" \
    && echo "- cut off by LIMIT_S=$LIMIT_S: the tests after the last one in the log did not run"
} > "$RESULTS/$NAME.md"
cat "$RESULTS/$NAME.md"
exit "$rc"
