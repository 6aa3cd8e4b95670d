#!/usr/bin/env bash
# One device call that does several steps within one time limit, logs and results under $OUT.
#   STEPS="templates sweep real" LIMIT=570 MODELS="sd35_vae_decode resnet50" bash bench/h200_session.sh
# Steps:
#   templates  the `gpu` tests of tests/test_templates.py (every CUDA family verified on the GPU)
#   sweep      bench/kernel_sweep.py (chosen kernels on the issue-4 shapes + a bare launch; SWEEP_ONLY: ops,
#              SWEEP_FAMILIES: families, SWEEP_KNOB: only variants setting that knob)
#   launch     only the bare empty-kernel launch of bench/kernel_sweep.py
#   pool_probe bench/pool_probe.cu built with nvcc and run (avgpool read ceiling and staging designs, C++)
#   real       bench/real_models.py for $MODELS (BUDGET, TIME_LIMIT, TOP, REAL_ARGS: more options), continuing from .carry/real_models/ when present,
#              with a deadline that leaves the call's time limit ($LIMIT seconds in all) intact
set -uo pipefail
start=$(date +%s)
source bench/_device_setup.sh
STEPS=${STEPS:-"templates sweep real"}
LIMIT=${LIMIT:-570}
left() { echo $((LIMIT - ($(date +%s) - start))); }
for step in $STEPS; do
  case $step in
    templates)
      timeout ${TEMPLATES_TIMEOUT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider --durations=8 \
        ${TEMPLATES_K:+-k "$TEMPLATES_K"} tests/test_templates.py 2>&1 | tee "$OUT/pytest_templates.log" | tail -25 ;;
    pool_probe)
      nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/pool_probe bench/pool_probe.cu \
        && timeout 120 /tmp/pool_probe 2>&1 | tee "$OUT/pool_probe.md" | tail -60 ;;
    launch)
      timeout 120 python3 bench/kernel_sweep.py "$OUT/launch" --only launch 2>&1 | tail -5 ;;
    sweep)
      timeout ${SWEEP_TIMEOUT:-200} python3 bench/kernel_sweep.py "$OUT/kernel_sweep" ${SWEEP_ONLY:+--only $SWEEP_ONLY} \
        ${SWEEP_FAMILIES:+--families $SWEEP_FAMILIES} ${SWEEP_KNOB:+--knob $SWEEP_KNOB} \
        2>&1 | tail -80 ;;
    real)
      P=
      [ -f .carry/real_models/real_models.json ] && P="--previous .carry/real_models/real_models.json"
      python3 bench/real_models.py "$OUT/real_models" $P --deadline $(( $(left) - 15 )) \
        --budget ${BUDGET:-12} --time-limit ${TIME_LIMIT:-12} ${TOP:+--top $TOP} ${REAL_ARGS:-} --models ${MODELS:-sd35_vae_decode resnet50 gemma4_prefill qwen35_moe_prefill} \
        2>&1 | grep -v '^\$ ' | tail -40 ;;
  esac
  echo "== $step done at $(( $(date +%s) - start )) s"
done
