#!/usr/bin/env bash
# First contact with the H200: install the carried wheels, run the GPU tests of the foundation and
# the evaluator, and the compile-speed benchmark. Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
timeout 240 python3 -m pytest -q -m gpu -x tests/test_verify_gpu.py tests/test_profile.py 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25
timeout 120 python3 bench/compile_speed.py "$OUT/compile_speed" 2>&1 | tail -15
