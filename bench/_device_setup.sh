# Sourced by the one-call device scripts (gpu_check.sh, h200_session.sh), from the repository root:
# unbuffered Python, $OUT (default /tmp/out) created, and the carried wheels in .whl/ installed to
# /tmp/site and put on PYTHONPATH with the repository; the calling script exits 1 if that fails.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
