"""sentence-transformers' onnx / openvino rows of the inference benchmark, run inside its own venv (st_env.sh).

Called by benchmarks/inference.py as a subprocess with the same texts and threads; imports nothing of
nightscore (its pins would not load here). With --serve it loads every row, prints one JSON line
{"ready": [...]} and then runs one timed pass per command read from stdin ("ROW N": encode the first N
texts, answer {"row", "seconds", "npy"}), so the caller interleaves these rows with its own passes in one
run. Without --serve it times --repeats passes of each row by itself and writes <out>/rows.json. Usage:

    build/st-venv/bin/python benchmarks/st_rows.py --model DIR --texts TEXTS.json --out DIR [--threads 2] \
        [--repeats 3] [--rows st_onnx,st_onnx_int8,st_openvino] [--batch-sizes 32] [--serve]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("st_rows")
ROWS = ("st_onnx", "st_onnx_int8", "st_openvino")


def load_row(row: str, model: Path, scratch: Path, threads: int) -> Any:  # a SentenceTransformer
    """Return the SentenceTransformer of one row: onnx, its dynamic-int8 export, or openvino (their defaults)."""
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    if row == "st_openvino":
        return SentenceTransformer(
            str(model),
            backend="openvino",
            device="cpu",
            model_kwargs={"ov_config": {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}},
        )
    onnx_dir = scratch / "onnx-model"
    if not (onnx_dir / "onnx" / "model.onnx").is_file():
        SentenceTransformer(str(model), backend="onnx", device="cpu").save_pretrained(str(onnx_dir))
    if row == "st_onnx":
        return SentenceTransformer(str(onnx_dir), backend="onnx", device="cpu")
    config = "avx512_vnni" if "avx512_vnni" in Path("/proc/cpuinfo").read_text() else "avx2"
    name = f"onnx/model_qint8_{config}.onnx"
    if not (onnx_dir / name).is_file():
        export_dynamic_quantized_onnx_model(
            SentenceTransformer(str(onnx_dir), backend="onnx", device="cpu"), config, str(onnx_dir)
        )
    return SentenceTransformer(str(onnx_dir), backend="onnx", device="cpu", model_kwargs={"file_name": name})


def time_row(model: Any, texts: list[str], batch_size: int, repeats: int) -> tuple[list[float], object]:
    """Return (pass seconds, embeddings of the last pass) after one warm-up on 64 texts."""
    model.encode(texts[:64], batch_size=batch_size, show_progress_bar=False)
    times, vectors = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        vectors = model.encode(
            texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        times.append(time.perf_counter() - started)
    return times, vectors


def main(argv: list[str] | None = None) -> int:
    """Run the rows asked for and write their results; return 0."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s st_rows %(message)s", stream=sys.stderr)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--texts", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--batch-sizes", default="32")
    p.add_argument("--serve", action="store_true", help="answer 'ROW N' commands on stdin, one timed pass each")
    args = p.parse_args(argv)
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    texts = json.loads(Path(args.texts).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, object]] = {}
    if args.serve:
        return serve(args, texts, out)
    with tempfile.TemporaryDirectory(prefix="st-rows-") as tmp:
        scratch = Path(tmp)
        model = scratch / "model"
        shutil.copytree(args.model, model)  # optimum writes exports beside the model: never into the source folder
        for row in args.rows.split(","):
            try:
                started = time.perf_counter()
                st = load_row(row, model, scratch, args.threads)
                load = time.perf_counter() - started
                best: tuple[float, list[float], int, object] | None = None
                for bs in (int(b) for b in args.batch_sizes.split(",")):
                    times, vectors = time_row(st, texts, bs, args.repeats)
                    if best is None or statistics.median(times) < best[0]:
                        best = (statistics.median(times), times, bs, vectors)
                assert best is not None
                np.save(out / f"{row}.npy", np.asarray(best[3], dtype=np.float32))
                results[row] = {"seconds": best[0], "passes": best[1], "batch_size": best[2], "load_seconds": load}
                log.info("%s: median %.2fs (batch %d)", row, best[0], best[2])
            except Exception as exc:  # noqa: BLE001 - a row that cannot run is reported, not fatal
                results[row] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                log.warning("%s failed: %s", row, exc)
    import optimum.version
    import sentence_transformers
    import transformers

    results["_versions"] = {
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "optimum": optimum.version.__version__,
        "torch": torch.__version__,
    }
    (out / "rows.json").write_text(json.dumps(results, indent=2))
    return 0


def serve(args: argparse.Namespace, texts: list[str], out: Path) -> int:
    """Load every row, then answer one timed pass per stdin command until EOF or 'quit'; return 0."""
    import numpy as np

    batch = int(args.batch_sizes.split(",")[0])
    models: dict[str, Any] = {}
    loaded: dict[str, float | str] = {}
    with tempfile.TemporaryDirectory(prefix="st-rows-") as tmp:
        scratch = Path(tmp)
        shutil.copytree(args.model, scratch / "model")
        for row in args.rows.split(","):
            started = time.perf_counter()
            try:
                models[row] = load_row(row, scratch / "model", scratch, args.threads)
                loaded[row] = round(time.perf_counter() - started, 2)
            except Exception as exc:  # noqa: BLE001 - reported to the caller, which notes it in the table
                loaded[row] = f"{type(exc).__name__}: {str(exc)[:200]}"
        import optimum.version
        import sentence_transformers
        import transformers

        versions = {
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "optimum": optimum.version.__version__,
        }
        print(json.dumps({"ready": list(models), "load": loaded, "versions": versions, "batch_size": batch}), flush=True)
        for line in sys.stdin:
            if line.strip() in ("", "quit"):
                break
            row, n = line.split()
            started = time.perf_counter()
            vectors = models[row].encode(
                texts[: int(n)], batch_size=batch, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
            )
            seconds = time.perf_counter() - started
            npy = out / f"{row}.npy"
            np.save(npy, np.asarray(vectors, dtype=np.float32))
            print(json.dumps({"row": row, "seconds": seconds, "npy": str(npy)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
