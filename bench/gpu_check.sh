#!/usr/bin/env bash
# One H200 call: every `gpu` test, then the evaluator benchmarks. Logs and results under $OUT.
#   bash bench/gpu_check.sh            (on the device machine, from the repository root)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.log" 2>&1 || echo "editable install failed (see install.log)"
SKIP=${SKIP_TESTS:-"build_example"}
timeout ${TEST_TIMEOUT:-330} python3 -m pytest -q -m gpu -k "not $SKIP" -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest_gpu.log" | tail -40
timeout 150 python3 bench/eval_throughput.py "$OUT/eval_throughput" --no-compile 2>&1 | tail -12
timeout 200 python3 bench/timing_repeatability.py "$OUT/timing_repeatability" 2>&1 | tail -25
