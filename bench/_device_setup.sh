# Sourced by the device helper scripts (gpu_trust_check.sh, search_shapes.sh) from the repository
# root: unbuffered Python, $OUT (the directory results go to; default /tmp/out) created, the
# repository on PYTHONPATH, and, on a machine without network access, the wheels placed in .whl/
# (jsonschema and its dependencies, ...) installed to /tmp/site; the sourcing script exits 1 if that
# install fails.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit 1
fi
