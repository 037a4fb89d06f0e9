#!/usr/bin/env bash
# Run every libFuzzer target of the fuzz build for SECONDS seconds each (`make fuzz`).
#   tests/fuzz/run_fuzz.sh BUILD_DIR SECONDS [TARGET...]
# The checked-in seeds (tests/fuzz/corpus/<target>) and regression inputs are read, new
# inputs go to BUILD_DIR/fuzz-corpus/<target> (kept between runs), a crash leaves its input in
# BUILD_DIR/fuzz-artifacts/<target>/ and fails the run. One line per target: executions,
# libFuzzer's coverage (cov: edges, ft: features), corpus size, peak RSS. FUZZ_SEED=N fixes
# libFuzzer's random seed (CI: the same mutations every run); unset or 0: a new seed each run.
set -uo pipefail
build=$1
seconds=$2
shift 2
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(env ops_args trace bootstrap)
src=$(cd "$(dirname "$0")" && pwd)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=0
printf '%-10s %8s %12s %8s %8s %8s %8s\n' target seconds execs exec/s cov ft corpus
for t in "${targets[@]}"; do
  bin=$build/tests/fuzz/fuzz_$t
  if [ ! -x "$bin" ]; then echo "run_fuzz: $bin is missing (build the fuzz preset)"; failed=1; continue; fi
  work=$build/fuzz-corpus/$t
  art=$build/fuzz-artifacts/$t
  log=$build/fuzz-logs/$t.log
  mkdir -p "$work" "$art" "$(dirname "$log")"
  inputs=("$work" "$src/corpus/$t")
  [ -d "$src/regressions/$t" ] && inputs+=("$src/regressions/$t")
  "$bin" -seed="${FUZZ_SEED:-0}" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -max_len=8192 \
         -print_final_stats=1 -artifact_prefix="$art/" "${inputs[@]}" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  printf '%-10s %8s %12s %8s %8s %8s %8s\n' "$t" "$seconds" "${execs:-?}" "${rate:-?}" \
         "${cov:-?}" "${ft:-?}" "${corp:-?}"
  if [ $rc -ne 0 ]; then
    echo "run_fuzz: fuzz_$t FAILED (exit $rc); input in $art, log $log:"
    grep -E 'ERROR|SUMMARY|property violated|runtime error' "$log" | head -5
    failed=1
  fi
done
exit $failed
