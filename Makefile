# tandem's two commands: `make report` (the main job) and `make test`.
# Both set up a fresh Debian 12 machine first (apt-get as root).
BUILD ?= build
JOBS  ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test report docs clean

all: build

deps:
	@tools/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

## Install, configure, build and run every test.
test: build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

docs: configure
	cmake --build $(BUILD) --target docs

clean:
	rm -rf $(BUILD)
