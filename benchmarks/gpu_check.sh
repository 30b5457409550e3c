#!/usr/bin/env bash
# GPU check of the inference engine: the side-by-side benchmark on CUDA (bf16) over >= 50k texts.
#
#   bash benchmarks/gpu_check.sh prepare    # here (needs the project venv): writes .gpu/ (git-ignored):
#                                           #   the model files with fp16 weights (45 MB, fits the 64 MiB carry)
#                                           #   and 2,000 demo texts (cycled to 50k on the device)
#   bash benchmarks/gpu_check.sh run [N]    # on the GPU host (carry .gpu): python3 with torch, transformers,
#                                           #   tokenizers, sentence-transformers and pyarrow; nothing downloaded
#
# Prints the table (texts/s, real tok/s, padding efficiency, achieved TFLOP/s and % of the dense bf16 GEMM
# rate measured on the same device) and the engine's ratios; writes $OUT/gpu_inference.json when OUT is set.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-run}"
if [[ "$mode" == "prepare" ]]; then
  .venv/bin/python - <<'PY'
import shutil
from pathlib import Path
import polars as pl
import torch
from safetensors.torch import load_file, save_file
from models.encoder import model_dir
from data_contracts.inputs import item_text_expr
from nightscore.demo_data import generate_items
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
n="${2:-50000}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader || true
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=true PYTHONUNBUFFERED=1
python3 benchmarks/inference.py --device cuda --n "$n" --repeats 2 --model-dir .gpu/model --texts .gpu/texts.parquet \
  --modes naive,sentence_transformers,engine,ceiling --precisions bf16,fp16,fp32 \
  ${OUT:+--json "$OUT/gpu_inference.json"}
