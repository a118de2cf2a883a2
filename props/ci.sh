#!/usr/bin/env bash
# The property suite under AddressSanitizer + UndefinedBehaviorSanitizer, with
# a quarter of the Release case counts (TANDEM_PROPS_SCALE). The Release run
# is part of `make test` (ctest label `props`).
#   props/ci.sh            # build dir build-props-asan, from a clean checkout
#   BUILD=dir props/ci.sh  # another build dir
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-props-asan}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_SANITIZE=ON \
  -DTANDEM_BUILD_BENCH=OFF -DTANDEM_BUILD_TOOLS=OFF
cmake --build "$BUILD" --target props_suite props_fixtures -j"$JOBS"
export TANDEM_PROPS_SCALE=${TANDEM_PROPS_SCALE:-0.25}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$BUILD" -L props --output-on-failure -j"$JOBS"
