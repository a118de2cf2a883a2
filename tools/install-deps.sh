#!/usr/bin/env bash
# Installs the Debian 12 packages tandem builds, tests and documents with.
# As root it runs apt-get; otherwise it names the packages to install.
set -euo pipefail

packages=(
  cmake g++ make pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev librapidcheck-dev
  libhwy-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev
  clang libclang-rt-14-dev libomp-14-dev gcovr
  doxygen graphviz libjs-mathjax
  python3-numpy python3-matplotlib python3-venv python3-dev
  ccache  # .ci/run: the Python package's builds reuse the main build's objects
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "tandem: all build dependencies are installed"
  exit 0
fi

echo "tandem: installing ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "tandem: not root; install them with:" >&2
  echo "  sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
