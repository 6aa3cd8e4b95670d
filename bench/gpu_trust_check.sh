#!/usr/bin/env bash
# The out-of-bounds guard and the CUDA anti-cheat fixtures in one command on a GPU machine: versions,
# a probe of the guarded buffers, the `gpu` tests of tests/test_verify_gpu.py and
# tests/test_bounds_gpu.py, then bench/oob_crosscheck.py (guarded runs against compute-sanitizer's
# memcheck). Times nothing.
#   bash bench/gpu_trust_check.sh      (from the repository root; OUT=DIR for the results)
# Writes under $OUT: versions.txt, pytest_trust.log, oob_crosscheck.md/.json. The cross-check gets
# the time the tests left (LIMIT seconds in all); runs that would start later show as skipped.
set -uo pipefail
start=$(date +%s)
LIMIT=${LIMIT:-580}  # fits a machine that stops a command after 600 s, with time left to copy the results
source bench/_device_setup.sh
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  uname -r
  python3 -c "import torch; print('torch', torch.__version__, '| CUDA', torch.version.cuda, '|', torch.cuda.get_device_name())"
  nvcc --version | tail -1
  echo "compute-sanitizer: $(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
  python3 -c "
from forge_pack.evaluate.launch import Driver
d = Driver.get(); d.ensure_context()
p = d.guard_problem()
print('guarded buffers:', 'ok, granularity %d bytes' % d.granularity() if not p else 'UNAVAILABLE: ' + p)"
} 2>&1 | tee "$OUT/versions.txt"
timeout ${TEST_TIMEOUT:-390} python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --durations=10 -k "not ${SKIP_TESTS:-baseline_times_eager}" \
  tests/test_verify_gpu.py tests/test_bounds_gpu.py 2>&1 | tee "$OUT/pytest_trust.log" | tail -40
left=$(( LIMIT - ($(date +%s) - start) - 5 ))
python3 bench/oob_crosscheck.py --out "$OUT" --timeout 90 --deadline $left 2>&1 | tail -25
