#!/usr/bin/env bash
# The GPU check (issue 35), made to fit a lent GPU host: one call, within its 64 MiB, about 6 minutes; docs/gpu.md.
#
#   bash benchmarks/gpu_check.sh prepare          # here: .gpu/ (git-ignored): the model with fp16 weights (45 MB),
#                                                 #   100k demo texts and the cp312 wheels the host lacks (pydantic &
#                                                 #   co., 3 MB); prints the sizes, fails when over 64 MiB with the tree
#   bash benchmarks/gpu_check.sh run              # on the GPU host (carry .gpu): its own python3 and torch, nothing
#                                                 #   installed; the wheels unzipped into a folder on PYTHONPATH
#   bash benchmarks/gpu_check.sh run --dry-run    # here, on the CPU: every step with tiny sizes
#
# Steps: env (python, torch >= 2.11, device, CPU flags), encoder_tests (every precision and the packed path on the
# device against CPU fp32), inference (benchmarks/inference.py: sentence-transformers' best of 3 batch sizes, the
# engine's modes, auto, pre-tokenized, the host-side row, the breakdown), nightly (the nightly flow where its packages
# are there, else says why; then its encode stage alone on 100k texts), compile (CUDA only, when time is left: the
# torch.compile switches timed). Everything goes to one folder: $OUT when set (the device tool's), else
# bench-results/gpu-check-<date>/ (git-ignored): summary.md, <step>.log per step, inference.json -- at most 7 files.
# A failed step is recorded and the next one still runs; the exit status is the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-run}"
dry=0
[[ "${2:-}" == "--dry-run" || "${1:-}" == "--dry-run" ]] && dry=1 && mode=run
# The project's venv where there is one (here); the GPU host's own python3 otherwise (.venv does not travel).
if [[ -z "${PY:-}" ]]; then [[ -x .venv/bin/python ]] && PY=.venv/bin/python || PY=python3; fi

if [[ "$mode" == "prepare" ]]; then
  exec "$PY" benchmarks/gpu_steps.py prepare --out .gpu --items "${GPU_TEXTS:-100000}"
fi
[[ "$mode" == "run" ]] || { echo "usage: $0 prepare | run [--dry-run]" >&2; exit 2; }

out="${OUT:-bench-results/gpu-check-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-XXXXXX")"  # homes, lakes, engine cache: only logs and figures come back
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 PREFECT_SERVER_ANALYTICS_ENABLED=false TOKENIZERS_PARALLELISM=true
budget_s="${GPU_CHECK_SECONDS:-360}"  # the whole check; the optional compile step runs only with 120 s of it left
if (( dry )); then
  device=cpu; bench_n=200; warmup=200; repeats=1; nightly_items=300; nightly_users=60
  st_batches="16,32,64"; budgets="512,2048"; model_args=(); texts_args=()
  # fp32 walks the same code on the CPU; the half precisions and OpenVINO's int8 search (minutes here) are left to
  # the device and to the model tier
  test_filter=(-k "not bf16 and not fp16 and not openvino")
else
  device=cuda; bench_n=50000; warmup=5000; repeats=2; nightly_items=100000; nightly_users=20000
  st_batches="256,512,1024"; budgets=""; model_args=(--model-dir .gpu/model --texts .gpu/texts.parquet)
  texts_args=(--texts .gpu/texts.parquet); test_filter=()
  export NIGHTSCORE_MODEL="$PWD/.gpu/model"
  if [[ -d .gpu/wheels ]]; then  # what the host lacks (pydantic & co.): unzipped beside the project, not installed
    site="$("$PY" benchmarks/gpu_steps.py unpack --wheels .gpu/wheels --site "$work/site")" || exit 1
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  fi
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
  [[ -n "$figures" ]] && got="$(eval "$figures" 2>/dev/null | tr '\n' ' ' | cut -c1-600)"
  if (( rc == 0 )); then echo "| $name | ok | $took | $got |" >> "$summary"
  else failed=$((failed + 1)); echo "| $name | FAILED (rc $rc) | $took | $(tail -n 3 "$out/$name.log" | tr '\n' ' ' | cut -c1-300) |" >> "$summary"; fi
  echo "   -> rc $rc in ${took}s"
}

# 1. the host as found: python, torch (>= 2.11), the device, the CPU's model and flags. Nothing is installed.
step env "cat '$out/env.log'" -- "$PY" benchmarks/gpu_steps.py env

# 2. encoder tests on the device: every precision against fp32 on the device and CPU fp32; packed equal to padded.
step encoder_tests "grep -E '[0-9]+ (passed|failed)' '$out/encoder_tests.log' | tail -1" -- \
  "$PY" -m pytest -q -p no:cacheprovider -W ignore -rs -s tests/model/test_device_fidelity.py tests/model/test_packed_fidelity.py "${test_filter[@]}"

# 3. the inference benchmark: sentence-transformers at its best of three batch sizes (searched on 10k texts), every
#    torch mode padded and packed, auto, the device side on pre-tokenized texts, the host side with a no-op model,
#    the whole-text ceiling, the breakdown of each engine row. One engine cache for steps 3-5: the benchmark
#    calibrates `auto`, the encode stage reads its choice, as a second run on the same kind of machine would.
export NIGHTSCORE_ENGINE_CACHE_DIR="$work/engine-cache"
bench_args=(--device "$device" --n "$bench_n" --warmup "$warmup" --cache-dir "$NIGHTSCORE_ENGINE_CACHE_DIR" --repeats "$repeats"
            --st-batch-sizes "$st_batches" --modes sentence_transformers,st_torch_bf16,engine_modes,engine,pretokenized,host,ceiling
            --skip "engine[openvino/int8],engine[torch/int8],engine[torch-packed/int8]" --json "$out/inference.json" "${model_args[@]}")
[[ -n "$budgets" ]] && bench_args+=(--calibration-budgets "$budgets")
step inference "grep -E '^(engine |pretokenized|host |auto chose|dense|host side|cores to feed|peak GPU|engine\\(auto\\) / sentence)' '$out/inference.log'" -- \
  "$PY" benchmarks/inference.py "${bench_args[@]}"

# 4. the nightly on demo items on the device (stage times, device-seconds per 1M items) where its packages are here;
#    on the GPU host they are not (and do not fit the carry): it says so, then times the encode stage alone.
step nightly "grep -E '^(nightly|encode stage):' '$out/nightly.log'" -- \
  "$PY" benchmarks/gpu_steps.py nightly --items "$nightly_items" --users "$nightly_users" --work "$work/nightly" "${texts_args[@]}"

# 5. CUDA only, with time left: torch.compile's modes on the packed path (settings' compile_mode), timed beside eager.
if (( ! dry )) && (( SECONDS < budget_s - 120 )); then
  step compile "grep -E '^engine\\[torch-packed' '$out/compile.log'" -- \
    timeout $((budget_s - SECONDS - 10)) "$PY" benchmarks/inference.py --device cuda --n 20000 --warmup 20000 --repeats 2 \
    --cache-dir "$NIGHTSCORE_ENGINE_CACHE_DIR" --modes engine_modes --compile-modes default,reduce-overhead \
    --skip "engine[torch/bf16],engine[torch/fp16],engine[torch/fp32],engine[torch-packed/fp32]" "${model_args[@]}"
fi

echo; cat "$summary"
exit "$failed"
