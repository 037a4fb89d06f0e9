#!/usr/bin/env bash
# Line coverage of the fuzzed code by the fuzz corpora (`make fuzz-coverage`, after `make fuzz`):
# builds the replay harnesses with clang's source-based coverage in build/fuzz-cov, replays
# the checked-in seeds, the regression inputs and the corpus `make fuzz` grew
# (build/fuzz/fuzz-corpus/<target>), and prints llvm-cov's report for the files each target
# is meant to exercise.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$src/build/fuzz-cov
flags="-fprofile-instr-generate -fcoverage-mapping"
cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
      -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DMEGAMOE_WITH_ONEDNN=OFF \
      -DMEGAMOE_WITH_MPI=OFF >/dev/null
declare -A files=(
  [env]="src/base/env.c src/shmem/boot_net.c"
  [ops_args]="src/ops/v2_validate.c src/ops/v2_args.c src/ops/v2_workspace.c"
  [trace]="src/profile/json.c src/profile/trace_read.c src/profile/trace_model.c src/profile/trace_summary.c src/profile/trace_svg.c src/profile/trace_write.c"
  [bootstrap]="src/shmem/bootstrap.c src/shmem/boot_net.c"
)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(env ops_args trace bootstrap)
for t in "${targets[@]}"; do
  cmake --build "$out" -j "$(nproc)" --target "replay_$t" >/dev/null
  rm -f "$out"/cov-"$t"-*.profraw
  inputs=("$src/tests/fuzz/corpus/$t")
  [ -d "$src/tests/fuzz/regressions/$t" ] && inputs+=("$src/tests/fuzz/regressions/$t")
  [ -d "$src/build/fuzz/fuzz-corpus/$t" ] && inputs+=("$src/build/fuzz/fuzz-corpus/$t")
  LLVM_PROFILE_FILE="$out/cov-$t-%p.profraw" "$out/tests/fuzz/replay_$t" "${inputs[@]}" >/dev/null
  llvm-profdata merge -sparse "$out"/cov-"$t"-*.profraw -o "$out/cov-$t.profdata"
  echo "== $t: $(find "${inputs[@]}" -type f | wc -l) inputs"
  paths=()
  for f in ${files[$t]}; do paths+=("$src/$f"); done
  llvm-cov report "$out/tests/fuzz/replay_$t" -instr-profile="$out/cov-$t.profdata" "${paths[@]}" \
    | awk '$1 ~ /\.c$/ || $1 == "TOTAL" { printf "  %-28s lines %5s, %5s missed, %7s covered; branches %7s\n", $1, $8, $9, $10, $13 }'
done
