#!/usr/bin/env bash
# The Python tests against the minimum versions that pyproject.toml declares
# (python/requirements-min.txt): installs them into VENV (.venv-min/ by
# default; once, until the file changes: torch 2.4's wheel and CUDA libraries
# are about 2.5 GB from PyPI, kept by pip's cache), builds the package there
# with nanobind and scikit-build-core at their minimums (in BUILD_DIR, reused
# incrementally) and runs python/tests. CI's "python at minimum versions".
#
#   usage: python/test-min.sh [VENV] [BUILD_DIR]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$src/.venv-min}
build_dir=${2:-$src/build-py-min}
"$src/python/install.sh" "$venv" "$build_dir" "$src/python/requirements-min.txt"
"$venv/bin/python" -c "import numpy, torch, transformers, hypothesis
print('versions: numpy', numpy.__version__, '| torch', torch.__version__,
      '| transformers', transformers.__version__, '| hypothesis', hypothesis.__version__)"
cd "$build_dir"
"$venv/bin/python" -m pytest -q -p no:cacheprovider -rs "$src/python/tests"
