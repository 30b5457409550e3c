"""Inference benchmark: nightscore's engine side by side with what a user would pick instead.

One run, same texts, same threads. Prints one table (texts/s, real tokens/s, padding efficiency,
achieved GFLOP/s and its share of the machine's dense matmul rate) and the ratios the issue asks for,
then per-precision fidelity. Usage:

    python benchmarks/inference.py [--texts PATH] [--n 2000] [--json OUT] [--repeats 2] [--modes ...]

PATH is a Parquet file with a `text` column; by default the demo items (title + "\\n" + body).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.encoder import EncoderSpec, TextEncoder, configure_threads, model_dir, resolve_device  # noqa: E402
from models.engine import encode_texts  # noqa: E402
from models.precision import FIDELITY_FLOOR, fidelity, quantize_int8  # noqa: E402

log = logging.getLogger("bench")
ALL_MODES = ["naive", "sentence_transformers", "ray_data", "engine", "ceiling"]


@dataclass
class Result:
    """One mode's best timed pass."""

    seconds: float
    texts: int
    real_tokens: int
    padded_tokens: int
    embeddings: np.ndarray | None = None
    note: str = ""
    extra: dict[str, float] = field(default_factory=dict)


def load_texts(path: str | None, n: int) -> list[str]:
    """Return n texts from a Parquet `text` column (cycled if short), or from the demo items."""
    if path:
        import pyarrow.parquet as pq  # not polars: GPU hosts may lack it

        texts = [t for t in pq.read_table(path, columns=["text"]).column("text").to_pylist() if t]
    else:
        from data_contracts.inputs import item_text_expr
        from nightscore.demo_data import generate_items

        texts = generate_items(max(n, 2000), seed=0).select(item_text_expr()).get_column("text").to_list()
    return [texts[i % len(texts)] for i in range(n)]


def flops_per_text(lengths: np.ndarray, layers: int = 6, d: int = 384, ff: int = 1536) -> np.ndarray:
    """Return the useful forward FLOPs of each text: dense layers per token + attention (QK^T, AV) per token pair."""
    dense = 2 * (4 * d * d + 2 * d * ff) * layers * lengths
    attention = 4 * d * layers * lengths.astype(np.float64) ** 2
    return dense + attention


def matmul_gflops(device: torch.device, n: int = 2048, dtype: torch.dtype = torch.float32, repeats: int = 10) -> float:
    """Return the dense matmul rate (GFLOP/s) of n x n matrices on device."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.mm(a, b)
    _sync(device)
    started = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    _sync(device)
    return 2 * n**3 * repeats / (time.perf_counter() - started) / 1e9


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_batches(encoder: TextEncoder, ids: list[list[int]], batches: list[np.ndarray]) -> Result:
    """Return the result of encoding pre-tokenized rows batch by batch (padding to each batch's longest)."""
    out = np.empty((len(ids), encoder.dim), dtype=np.float32)
    padded = 0
    _sync(encoder.device)
    started = time.perf_counter()
    for rows in batches:
        out[rows] = encoder.embed(*encoder.collate([ids[i] for i in rows]))
        padded += len(rows) * max(len(ids[i]) for i in rows)
    _sync(encoder.device)
    real = sum(len(x) for x in ids)
    return Result(time.perf_counter() - started, len(ids), real, padded, out)


def run_naive(encoder: TextEncoder, texts: list[str]) -> Result:
    """HF model, batch 32 in input order, padded to each batch's longest."""
    ids, _ = encoder.tokenize(texts)
    started = time.perf_counter()
    result = timed_batches(encoder, ids, [np.arange(i, min(i + 32, len(ids))) for i in range(0, len(ids), 32)])
    result.seconds = time.perf_counter() - started  # tokenization counts too
    return result


def run_engine(encoder: TextEncoder, texts: list[str]) -> Result:
    """nightscore's engine with its defaults (global length plan, token budget)."""
    vectors, stats = encode_texts(encoder, texts)
    return Result(stats.seconds, stats.texts, stats.real_tokens, stats.padded_tokens, vectors, extra={"batches": stats.batches})


def run_ceiling(encoder: TextEncoder, texts: list[str]) -> Result:
    """The same model on fully packed 32 x 64 shapes built from the corpus tokens: no padding at all."""
    ids, _ = encoder.tokenize(texts)
    stream = [t for row in ids for t in row]
    rows = [stream[i : i + 64] for i in range(0, len(stream) - 63, 64)]
    batches = [np.arange(i, min(i + 32, len(rows))) for i in range(0, len(rows), 32)]
    result = timed_batches(encoder, rows, batches)
    result.texts = len(texts)  # about the corpus's token volume, reported per corpus text
    result.embeddings = None
    result.extra["flops"] = float(flops_per_text(np.full(len(rows), 64)).sum())
    result.extra["tokens_scale"] = result.real_tokens
    return result


def make_sentence_transformers(encoder: TextEncoder) -> Callable[[list[str]], Result]:
    """Return a runner of SentenceTransformer.encode(batch_size=32) on the same model files."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir(encoder.model_path)), device=str(encoder.device))

    def run(texts: list[str]) -> Result:
        ids, _ = encoder.tokenize(texts)
        lengths = np.array([len(x) for x in ids])
        order = np.argsort([-len(t) for t in texts], kind="stable")  # ST sorts by character length
        padded = sum(len(b) * int(lengths[b].max()) for b in np.array_split(order, range(32, len(order), 32)))
        _sync(encoder.device)
        started = time.perf_counter()
        vectors = model.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True,
                               show_progress_bar=False)
        _sync(encoder.device)
        return Result(time.perf_counter() - started, len(texts), int(lengths.sum()), padded, vectors.astype(np.float32))

    return run


def make_ray_data(threads: int) -> tuple[Callable[[list[str]], Result], float] | None:
    """Return (runner, Ray start-up seconds) of the standard Ray Data pattern, or None without Ray.

    map_batches with a callable class that loads the HF model once, batch 32 in input order, one
    actor. Timing starts when the first batch comes out (steady state: actor and model loaded).
    """
    try:
        import ray
    except ImportError:
        return None
    started = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    startup = time.perf_counter() - started
    path = str(model_dir())

    class Embedder:
        def __init__(self) -> None:
            from transformers import AutoModel, AutoTokenizer

            torch.set_num_threads(threads)  # Ray sets 1 thread in workers; give it the same as everyone
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModel.from_pretrained(path).eval()

        def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            enc = self.tokenizer(list(batch["text"]), padding=True, truncation=True, max_length=256, return_tensors="pt")
            with torch.inference_mode():
                hidden = self.model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).float()
                pooled = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1)
            return {"embedding": pooled.numpy(), "tokens": enc["attention_mask"].sum(1).numpy(),
                    "padded": np.full(len(pooled), enc["attention_mask"].shape[1])}

    def run(texts: list[str]) -> Result:
        ds = ray.data.from_items([{"text": t} for t in texts]).map_batches(
            Embedder, batch_size=32, concurrency=1, batch_format="numpy")
        first_at, count, real, padded, vectors = None, 0, 0, 0, []
        for batch in ds.iter_batches(batch_size=32, batch_format="numpy"):
            if first_at is None:
                first_at = time.perf_counter()
                continue
            count, real, padded = count + len(batch["tokens"]), real + int(batch["tokens"].sum()), padded + int(batch["padded"].sum())
            vectors.append(batch["embedding"])
        return Result(time.perf_counter() - first_at, count, real, padded, None)

    return run, startup


def int8_encoder(reference: TextEncoder) -> TextEncoder:
    """Return an int8 (dynamically quantized) twin of an fp32 encoder, without the fidelity guard."""
    twin = TextEncoder(reference.model, reference.tokenizer, EncoderSpec(), reference.version + "+int8")
    twin.model = quantize_int8(reference.model)
    return twin


def autocast_encoder(reference: TextEncoder, precision: str) -> TextEncoder:
    """Return a twin of an encoder that computes under autocast at the given precision."""
    spec = EncoderSpec(device=str(reference.device), precision=precision)
    return TextEncoder(reference.model, reference.tokenizer, spec, f"{reference.version}+{precision}")


def top10_overlap(reference: np.ndarray, candidate: np.ndarray, users: int = 200, seed: int = 0) -> float:
    """Return the mean top-10 neighbour overlap between two embeddings of the corpus for sampled users.

    A user is the normalised mean of 5 random texts; neighbours are the other texts by cosine.
    """
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(reference), size=(users, 5))
    overlaps = []
    for emb in (reference, candidate):
        u = emb[picks].mean(1)
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        overlaps.append(np.argsort(-(u @ emb.T), axis=1)[:, :10])
    return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(*overlaps, strict=True)]))


def render(results: dict[str, Result], corpus_flops: float, corpus_tokens: int, mm: float) -> str:
    """Return the side-by-side table of every mode."""
    lines = ["useful FLOPs of real tokens only (padding is waste); % of the dense matmul yardstick above", f"{'mode':<24}{'texts/s':>10}{'real tok/s':>12}{'pad eff':>9}{'GFLOP/s':>9}{'% of mm':>9}  note",
             "-" * 84]
    for mode, r in results.items():
        if r.seconds <= 0:
            lines.append(f"{mode:<24}{'-':>10}{'-':>12}{'-':>9}{'-':>9}{'-':>9}  {r.note}")
            continue
        flops = r.extra.get("flops", corpus_flops * r.real_tokens / corpus_tokens)
        gflops = flops / r.seconds / 1e9
        lines.append(f"{mode:<24}{r.texts / r.seconds:>10.1f}{r.real_tokens / r.seconds:>12.0f}"
                     f"{r.real_tokens / max(r.padded_tokens, 1):>9.3f}{gflops:>9.1f}{100 * gflops / mm:>8.1f}%  {r.note}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", help="Parquet file with a `text` column (default: demo items)")
    parser.add_argument("--n", type=int, default=2000, help="number of texts")
    parser.add_argument("--json", help="write {mode: {texts_per_s, real_tok_per_s, padding_eff}} here")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes per mode (best is kept)")
    parser.add_argument("--modes", default=",".join(ALL_MODES), help="comma-separated subset of " + ",".join(ALL_MODES))
    parser.add_argument("--precisions", default=None, help="engine precisions (default: fp32,int8 on CPU; bf16,fp16,fp32 on CUDA)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--model-dir", default=None, help="a copy of the model files (default: the installed package)")
    return parser.parse_args(argv)


def build_runners(args: argparse.Namespace, encoder: TextEncoder, threads: int) -> tuple[dict[str, Callable[[list[str]], Result]], dict[str, TextEncoder], dict[str, str]]:
    """Return (mode -> runner, precision -> encoder, mode -> note) for the modes asked for."""
    modes, notes = args.modes.split(","), {}
    runners: dict[str, Callable[[list[str]], Result]] = {}
    if "naive" in modes:
        runners["naive"] = lambda t: run_naive(encoder, t)
    if "sentence_transformers" in modes:
        runners["sentence_transformers"] = make_sentence_transformers(encoder)
    if "ray_data" in modes:
        ray = make_ray_data(threads)
        if ray is None:
            notes["ray_data"] = "skipped: ray not installed (pip install 'ray[data]==2.60.0')"
        else:
            runners["ray_data"], startup = ray
            notes["ray_data"] = f"steady state; Ray start-up {startup:.1f}s apart"
    precisions = (args.precisions or ("bf16,fp16,fp32" if encoder.device.type == "cuda" else "fp32,int8")).split(",")
    encoders = {"fp32": encoder}
    for p in precisions:
        if p == "int8":
            encoders[p] = int8_encoder(encoder)
        elif p in ("bf16", "fp16"):
            encoders[p] = autocast_encoder(encoder, p)
    if "engine" in modes:
        for p, enc in encoders.items():
            runners["engine" if p == "fp32" else f"engine[{p}]"] = lambda t, e=enc: run_engine(e, t)
    if "ceiling" in modes:
        runners["ceiling"] = lambda t: run_ceiling(encoder, t)
    return runners, encoders, notes


def measure(runners: dict[str, Callable[[list[str]], Result]], texts: list[str], repeats: int) -> dict[str, Result]:
    """Return each mode's best pass: a warm-up on 64 texts, then modes interleaved `repeats` times."""
    for run in runners.values():
        run(texts[:64])
    best: dict[str, Result] = {}
    for rep in range(repeats):
        for mode, run in runners.items():
            result = run(texts)
            log.info("pass %d %-22s %.2fs", rep + 1, mode, result.seconds)
            if mode not in best or result.seconds < best[mode].seconds:
                best[mode] = result
    return best


def fidelity_lines(results: dict[str, Result]) -> list[str]:
    """Return one line per engine precision: cosine to fp32 (min, mean) and top-10 overlap, with the verdict."""
    reference = results["engine"].embeddings
    lines = [f"{'precision':<12}{'min cos':>9}{'mean cos':>10}{'top10 overlap':>15}{'floor':>7}  verdict"]
    for mode, r in results.items():
        if not mode.startswith("engine") or r.embeddings is None or reference is None:
            continue
        name = mode[7:-1] if "[" in mode else "fp32"
        cos = np.sum(reference * r.embeddings, axis=1)
        floor = FIDELITY_FLOOR[name]
        verdict = "runs" if fidelity(reference, r.embeddings) >= floor else "REFUSED by the engine (under its floor)"
        lines.append(f"{name:<12}{cos.min():>9.4f}{cos.mean():>10.5f}{top10_overlap(reference, r.embeddings):>15.3f}{floor:>7}  {verdict}")
    return lines


def ratio_lines(results: dict[str, Result]) -> list[str]:
    """Return the engine's speed ratios (real tokens/s) to every other mode."""
    if "engine" not in results:
        return []
    speed = {m: r.real_tokens / r.seconds for m, r in results.items() if r.seconds > 0}
    return [f"engine/{m:<22} {speed['engine'] / s:6.2f}x" for m, s in speed.items() if m != "engine"]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table; return 0."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(argv)
    threads = configure_threads(args.threads)
    device = resolve_device(args.device)
    encoder = TextEncoder.load(EncoderSpec(device=str(device), precision="fp32", num_threads=threads, model_path=args.model_dir))
    texts = load_texts(args.texts, args.n)
    ids, _ = encoder.tokenize(texts)
    lengths = np.array([len(x) for x in ids])
    runners, _, notes = build_runners(args, encoder, threads)
    results = measure(runners, texts, args.repeats)
    for mode, note in notes.items():
        results.setdefault(mode, Result(0.0, 0, 0, 0)).note = note
    mm = matmul_gflops(device)
    if device.type == "cuda":  # the GPU's yardstick is its dense bf16 GEMM rate
        mm = matmul_gflops(device, n=8192, dtype=torch.bfloat16)
    print(f"{len(texts)} texts, {int(lengths.sum())} real tokens (median {int(np.median(lengths))}, p90 "
          f"{int(np.percentile(lengths, 90))}), device {device}, {threads} threads, torch {torch.__version__}, "
          f"model load {encoder.load_seconds:.1f}s (apart)")
    yardstick = "bf16 torch.mm 8192^3" if device.type == "cuda" else "fp32 torch.mm 2048^3"
    print(f"dense {yardstick}: {mm:.1f} GFLOP/s ({mm / 1000:.1f} TFLOP/s)")
    print(render(results, float(flops_per_text(lengths).sum()), int(lengths.sum()), mm))
    print("\n".join(["", *ratio_lines(results), "", *fidelity_lines(results)]))
    if args.json:
        Path(args.json).write_text(json.dumps({m: {"texts_per_s": r.texts / r.seconds, "real_tok_per_s": r.real_tokens / r.seconds,
                                                   "padding_eff": r.real_tokens / max(r.padded_tokens, 1)}
                                               for m, r in results.items() if r.seconds > 0}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
