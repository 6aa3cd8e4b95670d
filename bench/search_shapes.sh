#!/usr/bin/env bash
# The benchmark shapes on a GPU: forge-pack search over every shape of bench/shapes/issue4_shapes.py,
# then the report (bench/results/search.md). The run dir stays outside $OUT (its captured inputs are
# GBs); run.db and profile.json are copied to $OUT.
#   BUDGET=50 TIME_LIMIT=45 bash bench/search_shapes.sh
set -uo pipefail
source bench/_device_setup.sh
RUN=/tmp/forge_run_shapes
rm -rf "$RUN"
CMD="python3 -m forge_pack search bench/shapes/issue4_shapes.py --device cuda --top 12 --min-share 0 --budget ${BUDGET:-50} --time-limit ${TIME_LIMIT:-45} --run-dir $RUN --json"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
python3 -c "import torch,sys; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'Python', sys.version.split()[0])" >> "$OUT/env.txt"
timeout ${SEARCH_TIMEOUT:-560} $CMD > "$OUT/search.json" 2> "$OUT/search.err"
echo "search rc=$?"; tail -5 "$OUT/search.err"
cp "$RUN/run.db" "$OUT/run.db" 2>/dev/null; cp "$RUN/profile.json" "$OUT/" 2>/dev/null
python3 bench/search_report.py "$OUT/search.json" "$RUN/run.db" "$OUT/search.md" --command "$CMD" --env "$OUT/env.txt"
