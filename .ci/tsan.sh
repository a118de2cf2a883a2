#!/usr/bin/env bash
# ThreadSanitizer: the reentrancy test (many std::threads calling every entry
# point at once) and the property suite (a tenth of the Release cases), built
# with clang and LLVM's OpenMP runtime. GCC's libgomp is not instrumented for
# TSan, so its barriers would be reported as races; libomp with the Archer
# tool (OMP_TOOL_LIBRARIES, from libomp-14-dev) tells TSan about every OpenMP
# synchronization instead, and no suppression is needed.
#   .ci/tsan.sh                   # build dir build-tsan
#   BUILD=dir JOBS=n .ci/tsan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-tsan}
JOBS=${JOBS:-$(nproc)}
LLVM=/usr/lib/llvm-14
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 \
  -DTANDEM_SANITIZE_THREAD=ON -DTANDEM_BUILD_BENCH=OFF -DTANDEM_BUILD_TOOLS=OFF \
  -DTANDEM_BUILD_DOCS=OFF -DTANDEM_PYTHON_VENV= >/dev/null
cmake --build "$BUILD" --target test_reentrancy props_suite -j"$JOBS"
export OMP_TOOL_LIBRARIES=$LLVM/lib/libarcher.so
export LD_LIBRARY_PATH=$LLVM/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Any report fails the test that made it (exit code 66).
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
export ARCHER_OPTIONS=${ARCHER_OPTIONS:-verbose=1}
export TANDEM_PROPS_SCALE=${TANDEM_PROPS_SCALE:-0.1}
ctest --test-dir "$BUILD" -R '^Reentrancy\.' --output-on-failure
ctest --test-dir "$BUILD" -L props --output-on-failure -j"$JOBS"
