#!/usr/bin/env bash
# Creates .venv-peers/ (ignored by git) with the peer libraries that the
# performance report compares tandem against, all from PyPI. Each package is
# installed on its own so that one that has no wheel for this machine does not
# stop the others; the report names whatever is missing.
#
#   usage: bench/peers/setup.sh [VENV_DIR]        (default: .venv-peers)
#   env:   PEERS=torch,openvino,onnxruntime,jax,ggml  to choose the set (commas or spaces)
set -uo pipefail
cd "$(dirname "$0")/../.."
venv="${1:-.venv-peers}"
peers="${PEERS:-torch openvino onnxruntime jax ggml}"
peers="${peers//,/ }"
if [ "$peers" = none ]; then
  echo "peers: PEERS=none, nothing to install"
  exit 0
fi
# ONNX Runtime's peer builds its model with the onnx package.
case " $peers " in *" onnxruntime "*) case " $peers " in *" onnx "*) ;; *) peers="$peers onnx" ;; esac ;; esac
python="${PYTHON:-/usr/bin/python3}"
stamp="$venv/.tandem-peers"  # the set installed last time: nothing to do when it has not changed

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$peers" ]; then
  echo "peers: $venv has $peers (delete $stamp to install again)"
  exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "peers: creating $venv with $python -m venv"
  if ! "$python" -m venv "$venv"; then
    echo "peers: '$python -m venv' failed; install Debian's python3-venv (apt-get install python3-venv)" >&2
    exit 1
  fi
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade pip || true
"${pip[@]}" install -q numpy || { echo "peers: numpy failed to install" >&2; exit 1; }

failed=()
for p in $peers; do
  pkg="$p"
  case "$p" in
    torch) echo "peers: pip install torch (its Linux wheel brings CUDA libraries: several GiB, minutes to download)" ;;
    # ggml's Python bindings (PyPI has no wheel: pip builds ggml from source with cmake, a few minutes)
    ggml) pkg="ggml-python==0.0.45"; echo "peers: pip install $pkg (builds ggml from source)" ;;
    *) echo "peers: pip install $p" ;;
  esac
  if "${pip[@]}" install -q "$pkg"; then
    echo "peers: $p installed"
  else
    echo "peers: $p could not be installed; the report will name it as missing" >&2
    failed+=("$p")
  fi
done
"$venv/bin/python" bench/peers/peers.py --list || true
echo "$peers" > "$stamp"
if [ ${#failed[@]} -gt 0 ]; then
  echo "peers: not installed: ${failed[*]}" >&2
fi
exit 0
