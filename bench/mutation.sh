#!/usr/bin/env bash
# Mutation testing of the trust core with mutmut (the `dev` extra). `make mutation` / `make mutation-check`.
#   bash bench/mutation.sh [MODULE ...]     run each module (default: all of MODULES below) in its own copy
#                                           of the tree under build/mutation/MODULE, then write
#                                           bench/results/mutation.md and .json from every module's results
#   bash bench/mutation.sh --check          CI: one mutmut run over the fast modules (CHECK_MODULES, in
#                                           build/mutation/_check, with the union of their tests: that can
#                                           only kill more) and fail if a score is below the committed
#                                           bench/results/mutation.json
# Each module is mutated alone with only the tests that judge it (SELECT below); the evaluator's worker
# subprocesses see the mutant through MUTANT_UNDER_TEST and report the functions they ran through
# bench/mutation/ (sitecustomize.py + the forge_mutmut_hits pytest plugin).
# Env: PYTHON (interpreter with mutmut), MUTMUT (its mutmut script), JOBS (parallel mutants, default 2),
#      MUTATION_SAMPLE (with --check: only the mutants whose number ends in these digits, e.g. 147, each of
#      which must be killed or a survivor the committed results list; CI's guard rotates the digits daily),
#      MUTANTS (mutmut names or globs, e.g. "forge_pack.evaluate.verify.x_fresh_sets*": a partial run, reported on
#      the terminal only, never written to bench/results).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
MUTMUT=${MUTMUT:-$(dirname "$PYTHON")/mutmut}
JOBS=${JOBS:-2}

# module -> the tests that decide its verdicts and figures (space-separated)
declare -A SELECT=(
  [verdict]="tests/test_verdict.py"
  [tolerance]="tests/test_tolerance.py tests/test_tolerance_op_forms.py"
  [static_check]="tests/test_static_check.py tests/test_static_check_verdicts.py"
  # (tests/test_eval_memory.py is left out: its evaluator runs take as long as the rest together, and
  #  test_verify_inputs.py judges the streamed sets it runs in process)
  [verify]="tests/test_verify_run.py tests/test_verify_inputs.py tests/test_evaluate_flow.py"
  [evaluate]="tests/test_evaluate_flow.py"
  [timing]="tests/test_timing_protocol.py"
  # the shipped `python -m <package> verify` (module -> files: FILES in mutation_report.py)
  [package_verify]="tests/test_package_verify_checks.py tests/test_conv_region_verify.py"
  # tests/targets/test_attention.py is left out: attention.py is its own module (below), and its tests run a
  # search and compile kernels for every mutant of the generic rules they reach
  [verdict_rules]="tests/test_verdict_rules.py tests/test_tolerance.py tests/test_verify_inputs.py tests/test_targets.py
    tests/targets/test_avg_pool.py tests/targets/test_batch_norm.py tests/targets/test_group_norm.py
    tests/targets/test_layer_norm.py tests/targets/test_norm_common.py tests/targets/test_rms_norm.py
    tests/targets/test_softmax.py"
  # (the slow end-to-end tests are left out: each reruns a whole build or evaluator for every mutant it reaches;
  #  the unit tests reach the same code)
  [object_check]="tests/test_object_check_decisions.py tests/test_object_check_stand_in_elf.py tests/test_x86_listing.py
    tests/test_object_check.py
    --deselect=tests/test_object_check.py::test_every_cpu_template_family_and_reference_kernel_passes_the_object_check
    --deselect=tests/test_object_check.py::test_nvcc_fallback_build_has_its_host_side_checked
    --deselect=tests/test_object_check.py::test_evaluator_rejects_object_fixtures_before_loading_them_then_judges_the_next"
  [attention]="tests/targets/test_attention.py"
  # (test_region_search.py is left out: each of its tests runs a search, for every mutant it reaches)
  [region]="tests/test_region_target.py tests/test_region_inputs.py tests/test_region_sensitivity.py
    tests/test_region_rounding.py tests/test_region_index.py tests/test_region_window.py"
  [model_gate]="tests/test_model_gate.py
    --deselect=tests/test_model_gate.py::test_pack_drops_a_kernel_that_breaks_the_whole_model_and_ships_the_rest
    --deselect=tests/test_model_gate.py::test_pack_writes_no_package_when_the_only_kernel_breaks_the_model"
)
MODULES="verdict tolerance static_check verdict_rules object_check model_gate verify timing package_verify evaluate attention region"
# CI's guard: the modules whose tests are in-process unit tests (a few minutes together on 2 cores).
# verdict_rules (1500+ mutants), object_check (compiles), package_verify, evaluate, attention and region (searches,
# kernel compiles): `make mutation` only.
CHECK_MODULES="verdict tolerance static_check model_gate verify timing"

check=0
if [[ ${1:-} == --check ]]; then check=1; shift; set -- $CHECK_MODULES; fi
[[ $# -gt 0 ]] || set -- $MODULES

# run NAME MODULE...: mutmut over the modules, with the union of their tests, in build/mutation/NAME
run() {
  local name=$1; shift
  local files=() tests=() m
  for m in "$@"; do files+=($("$PYTHON" bench/mutation_report.py --file "$m")); tests+=(${SELECT[$m]}); done
  local work=build/mutation/$name
  rm -rf "$work" && mkdir -p "$work"
  # the tree as git sees it (tracked + untracked, not ignored), so a run never picks up stale builds
  git ls-files -z -co --exclude-standard | tar --null -T - -cf - 2>/dev/null | tar -xf - -C "$work"
  "$PYTHON" bench/mutation_report.py --configure "$work/pyproject.toml" "${files[@]}" \
    $(printf '%s\n' "${tests[@]}" | awk '!seen[$0]++')
  local hits
  hits=$(mktemp -d)
  echo "== mutmut: ${files[*]} with $(printf '%s\n' "${tests[@]}" | awk '!seen[$0]++' | tr '\n' ' ')"
  local start
  start=$(date +%s)
  # one thread per process: torch's OpenMP pool does not survive mutmut's fork per mutant (busy-waits
  # until the CPU limit and reads as a timeout); FORGE_PACK_CPU_THREADS does the same for the workers.
  # only the modules' own mutants, and of a module scoped to some of its functions (SCOPE in
  # mutation_report.py) only those; set -f: the names are globs for mutmut, never for the shell
  local names=${MUTANTS:-}
  [[ -n $names ]] || names=$("$PYTHON" bench/mutation_report.py --names "$@")
  (set -f; cd "$work" && OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 FORGE_PACK_CPU_THREADS=1 FORGE_MUTMUT_HITS=$hits \
     PYTHONPATH=$ROOT/bench/mutation "$MUTMUT" run --max-children "$JOBS" $names > mutmut.log 2>&1) \
    || { tail -c 3000 "$work/mutmut.log"; rm -rf "$hits"; exit 1; }
  rm -rf "$hits"
  echo "   done in $(( $(date +%s) - start )) s"
}

todo=()
for m in "$@"; do
  [[ -n ${SELECT[$m]:-} ]] || { echo "unknown module $m (one of: ${!SELECT[*]})" >&2; exit 2; }
  missing=
  for src in $("$PYTHON" bench/mutation_report.py --file "$m"); do [[ -f $src ]] || missing+=" $src"; done
  [[ -z $missing ]] || { echo "skipping $m:$missing does not exist"; continue; }
  todo+=("$m")
done
if (( check )); then
  run _check "${todo[@]}"  # one mutmut run for all: one coverage pass instead of one per module
else
  for m in "${todo[@]}"; do run "$m" "$m"; done
fi

if [[ -n ${MUTANTS:-} ]]; then
  "$PYTHON" bench/mutation_report.py --partial "${todo[@]}"
elif (( check )); then
  "$PYTHON" bench/mutation_report.py --check $CHECK_MODULES
else
  "$PYTHON" bench/mutation_report.py --write "$@"
fi
