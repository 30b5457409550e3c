#!/usr/bin/env bash
# Create .venv (if needed) with the CPU or CUDA build of torch==2.13.0 chosen deliberately,
# then install nightscore and its pinned dependencies. Idempotent: a second call is a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${NIGHTSCORE_VENV:-.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.nightscore-installed"
if [[ -f "$STAMP" && "$STAMP" -nt pyproject.toml && "$STAMP" -nt requirements.lock ]]; then
  exit 0
fi
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "bootstrap: CUDA device found -> torch==2.13.0 (CUDA build from PyPI)"
  "${PIP[@]}" install "torch==2.13.0"
else
  echo "bootstrap: no CUDA device -> torch==2.13.0 CPU build"
  # A local CPU wheel (pip find-links) is preferred; otherwise PyTorch's CPU index. Never PyPI's
  # plain torch wheel on Linux, which is the multi-GB CUDA build.
  "${PIP[@]}" install --no-deps --no-index "torch==2.13.0+cpu" 2>/dev/null \
    || "${PIP[@]}" install --no-deps "torch==2.13.0+cpu" --index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
fi
"${PIP[@]}" install -c requirements.lock -e ".[dev]"
"$VENV/bin/python" -c "import torch; print('bootstrap: torch', torch.__version__, 'cuda' if torch.cuda.is_available() else 'cpu')"
# The UI test drives Debian's Chromium headless; install it where we may (root with apt), else that test skips.
if ! command -v chromium >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
  echo "bootstrap: installing Debian's chromium for the UI test"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; } \
    || echo "bootstrap: could not install chromium; the UI test will skip"
fi
# The ranker's load benchmark finds saturation with wrk (a C load generator); without it that benchmark says so.
if ! command -v wrk >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q wrk >/dev/null 2>&1 || echo "bootstrap: could not install wrk"
fi
touch "$STAMP"
