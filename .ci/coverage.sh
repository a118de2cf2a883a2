#!/usr/bin/env bash
# Line and branch coverage of the kernels (optimized/src, reference/) by the
# property suite alone: a gcov build (TANDEM_COVERAGE, -O1) of the two props
# programs, the tests of `ctest -L props` (no unit test runs), then gcovr. Prints the
# summary and the per-file tables; the HTML report goes to $BUILD/html/.
#   .ci/coverage.sh                   # build dir build-coverage
#   BUILD=dir JOBS=n .ci/coverage.sh
# Throw branches (the exception edges of every call that may throw) and
# branches gcov marks unreachable are left out of the branch count.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-coverage}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
  -DTANDEM_COVERAGE=ON -DTANDEM_BUILD_BENCH=OFF -DTANDEM_BUILD_TOOLS=OFF \
  -DTANDEM_BUILD_DOCS=OFF -DTANDEM_PYTHON_VENV= >/dev/null
cmake --build "$BUILD" --target props_suite props_fixtures -j"$JOBS"
# Counters from an earlier run would add to this one.
find "$BUILD" -name '*.gcda' -delete
# The tests of `ctest -L props`, one process per program rather than CTest's
# one per test: a process of a gcov build writes all its counters when it
# exits, seconds each, which made the CTest run ten times longer.
export OMP_WAIT_POLICY=passive  # as in props/CMakeLists.txt
# half the Release case counts: the lines and branches a property reaches are
# reached within its first cases; the full counts run in `make test`
export TANDEM_PROPS_SCALE=${TANDEM_PROPS_SCALE:-0.5}
"$BUILD/props/props_suite" --gtest_brief=1 &
suite=$!
"$BUILD/props/props_fixtures" --gtest_brief=1 &
fixtures=$!
wait "$suite"
wait "$fixtures"
# gcov runs once, into a tracefile; every report below reads that.
gcovr --root . --filter 'optimized/src/' --filter 'reference/' --exclude-throw-branches \
  --exclude-unreachable-branches --json "$BUILD/coverage.json" "$BUILD"
report() { gcovr --root . --add-tracefile "$BUILD/coverage.json" "$@"; }
echo "::: coverage of optimized/src and reference/ by the property suite: lines"
report --txt
echo "::: branches"
report --txt --branches
echo "::: optimized/src"
report --filter 'optimized/src/' --print-summary --txt /dev/null
mkdir -p "$BUILD/html"
report --html-details "$BUILD/html/index.html"
echo "::: HTML report: $BUILD/html/index.html"
