# tandem's two commands: `make report` (the main job) and `make test`.
# Both set up a fresh Debian 12 machine first (apt-get as root).
BUILD ?= build
JOBS  ?= $(shell nproc)
CMAKE_FLAGS ?=
## The virtual environment in which CTest installs the Python package and runs its tests.
PYTHON_VENV ?= $(CURDIR)/.venv

.PHONY: all deps configure build test coverage mutate tsan report report-quick peers docs clean

all: build

deps:
	@tools/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DTANDEM_PYTHON_VENV=$(PYTHON_VENV) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

## Install, configure, build and run every test (the Python tests too: CTest's
## python_install creates $(PYTHON_VENV) from PyPI the first time, label python).
test: build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

## Line and branch coverage of optimized/src and reference/ by the property
## suite alone (gcov build in build-coverage/, gcovr; HTML in build-coverage/html/).
coverage: deps
	BUILD=build-coverage JOBS=$(JOBS) .ci/coverage.sh

## Testing the tests: each bug of props/mutate.py planted in the optimized
## kernels in turn must be rejected by the property suite (build-mutate/).
## Options: MUTATE_FLAGS='--only name,name --fail-fast --all-targets' (props/mutate.py -h)
mutate: deps
	/usr/bin/python3 props/mutate.py --jobs $(JOBS) $(MUTATE_FLAGS)

## ThreadSanitizer (clang, libomp): the reentrancy test and the property suite.
tsan: deps
	BUILD=build-tsan JOBS=$(JOBS) .ci/tsan.sh

## The performance comparison report: report/report.md (+ report.html, plots).
## Options: OPS=a,b SEQS=1024,2048 DIMS=64,128 THREADS=N SCALING_THREADS=1,2
##          PEERS=torch,openvino,onnxruntime,jax,ggml|none REPORT_FLAGS='...' (see bench/report/report.py -h)
REPORT_OUT ?= report
REPORT_OPTS = --build $(BUILD) --out $(REPORT_OUT) \
  $(if $(OPS),--ops $(OPS)) $(if $(SEQS),--seqs $(SEQS)) $(if $(DIMS),--dims $(DIMS)) \
  $(if $(THREADS),--threads $(THREADS)) $(if $(SCALING_THREADS),--scaling-threads $(SCALING_THREADS)) \
  $(if $(PEERS),--peers $(PEERS)) $(REPORT_FLAGS)

report: configure peers
	cmake --build $(BUILD) -j$(JOBS) --target tandem_report_programs
	@# the tandem package of this checkout in $(PYTHON_VENV) (as `make test` installs it), which
	@# the report times beside each peer in the peer's process; without it the peers are unpaired
	-python/install.sh $(PYTHON_VENV) $(BUILD)/python/wheel-build
	/usr/bin/python3 bench/report/report.py --preset standard $(REPORT_OPTS)

## The quick preset (about 2 minutes after the build); CI runs it so the report cannot rot.
report-quick: configure
	cmake --build $(BUILD) -j$(JOBS) --target tandem_report_programs
	/usr/bin/python3 bench/report/report.py --preset quick --strict $(REPORT_OPTS)

## The peer libraries the report compares against, in .venv-peers/ (from PyPI;
## `make report` runs it first, a no-op once installed; PEERS=none skips it).
peers:
	bench/peers/setup.sh .venv-peers

docs: configure
	cmake --build $(BUILD) --target docs

clean:
	rm -rf $(BUILD)
