#!/usr/bin/env bash
# ThreadSanitizer: the reentrancy test (many std::threads calling every entry
# point at once) and the property suite (all its cases), built with clang and
# LLVM's OpenMP runtime, once per Highway target this CPU runs. GCC's libgomp
# is not instrumented for TSan, so its barriers would be reported as races;
# libomp with the Archer tool (OMP_TOOL_LIBRARIES, from libomp-14-dev) tells
# TSan about every OpenMP synchronization instead, and no suppression is
# needed.
#
# Clang cannot compile an OpenMP region inside Highway's per-target code for
# a target above the baseline: the outlined region lacks the target's
# attributes, so its vector operations cannot be selected ("fatal error:
# error in backend: Cannot select: v8i16 = X86ISD::PACKUS" in
# optimized/src/swiglu.cpp's SSE4 code, SSE4.1's packusdw; "Do not know how
# to split the result of this operator!" in axial_rope.cpp's AVX3 code;
# clang 14, 16 and 19 alike). So each build compiles one target as the
# baseline of the whole program (HWY_COMPILE_ONLY_STATIC with that target's
# -march, or HWY_COMPILE_ONLY_SCALAR), one build per target the Release
# build dispatches to and this CPU runs:
#   SCALAR  the scalar fallback (x86-64 baseline)
#   SSE4    -march=westmere -maes -mpclmul (Highway asks for AES and PCLMUL)
#   AVX2    -march=haswell -maes (clang's haswell leaves AES out)
#   AVX3    -march=skylake-avx512 -maes -mpclmul (only where the CPU has
#           avx512f, avx512vl, avx512dq and avx512bw)
# The threads, tasks and scratch of every call are the same at every target;
# the lane count changes the tiles and so the work each task does. So every
# target runs the reentrancy test (every entry point of both backends from
# many threads at once), and the best target the CPU runs also runs the whole
# property suite (TSAN_PROPS=all: at every target; about 2½ minutes of tests
# and a build of the suite each on 2 cores).
#   .ci/tsan.sh                    # build dirs build-tsan-<target>
#   BUILD=dir JOBS=n .ci/tsan.sh   # dir-<target>
#   TSAN_TARGETS="SSE4 AVX2" .ci/tsan.sh   # these targets only
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-tsan}
JOBS=${JOBS:-$(nproc)}
LLVM=/usr/lib/llvm-14
tools/install-deps.sh  # clang 14, libclang-rt-14-dev, libomp-14-dev (Archer)

# The /proc/cpuinfo flags each target needs.
declare -A NEEDS=([SCALAR]="" [SSE4]="sse4_2 aes pclmulqdq" [AVX2]="avx2 fma bmi2 f16c aes"
                  [AVX3]="avx512f avx512vl avx512dq avx512bw")
declare -A FLAGS=(
  [SCALAR]="-DHWY_COMPILE_ONLY_SCALAR"
  [SSE4]="-DHWY_COMPILE_ONLY_STATIC -march=westmere -maes -mpclmul"
  [AVX2]="-DHWY_COMPILE_ONLY_STATIC -march=haswell -maes"
  [AVX3]="-DHWY_COMPILE_ONLY_STATIC -march=skylake-avx512 -maes -mpclmul")
runs() {
  local f
  for f in ${NEEDS[$1]}; do grep -qw "$f" /proc/cpuinfo || return 1; done
}
TSAN_TARGETS=${TSAN_TARGETS:-SCALAR SSE4 AVX2 AVX3}
TSAN_PROPS=${TSAN_PROPS:-best}
best=
for target in $TSAN_TARGETS; do runs "$target" && best=$target; done

export OMP_TOOL_LIBRARIES=$LLVM/lib/libarcher.so
export LD_LIBRARY_PATH=$LLVM/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Any report fails the test that made it (exit code 66). The accesses of
# libomp itself (not instrumented) are left to Archer, as it asks: without
# ignore_noninstrumented_modules TSan reports libomp's own allocator.
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1}
export ARCHER_OPTIONS=${ARCHER_OPTIONS:-verbose=1}
export TANDEM_PROPS_SCALE=${TANDEM_PROPS_SCALE:-1}
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

for target in $TSAN_TARGETS; do
  if ! runs "$target"; then
    echo "tsan: this CPU does not run $target; skipped"
    continue
  fi
  dir="$BUILD-${target,,}"
  t0=$SECONDS
  # -UHWY_COMPILE_ALL_ATTAINABLE: the one target, not optimized/CMakeLists.txt's set
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 \
    "${launcher[@]}" -DCMAKE_CXX_FLAGS="-UHWY_COMPILE_ALL_ATTAINABLE ${FLAGS[$target]}" \
    -DTANDEM_SANITIZE_THREAD=ON -DTANDEM_BUILD_BENCH=OFF -DTANDEM_BUILD_TOOLS=OFF \
    -DTANDEM_BUILD_DOCS=OFF -DTANDEM_PYTHON_VENV= >/dev/null
  props=false
  if [[ $TSAN_PROPS == all || $target == "$best" ]]; then props=true; fi
  if $props; then
    cmake --build "$dir" --target test_reentrancy props_suite -j"$JOBS"
  else
    cmake --build "$dir" --target test_reentrancy -j"$JOBS"
  fi
  t1=$SECONDS
  ctest --test-dir "$dir" -R '^Reentrancy\.' --output-on-failure
  if $props; then
    # The property suite's subjects name the target they ran on.
    listed=$(ctest --test-dir "$dir" -L props -N)
    grep -q "optimized_$target\." <<<"$listed" ||
      { echo "tsan: $dir holds no optimized_$target subject" >&2; exit 1; }
    ctest --test-dir "$dir" -L props --output-on-failure -j"$JOBS"
  fi
  echo "tsan: $target: built in $((t1 - t0)) s, tests ran in $((SECONDS - t1)) s"
done
