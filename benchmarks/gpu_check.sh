#!/usr/bin/env bash
# The GPU check of issue 19, one call: install, encoder fidelity tests, the inference benchmark (engine vs
# sentence-transformers in the same precision, comparable batch size), a nightly run, one Ray run.
#
#   bash benchmarks/gpu_check.sh prepare          # here: .gpu/ (git-ignored): model files with fp16 weights (45 MB,
#                                                 #   fits the 64 MiB carry) and 2,000 demo texts (cycled on the host)
#   bash benchmarks/gpu_check.sh run              # on the GPU host (carry .gpu): every step at full size
#   bash benchmarks/gpu_check.sh run --dry-run    # here, on the CPU: every step with tiny sizes
#
# Every step's log and numbers go to one folder: $OUT when set (the device tool's), else
# bench-results/gpu-check-<date>/ (git-ignored): summary.md (each step's status, seconds and key figures),
# <step>.log for the five steps and inference.json -- 7 files, within the device tool's 8 that come back.
# A failed step is recorded and the next one still runs; the exit status is the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-run}"
dry=0
[[ "${2:-}" == "--dry-run" || "${1:-}" == "--dry-run" ]] && dry=1 && mode=run
# The project's venv where there is one; the GPU host's own python3 otherwise (it holds torch; nothing can be
# fetched there, so missing packages must be carried as wheels -- see the device README).
if [[ -z "${PY:-}" ]]; then [[ -x .venv/bin/python ]] && PY=.venv/bin/python || PY=python3; fi

if [[ "$mode" == "prepare" ]]; then
  set -e
  "$PY" - <<'PY'
import shutil
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
from models.encoder.files import model_dir
from data_contracts.inputs import item_text_expr
from nightscore.demo import generate_items
src, dst = model_dir(), Path(".gpu/model")
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "*.md"))
weights = {k: v.to(torch.float16).contiguous() for k, v in load_file(src / "model.safetensors").items()}
save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
generate_items(2000, seed=0).select(item_text_expr()).write_parquet(".gpu/texts.parquet")
print("prepared", sum(f.stat().st_size for f in Path(".gpu").rglob("*") if f.is_file()) // 2**20, "MiB in .gpu/")
PY
  exit 0
fi
[[ "$mode" == "run" ]] || { echo "usage: $0 prepare | run [--dry-run]" >&2; exit 2; }

out="${OUT:-bench-results/gpu-check-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
if (( dry )); then
  device=cpu; bench_n=200; warmup=200; repeats=1; nightly_items=300; nightly_users=60; ray_items=200
  st_batches="16,32,64"; budgets="512,2048"; model_args=()
else
  device=cuda; bench_n=50000; warmup=5000; repeats=3; nightly_items=100000; nightly_users=20000; ray_items=2000
  st_batches="32,64,128,256,512,1024"; budgets=""; model_args=(--model-dir .gpu/model --texts .gpu/texts.parquet)
fi
export NIGHTSCORE_DEVICE="$device"
# This check times stages and compares outputs; candidate quality is measured (and gated) by the candidate benchmarks,
# and small inputs measure it too noisily to gate a run on it.
export NIGHTSCORE_CANDIDATE_GATE_RECALL_MARGIN=-1
failed=0
summary="$out/summary.md"
{ echo "# GPU check $(date -u +%Y-%m-%dT%H:%M:%SZ) ($([[ $dry == 1 ]] && echo 'dry run on the CPU, tiny sizes' || echo 'full run'))"
  echo; echo "device: $device; $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || lscpu | grep 'Model name' | sed 's/  */ /g')"
  echo; echo "| step | status | seconds | figures |"; echo "| --- | --- | --- | --- |"; } > "$summary"

step() {  # step NAME FIGURES-COMMAND -- COMMAND...: run COMMAND into NAME.log, then record its status and figures
  local name="$1" figures="$2"; shift 3
  local started=$SECONDS rc
  echo "== $name: $*"
  "$@" > "$out/$name.log" 2>&1; rc=$?
  local took=$((SECONDS - started)) got=""
  [[ -n "$figures" ]] && got="$(eval "$figures" 2>/dev/null | tr '\n' ' ' | cut -c1-400)"
  if (( rc == 0 )); then echo "| $name | ok | $took | $got |" >> "$summary"
  else failed=$((failed + 1)); echo "| $name | FAILED (rc $rc) | $took | $(tail -n 3 "$out/$name.log" | tr '\n' ' ' | cut -c1-300) |" >> "$summary"; fi
  echo "   -> rc $rc in ${took}s"
}

# 1. install: the setup picks the CUDA build of torch==2.13.0 when nvidia-smi works. Dry run: check only.
if (( dry )); then
  step install "$PY -c 'import torch; print(\"torch\", torch.__version__, \"cuda\" if torch.cuda.is_available() else \"cpu\")'" -- \
    "$PY" -c "import torch, sys; v = torch.__version__; print('install skipped (dry run); torch', v); sys.exit(0 if v.startswith('2.13.0') else 1)"
else
  step install "$PY -c 'import torch; print(\"torch\", torch.__version__, torch.cuda.get_device_name())'" -- bash scripts/bootstrap.sh
fi

# 2. encoder tests on the device: every precision against fp32 on the same device and against CPU fp32.
step encoder_tests "grep -E '[0-9]+ (passed|failed)' '$out/encoder_tests.log' | tail -1" -- \
  "$PY" -m pytest -q -p no:cacheprovider -W ignore -rs tests/model/test_device_fidelity.py

# 3. the inference benchmark: engine (auto) vs sentence-transformers in the same precision, its batch size raised
#    until it stops getting faster; naive; the no-padding whole-text ceiling; achieved FLOP/s vs the dense GEMM yardstick.
# One engine cache for steps 3-5: the benchmark calibrates `auto` (and searches int8 where it can win) once, and the
# nightly and Ray runs read its choice, as a second run on the same kind of machine would.
export NIGHTSCORE_ENGINE_CACHE_DIR="$out/engine-cache"
bench_args=(--device "$device" --n "$bench_n" --warmup "$warmup" --cache-dir "$NIGHTSCORE_ENGINE_CACHE_DIR" --repeats "$repeats" --st-batch-sizes "$st_batches"
            --modes naive,sentence_transformers,st_torch_bf16,engine,ceiling --json "$out/inference.json" "${model_args[@]}")
[[ -n "$budgets" ]] && bench_args+=(--calibration-budgets "$budgets")
step inference "grep -E '^(engine\\(auto\\)|dense|auto chose)' '$out/inference.log'" -- "$PY" benchmarks/inference.py "${bench_args[@]}"

# 4. a nightly run on demo items on the device: wall time by stage, device-hours per 1M items.
step nightly "grep -E '^nightly:' '$out/nightly.log'" -- \
  "$PY" benchmarks/gpu_steps.py nightly --items "$nightly_items" --users "$nightly_users" --work "$out/nightly-work"

# 5. one Ray run (a GPU actor, num_gpus=1, where the cluster has a GPU) on a small input, outputs equal to local.
step ray "grep -E '^ray check' '$out/ray.log'" -- \
  "$PY" benchmarks/gpu_steps.py ray --items "$ray_items" --work "$out/ray-work"

rm -rf "$out/nightly-work" "$out/ray-work" "$out/engine-cache"  # homes, lakes, models: only logs and figures come back
echo; cat "$summary"
exit "$failed"
