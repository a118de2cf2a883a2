#!/usr/bin/env bash
# ThreadSanitizer: the reentrancy test (many std::threads calling every entry
# point at once) and the property suite (all its cases), built
# with clang and LLVM's OpenMP runtime. GCC's libgomp is not instrumented for
# TSan, so its barriers would be reported as races; libomp with the Archer
# tool (OMP_TOOL_LIBRARIES, from libomp-14-dev) tells TSan about every OpenMP
# synchronization instead, and no suppression is needed.
# Clang 14 cannot compile an OpenMP region inside Highway's per-target code
# for a target above the baseline (the outlined region lacks the target's
# attributes: "Do not know how to split the result of this operator"), so
# this build compiles the one target AVX2 as the baseline of the whole program
# (HWY_COMPILE_ONLY_STATIC; -maes because Highway's AVX2 baseline asks for it
# and clang's haswell leaves it out). The threads, tasks and scratch of every
# call are the same at every target.
#   .ci/tsan.sh                   # build dir build-tsan
#   BUILD=dir JOBS=n .ci/tsan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-tsan}
JOBS=${JOBS:-$(nproc)}
LLVM=/usr/lib/llvm-14
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_CXX_FLAGS="-UHWY_COMPILE_ALL_ATTAINABLE -DHWY_COMPILE_ONLY_STATIC -march=haswell -maes" \
  -DTANDEM_SANITIZE_THREAD=ON -DTANDEM_BUILD_BENCH=OFF -DTANDEM_BUILD_TOOLS=OFF \
  -DTANDEM_BUILD_DOCS=OFF -DTANDEM_PYTHON_VENV= >/dev/null
cmake --build "$BUILD" --target test_reentrancy props_suite -j"$JOBS"
export OMP_TOOL_LIBRARIES=$LLVM/lib/libarcher.so
export LD_LIBRARY_PATH=$LLVM/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Any report fails the test that made it (exit code 66). The accesses of
# libomp itself (not instrumented) are left to Archer, as it asks: without
# ignore_noninstrumented_modules TSan reports libomp's own allocator.
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1}
export ARCHER_OPTIONS=${ARCHER_OPTIONS:-verbose=1}
export TANDEM_PROPS_SCALE=${TANDEM_PROPS_SCALE:-1}
ctest --test-dir "$BUILD" -R '^Reentrancy\.' --output-on-failure
ctest --test-dir "$BUILD" -L props --output-on-failure -j"$JOBS"
