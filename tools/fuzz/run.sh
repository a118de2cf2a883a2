#!/usr/bin/env bash
# Builds tandem's libFuzzer targets with clang (ASan + UBSan) and runs each for
# a bounded time on a copy of the seed corpus in tools/fuzz/corpus/, with its
# dictionary (corpus/<name>.dict) where there is one. The targets: the .npy
# reader, the case loader (plus a reference run of small cases), and the
# tuning file's parser (optimized/src/tuning.cpp with the Highway target
# list it names the CPU's target from; libhwy).
#   tools/fuzz/run.sh [seconds per target, default 60]
# Environment: TANDEM_FUZZ_BUILD (build dir, default build-fuzz), CLANGXX
# (default clang++), TANDEM_FUZZ_JOBS (parallel fuzzing jobs, default 1).
# Exits non-zero when a target crashes, leaks, hangs (> 10 s on one input)
# or fails to build; a reproducer is left in the build dir.
set -euo pipefail
seconds="${1:-60}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${TANDEM_FUZZ_BUILD:-$root/build-fuzz}"
cxx="${CLANGXX:-clang++}"
jobs="${TANDEM_FUZZ_JOBS:-1}"
mkdir -p "$build"

flags=(-std=c++20 -g -O1 -fno-omit-frame-pointer
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root/include" -I"$root/reference/include" -I"$root/tools/src"
       -I"$root/optimized/include" -I"$root/optimized/src")

build_target() {
  local name="$1"; shift
  # Rebuild only when a source or header is newer than the binary.
  if [ -x "$build/$name" ] && [ -z "$(find "$root/include" "$root/reference" "$root/tools/src" \
       "$root/optimized" "$root/tools/fuzz" -newer "$build/$name" \
       \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' \) -print -quit)" ]; then
    echo "fuzz: $name is up to date"
    return
  fi
  echo "fuzz: building $name"
  "$cxx" "${flags[@]}" "$@" -o "$build/$name"
}
build_target fuzz_npy "$root/tools/fuzz/fuzz_npy.cpp" "$root/tools/src/npy.cpp"
build_target fuzz_case "$root/tools/fuzz/fuzz_case.cpp" "$root/tools/src/npy.cpp" \
  "$root/tools/src/case.cpp" "$root/tools/src/case_run.cpp" "$root/tools/src/tolerance.cpp" \
  "$root"/reference/src/*.cpp
build_target fuzz_tuning "$root/tools/fuzz/fuzz_tuning.cpp" "$root/optimized/src/tuning.cpp" \
  "$root/optimized/src/targets.cpp" "$root/optimized/src/bf16_dot.cpp" -lhwy

status=0
for target in fuzz_npy fuzz_case fuzz_tuning; do
  seeds="$root/tools/fuzz/corpus/${target#fuzz_}"
  dict=()
  if [ -f "$seeds.dict" ]; then dict=(-dict="$seeds.dict"); fi
  work="$build/corpus-${target#fuzz_}"
  mkdir -p "$work" "$build/artifacts-$target"
  echo "fuzz: running $target for ${seconds}s (seeds: $seeds)"
  parallel=()
  if [ "$jobs" -gt 1 ]; then parallel=(-fork="$jobs"); fi
  if ! (cd "$build" && "./$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
          -max_len=4096 "${parallel[@]}" "${dict[@]}" -print_final_stats=1 \
          -artifact_prefix="$build/artifacts-$target/" "$work" "$seeds"); then
    echo "fuzz: $target FAILED; reproducers in $build/artifacts-$target/" >&2
    status=1
  fi
done
exit $status
