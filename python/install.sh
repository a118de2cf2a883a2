#!/usr/bin/env bash
# Installs tandem into a virtual environment for its Python tests.
#
#   usage: python/install.sh VENV BUILD_DIR [REQUIREMENTS]
#
# Creates VENV with `${PYTHON:-python3} -m venv` when it has no interpreter,
# installs REQUIREMENTS (python/requirements-test.txt by default; CI's
# minimum-versions step gives python/requirements-min.txt) from PyPI when that
# file changed since the last install into VENV (a copy of it in VENV is the
# stamp; torch's Linux wheel and its CUDA libraries: about 2.9 GB to
# download, 5.6 GB installed; pip's cache keeps the downloads), then builds
# and installs the package with scikit-build-core, reusing BUILD_DIR so a
# rebuild compiles only what changed. Fails loudly without Python or network.
set -euo pipefail
venv=$1
build_dir=$2
src=$(cd "$(dirname "$0")/.." && pwd)
requirements=${3:-$src/python/requirements-test.txt}
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  echo "tandem: creating $venv with $python -m venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
stamp=$venv/.tandem-$(basename "$requirements")
if ! cmp -s "$requirements" "$stamp"; then
  echo "tandem: installing the test requirements into $venv (first time: several GB from PyPI)"
  t0=$SECONDS
  "${pip[@]}" install -q -r "$requirements"
  cp "$requirements" "$stamp"
  echo "tandem: requirements installed in $((SECONDS - t0)) s"
fi
t0=$SECONDS
"${pip[@]}" install -q --no-build-isolation --no-deps --force-reinstall \
  -C "build-dir=$build_dir" -C cmake.build-type=Release "$src"
echo "tandem: package built and installed in $((SECONDS - t0)) s"
"$venv/bin/python" -c "import tandem; print('tandem', tandem.__version__, 'from', tandem.__file__)"
