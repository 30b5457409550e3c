#!/usr/bin/env bash
# The benchmark's own environment for sentence-transformers' onnx / openvino backends.
#
# They need optimum (optimum-onnx, optimum-intel), whose releases want an older transformers than the
# project's pins (transformers 5.24): they would not load beside it. This script builds a separate venv
# (default build/st-venv, git-ignored) with torch==2.13.0 CPU installed first from the local wheel and then
# held by a constraint, so pip can move transformers but never torch. Idempotent: a second call is a no-op.
#
#   bash benchmarks/st_env.sh            # prints the venv's python path on its last line
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ST_VENV:-build/st-venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.st-installed"
if [[ ! -f "$STAMP" ]]; then
  [[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
  "${PIP[@]}" install --no-deps --no-index "torch==2.13.0+cpu" 2>/dev/null \
    || "${PIP[@]}" install --no-deps "torch==2.13.0+cpu" --index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
  hold="$(mktemp)"
  trap 'rm -f "$hold"' EXIT
  echo "torch==2.13.0+cpu" > "$hold"
  # torch's own dependencies (it went in with --no-deps), then optimum's backends beside sentence-transformers.
  "${PIP[@]}" install -c "$hold" "torch==2.13.0+cpu" "sentence-transformers[onnx,openvino]" \
    "optimum-onnx[onnxruntime]" "optimum-intel[openvino]" pyarrow polars
  "$VENV/bin/python" -c "import torch; assert torch.__version__ == '2.13.0+cpu', torch.__version__"
  touch "$STAMP"
fi
"$VENV/bin/python" -c "import torch, transformers, sentence_transformers, optimum; print('st-env: torch', torch.__version__, 'transformers', transformers.__version__, 'sentence-transformers', sentence_transformers.__version__)" >&2
echo "$VENV/bin/python"
