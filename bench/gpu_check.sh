#!/usr/bin/env bash
# One H200 call: every `gpu` test, then the evaluator benchmarks. Logs and results under $OUT.
#   bash bench/gpu_check.sh            (on the device machine, from the repository root)
set -uo pipefail
source bench/_device_setup.sh
SKIP=${SKIP_TESTS:-"build_example"}
timeout ${TEST_TIMEOUT:-330} python3 -m pytest -q -m gpu -k "not $SKIP" -p no:cacheprovider --durations=15 tests 2>&1 \
  | tee "$OUT/pytest_gpu.log" | tail -45
BENCH_N=${BENCH_N:-20} timeout ${THROUGHPUT_TIMEOUT:-120} python3 bench/eval_throughput.py "$OUT/eval_throughput" --no-compile 2>&1 | tail -12
timeout ${REPEAT_TIMEOUT:-150} python3 bench/timing_repeatability.py "$OUT/timing_repeatability" 2>&1 | tail -25
