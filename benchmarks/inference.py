"""Inference benchmark: nightscore's engine (auto and every backend) beside sentence-transformers at its best.

One run, same texts, same threads, warm, `--repeats` interleaved passes, median. Prints the CPU flags,
one table (texts/s, real tokens/s, padding efficiency, fidelity min/p1/mean cosine to torch fp32,
achieved GFLOP/s and its share of the dense matmul yardstick) and the targets of issue 16 as ratios.
sentence-transformers' onnx / dynamic-int8 onnx / openvino rows need optimum, which does not load beside
our transformers: they run in the benchmark's own venv (benchmarks/st_env.sh) as a subprocess, same texts.

    python benchmarks/inference.py [--texts PATH] [--n 2000] [--json OUT] [--repeats 3] [--modes ...]

PATH is a Parquet file with a `text` column; by default the demo items (title + "\\n" + body).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.settings import EncoderSettings
from models.encoder.backends.registry import BACKENDS, unavailable_reason
from models.encoder.device import CPU_FLAGS, configure_threads, cpu_model_and_flags, resolve_device
from models.encoder.engine import encode_texts, encode_tokens, run_batches, warm_up
from models.encoder.files import model_dir
from models.encoder.loader import load_encoder
from models.encoder.phases import PHASES, PhaseTimer
from models.encoder.precision import Fidelity, FidelityRefused, fidelity, floor_for
from models.encoder.spec import EncoderSpec
from models.encoder.text_encoder import TextEncoder
from models.encoder.tokens import PackedBatch

log = logging.getLogger("bench")
ALL_MODES = [
    "naive",
    "sentence_transformers",
    "st_torch_bf16",
    "st_env",
    "ray_data",
    "engine_modes",
    "engine",
    "pretokenized",
    "host",
    "ceiling",
    "ceiling_packed",
]
ST_SEARCH_SIZES = 3  # sentence-transformers' batch search tries at most this many sizes ...
ST_SEARCH_TEXTS = 10_000  # ... on at most this many texts (six sizes on 50k texts cost minutes of a GPU host)
CEILING_STEP = 16  # the whole-text ceiling times row lengths every this many tokens
CEILING_TOKENS = 8192  # and at least this many tokens per length
ST_ENV_ROWS = ("st_onnx", "st_onnx_int8", "st_openvino")
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    """One mode's timed passes (median kept) and what it computed."""

    seconds: float
    texts: int
    real_tokens: int
    padded_tokens: int
    embeddings: np.ndarray | None = None
    note: str = ""
    passes: list[float] = field(default_factory=list)
    fidelity: Fidelity | None = None
    precision: str = "fp32"
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        """Return real tokens per second (0 for a row that did not run)."""
        return self.real_tokens / self.seconds if self.seconds > 0 else 0.0


def load_texts(path: str | None, n: int) -> list[str]:
    """Return n texts from a Parquet `text` column (cycled if short), or from the demo items."""
    if path:
        import pyarrow.parquet as pq  # not polars: GPU hosts may lack it

        texts = [t for t in pq.read_table(path, columns=["text"]).column("text").to_pylist() if t]
    else:
        from data_contracts.inputs import item_text_expr
        from nightscore.demo import generate_items

        texts = generate_items(max(n, 2000), seed=0).select(item_text_expr()).get_column("text").to_list()
    return [texts[i % len(texts)] for i in range(n)]


def native_bf16_cpu() -> bool:
    """Return whether the CPU multiplies bf16 natively (AVX-512 BF16 or AMX); elsewhere torch emulates it slowly."""
    return bool(cpu_model_and_flags()[1] & {"avx512_bf16", "amx_bf16"})


def cpu_flags() -> str:
    """Return the CPU model and which of the flags that matter here it has (and lacks)."""
    model, flags = cpu_model_and_flags()
    model = "unknown" if model == "cpu" else model
    have = [f for f in CPU_FLAGS if f in flags]
    lack = [f for f in CPU_FLAGS if f not in flags]
    return f"CPU {model}, {os.cpu_count()} logical cores; flags: {' '.join(have) or '-'}; lacks: {' '.join(lack) or '-'}"


def model_shape(path: Path) -> tuple[int, int, int]:
    """Return (layers, width, FFN width) from the model's config.json."""
    cfg = json.loads((path / "config.json").read_text())
    layers = cfg.get("num_hidden_layers", cfg.get("n_layers", 6))
    width = cfg.get("hidden_size", cfg.get("dim", 384))
    return int(layers), int(width), int(cfg.get("intermediate_size", cfg.get("hidden_dim", 4 * width)))


def flops_per_text(lengths: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    """Return the useful forward FLOPs of each text: dense layers per token + attention (QK^T, AV) per token pair."""
    layers, d, ff = shape
    dense = 2 * (4 * d * d + 2 * d * ff) * layers * lengths
    return dense + 4 * d * layers * lengths.astype(np.float64) ** 2


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


def gemm_gflops(m: int, k: int, n: int, dtype: torch.dtype, repeats: int = 50) -> float:
    """Return the CPU rate (GFLOP/s) of an m x k by k x n matmul in dtype, best of 3 rounds."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * m * k * n * repeats / best / 1e9


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
    return Result(time.perf_counter() - started, len(ids), sum(len(x) for x in ids), padded, out)


def run_naive(encoder: TextEncoder, texts: list[str]) -> Result:
    """HF model, batch 32 in input order, padded to each batch's longest (tokenization counted)."""
    started = time.perf_counter()
    ids, _ = encoder.tokenize(texts)
    result = timed_batches(encoder, ids, [np.arange(i, min(i + 32, len(ids))) for i in range(0, len(ids), 32)])
    result.seconds = time.perf_counter() - started
    return result


def run_engine(encoder: TextEncoder, texts: list[str]) -> Result:
    """The engine in the encoder's mode (its own token budget and length multiple)."""
    vectors, stats = encode_texts(encoder, texts)
    return Result(
        stats.seconds,
        stats.texts,
        stats.real_tokens,
        stats.padded_tokens,
        vectors,
        precision=encoder.backend.precision,
        extra={"batches": stats.batches},
    )


class NullBackend:
    """A packed backend whose model does nothing: the host side of the engine alone (tokenize, plan, collate, copies,
    pooling), at the rate the host can feed a device."""

    name, precision, length_multiple, streams, packed, shape_sensitive = "null", "fp32", 1, 1, True, False
    version = "no-op model"

    def __init__(self, device: torch.device, width: int) -> None:
        self.device = device
        self._zero = torch.zeros(1, width, device=device)

    def packed_hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        """Return zeros [tokens, width] (a broadcast view: no work) for a batch already on the device."""
        return self._zero.expand(batch.tokens, -1)

    def hidden_states(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Return zeros [rows, length, width] (a broadcast view)."""
        return self._zero.expand(input_ids.shape[0] * input_ids.shape[1], -1).view(*input_ids.shape, -1)

    def warm_up(self, input_ids: np.ndarray, mask: np.ndarray) -> None:
        """Nothing to warm."""


def host_encoder(auto: TextEncoder) -> TextEncoder:
    """Return auto's tokenizer, budget and tokenizer threads around the no-op model."""
    backend = NullBackend(auto.device, auto.dim)
    return TextEncoder(
        auto.info,
        auto.tokenizer,
        backend,
        auto.device,
        auto.token_budget,
        tokenizer_threads=auto.tokenizers.threads,
    )


def run_host(encoder: TextEncoder, texts: list[str]) -> Result:
    """The engine around the no-op model: its vectors are zeros, so none are kept (no fidelity, no model FLOPs)."""
    result = run_engine(encoder, texts)
    result.embeddings, result.extra["no_model"] = None, 1.0
    return result


def run_pretokenized(encoder: TextEncoder, texts: list[str]) -> Result:
    """The engine on texts tokenized before the clock starts: planning, collation, copies, the model and pooling."""
    tokens = encoder.tokenize_packed(texts)
    vectors, stats = encode_tokens(encoder, tokens)
    _sync(encoder.device)
    return Result(
        stats.seconds, stats.texts, stats.real_tokens, stats.padded_tokens, vectors, precision=encoder.backend.precision
    )


def breakdown(encoder: TextEncoder, texts: list[str], pretokenized: bool = False) -> dict[str, float]:
    """Return one profiled pass's seconds per phase (the device synchronised at each phase's end) and its wall time."""
    timer = PhaseTimer(encoder.device)
    _sync(encoder.device)
    started = time.perf_counter()
    if pretokenized:
        encode_tokens(encoder, encoder.tokenize_packed(texts), timer=timer)
    else:
        encode_texts(encoder, texts, timer=timer)
    _sync(encoder.device)
    wall = time.perf_counter() - started
    return {**timer.breakdown(wall), "wall": wall}


def render_breakdowns(rows: dict[str, dict[str, float]]) -> str:
    """Return the table of where each row's pass went: seconds per phase and its share of the pass."""
    phases = [*PHASES, "other"]
    short = {"host_to_device": "h2d", "device_to_host": "d2h", "collate": "collate*"}
    head = f"{'row':<30}{'wall s':>8}" + "".join(f"{short.get(name, name):>13}" for name in phases)
    lines = [head, "-" * len(head)]
    for row, parts in rows.items():
        wall = max(parts["wall"], 1e-9)
        cells = "".join(f"{parts.get(name, 0.0):>6.2f}s {100 * parts.get(name, 0.0) / wall:>3.0f}%" for name in phases)
        lines.append(f"{row:<30}{parts['wall']:>8.2f}{cells}")
    return "\n".join(lines)


def run_ceiling(encoder: TextEncoder, texts: list[str]) -> Result:
    """The same mode with no padding and every text whole: each text's tokens charged at its own length's rate.

    For each row length of a grid (multiples of CEILING_STEP up to the longest text), full batches of rows of
    exactly that length, cut from the corpus's tokens, are timed after one warm-up; a text of length L is charged
    L times the per-token time interpolated at L. That is what an engine that pads nothing and fills every batch
    would take for this corpus's attention spans. Tokenizing counts, as in every engine pass.
    """
    started = time.perf_counter()
    ids, _ = encoder.tokenize(texts)
    tokenize_s = time.perf_counter() - started
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    stream = [t for row in ids for t in row]
    grid = ceiling_grid(lengths)
    per_token = np.array([seconds_per_token(encoder, stream, int(length)) for length in grid])
    seconds = tokenize_s + float((lengths * np.interp(lengths, grid, per_token)).sum())
    real = int(lengths.sum())
    result = Result(seconds, len(texts), real, real, precision=encoder.backend.precision)
    result.extra["grid_lengths"] = len(grid)
    return result


def ceiling_grid(lengths: np.ndarray) -> np.ndarray:
    """Return the row lengths the ceiling times: the shortest text, multiples of CEILING_STEP, the longest text."""
    inner = np.arange(CEILING_STEP, int(lengths.max()), CEILING_STEP)
    return np.unique(np.concatenate([[int(lengths.min())], inner[inner > lengths.min()], [int(lengths.max())]]))


def seconds_per_token(encoder: TextEncoder, stream: list[int], length: int) -> float:
    """Return the encoder's seconds per token on full, unpadded batches of rows of one length (warm, in its mode)."""
    per_batch = max(encoder.token_budget // length, 1)
    count = max(2 * encoder.backend.streams, -(-CEILING_TOKENS // (per_batch * length)))
    span = max(len(stream) - length + 1, 1)
    rows = [stream[start : start + length] for start in ((i * length) % span for i in range(per_batch * count))]
    batches = [np.arange(b * per_batch, (b + 1) * per_batch) for b in range(count)]
    run_batches(encoder, rows, batches[: encoder.backend.streams])  # the shape's first run compiles/plans it
    _sync(encoder.device)
    started = time.perf_counter()
    run_batches(encoder, rows, batches)
    _sync(encoder.device)
    return (time.perf_counter() - started) / (per_batch * count * length)


def run_ceiling_packed(encoder: TextEncoder, texts: list[str]) -> Result:
    """The same mode on fully packed 32 x 64 rows cut from the corpus's tokens (a reference, not a bound).

    Its rows attend over 64 tokens where the corpus's long texts need up to the model's maximum, so it does less
    attention work than encoding the texts whole; the ratio to it shows what that shorter attention is worth.
    """
    started = time.perf_counter()
    ids, _ = encoder.tokenize(texts)
    stream = [t for row in ids for t in row]
    rows = [stream[i : i + 64] for i in range(0, len(stream) - 63, 64)]
    batches = [np.arange(i, min(i + 32, len(rows))) for i in range(0, len(rows), 32)]
    _, counts = run_batches(encoder, rows, batches, budget=32 * 64)  # as the engine runs batches in this mode
    _sync(encoder.device)
    result = Result(time.perf_counter() - started, len(texts), sum(len(x) for x in rows), counts.padded)
    result.precision = encoder.backend.precision
    result.extra["packed_rows"] = len(rows)
    return result


def st_padded(texts: list[str], lengths: np.ndarray, batch_size: int) -> int:
    """Return the token slots sentence-transformers computes: texts sorted by character length, batch_size each."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    return int(sum(len(b) * int(lengths[b].max()) for b in np.array_split(order, range(batch_size, len(order), batch_size))))


def make_st_torch(
    path: Path, device: torch.device, lengths: np.ndarray, dtype: torch.dtype | None, batch_sizes: list[int]
) -> Callable[[list[str]], Result]:
    """Return a runner of SentenceTransformer.encode (torch; dtype bf16/fp16 casts the weights) at its best batch size."""
    from sentence_transformers import SentenceTransformer

    kwargs: dict[str, Any] = {"model_kwargs": {"torch_dtype": dtype}} if dtype is not None else {}
    model = SentenceTransformer(str(path), device=str(device), **kwargs)
    chosen = {"batch": batch_sizes[0]}

    def once(texts: list[str], batch: int) -> Result:
        _sync(device)
        started = time.perf_counter()
        vectors = model.encode(texts, batch_size=batch, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        _sync(device)
        return Result(
            time.perf_counter() - started,
            len(texts),
            int(lengths[: len(texts)].sum()),
            st_padded(texts, lengths[: len(texts)], batch),
            vectors.astype(np.float32),
        )

    def run(texts: list[str]) -> Result:
        if len(batch_sizes) > 1 and "searched" not in chosen:  # the first call: the untimed warm-up pass
            searched = _best_batch(once, texts[:ST_SEARCH_TEXTS], batch_sizes[:ST_SEARCH_SIZES])
            chosen.update(batch=searched, searched=1)
        result = once(texts, int(chosen["batch"]))
        result.note = f"batch_size {chosen['batch']}"
        return result

    return run


def _best_batch(once: Callable[[list[str], int], Result], texts: list[str], sizes: list[int]) -> int:
    """Return the batch size after which sentence-transformers stops getting faster (raised in order)."""
    best, best_s = sizes[0], once(texts, sizes[0]).seconds
    for size in sizes[1:]:
        seconds = once(texts, size).seconds
        if seconds >= best_s * 0.97:
            break
        best, best_s = size, seconds
    log.info("sentence-transformers batch size: %d (%.2fs)", best, best_s)
    return best


def make_ray_data(threads: int, path: str) -> tuple[Callable[[list[str]], Result], float] | None:
    """Return (runner, Ray start-up seconds) of the standard Ray Data pattern (batch 32, one actor), or None."""
    try:
        import ray
    except ImportError:
        return None
    started = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    startup = time.perf_counter() - started

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
            return {
                "embedding": pooled.numpy(),
                "tokens": enc["attention_mask"].sum(1).numpy(),
                "padded": np.full(len(pooled), enc["attention_mask"].shape[1]),
            }

    def run(texts: list[str]) -> Result:
        ds = ray.data.from_items([{"text": t} for t in texts]).map_batches(
            Embedder, batch_size=32, concurrency=1, batch_format="numpy"
        )
        first_at, count, real, padded = None, 0, 0, 0
        for batch in ds.iter_batches(batch_size=32, batch_format="numpy"):
            if first_at is None:
                first_at = time.perf_counter()
                continue
            count, real, padded = (
                count + len(batch["tokens"]),
                real + int(batch["tokens"].sum()),
                padded + int(batch["padded"].sum()),
            )
        return Result(time.perf_counter() - (first_at or time.perf_counter()), count, real, padded, None)

    return run, startup


def engine_encoders(
    args: argparse.Namespace, device: torch.device, threads: int, budget: int, cache: str
) -> tuple[dict[str, TextEncoder], dict[str, str]]:
    """Return (row -> pinned engine encoder, row -> skip/refusal note) for every backend x precision here."""
    precisions = ("bf16", "fp16", "fp32") if device.type == "cuda" else ("fp32", "bf16", "int8")
    encoders, notes = {}, {}
    for backend in BACKENDS:
        for precision in precisions:
            row = f"engine[{backend}/{precision}]"
            reason = unavailable_reason(backend, precision, device)
            if reason:
                notes[row] = f"skipped: {reason}"
                continue
            if row in args.skip.split(","):  # not loaded either: a pinned OpenVINO int8 would search for minutes
                notes[row] = "left out (--skip)"
                continue
            spec = EncoderSpec(
                device=str(device),
                precision=precision,
                backend=backend,
                num_threads=threads,
                model_path=args.model_dir,
                cache_dir=cache,
                token_budget=budget,
            )
            try:
                encoders[row] = load_encoder(spec)
            except FidelityRefused as exc:
                notes[row] = f"refused: {exc}"
    for compile_mode in filter(None, (args.compile_modes or "").split(",")):  # CUDA switches, measured here
        for precision in ("bf16", "fp16") if device.type == "cuda" else ():
            spec = EncoderSpec(
                device=str(device),
                precision=precision,
                backend="torch-packed",
                num_threads=threads,
                model_path=args.model_dir,
                cache_dir=cache,
                token_budget=budget,
                compile_mode=compile_mode,
            )
            encoders[f"engine[torch-packed/{precision}+compile:{compile_mode}]"] = load_encoder(spec)
    return encoders, notes


def measure(
    runners: dict[str, Callable[[list[str]], Result]], texts: list[str], repeats: int, warmup: int | None = None
) -> dict[str, Result]:
    """Return each mode's median pass: an untimed warm-up pass (on the first `warmup` texts, default all), then
    modes interleaved `repeats` times. A full warm-up matters for runtimes that plan each new input shape once
    (OpenVINO's dynamic shapes): warmed on 64 texts the engine's first pass ran 12% slower than its later ones."""
    for run in runners.values():
        run(texts[:warmup] if warmup else texts)
    passes: dict[str, list[Result]] = {}
    for rep in range(repeats):
        for mode, run in runners.items():
            result = run(texts)
            log.info("pass %d %-24s %.2fs", rep + 1, mode, result.seconds)
            passes.setdefault(mode, []).append(result)
    out = {}
    for mode, results in passes.items():
        ordered = sorted(results, key=lambda r: r.seconds)
        median = ordered[len(ordered) // 2]
        median.passes = [r.seconds for r in results]
        out[mode] = median
    return out


class StEnv:
    """sentence-transformers' onnx / dynamic-int8 onnx / openvino rows, served by a process in the benchmark's own venv.

    Each pass is one command to that process, so these rows interleave with the in-process rows pass by
    pass (same texts, same machine, same noise) instead of running apart after them.
    """

    def __init__(self, args: argparse.Namespace, texts: list[str], lengths: np.ndarray, threads: int, folder: Path) -> None:
        python = args.st_python
        if python == "auto":
            python = (
                subprocess.run(["bash", str(ROOT / "benchmarks" / "st_env.sh")], check=True, capture_output=True, text=True)
                .stdout.strip()
                .splitlines()[-1]
            )
        (folder / "texts.json").write_text(json.dumps(texts))
        self.lengths, self.log = lengths, (folder / "st_rows.log").open("w")
        self.proc = subprocess.Popen(
            [
                python,
                str(ROOT / "benchmarks" / "st_rows.py"),
                "--serve",
                "--model",
                str(model_dir(args.model_dir)),
                "--texts",
                str(folder / "texts.json"),
                "--out",
                str(folder / "out"),
                "--threads",
                str(threads),
                "--batch-sizes",
                args.st_batch_sizes.split(",")[0],
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
        )
        self.ready = self._answer()
        v = self.ready["versions"]
        self.note = f"own venv: ST {v['sentence_transformers']}, transformers {v['transformers']}, optimum {v['optimum']}"

    def _answer(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the ST venv's process ended; see {self.log.name}")
        return json.loads(line)

    def runner(self, row: str) -> Callable[[list[str]], Result]:
        """Return a runner that asks the process for one timed pass of row over the first len(texts) texts."""

        def run(texts: list[str]) -> Result:
            assert self.proc.stdin is not None
            self.proc.stdin.write(f"{row} {len(texts)}\n")
            answer = self._answer()
            vectors = np.load(answer["npy"])
            n = len(texts)
            return Result(
                answer["seconds"],
                n,
                int(self.lengths[:n].sum()),
                st_padded(texts, self.lengths[:n], int(self.ready["batch_size"])),
                vectors,
                precision="int8" if "int8" in row else "float",
                note=f"{self.note}, batch {self.ready['batch_size']}",
            )

        return run

    def close(self) -> None:
        """Stop the process."""
        if self.proc.poll() is None and self.proc.stdin is not None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        self.log.close()


def add_fidelity(results: dict[str, Result], reference: np.ndarray) -> None:
    """Set each row's fidelity (cosine to torch fp32) where it kept its embeddings."""
    for r in results.values():
        if r.embeddings is not None and r.embeddings.shape == reference.shape:
            r.fidelity = fidelity(reference, r.embeddings)


def render(results: dict[str, Result], corpus_flops: float, corpus_tokens: int, mm: float) -> str:
    """Return the side-by-side table of every mode."""
    head = (
        f"{'mode':<26}{'texts/s':>9}{'real tok/s':>11}{'pad eff':>8}{'cos min':>9}{'cos p1':>9}{'cos mean':>10}"
        f"{'GFLOP/s':>9}{'% mm':>7}  note"
    )
    lines = [head, "-" * len(head)]
    for mode, r in results.items():
        if r.seconds <= 0:
            lines.append(f"{mode:<26}{'-':>9}{'-':>11}{'-':>8}{'-':>9}{'-':>9}{'-':>10}{'-':>9}{'-':>7}  {r.note}")
            continue
        gflops = 0.0 if r.extra.get("no_model") else corpus_flops * r.real_tokens / corpus_tokens / r.seconds / 1e9
        fid = r.fidelity
        cos = f"{fid.min:>9.5f}{fid.p1:>9.5f}{fid.mean:>10.6f}" if fid else f"{'-':>9}{'-':>9}{'-':>10}"
        lines.append(
            f"{mode:<26}{r.texts / r.seconds:>9.1f}{r.tokens_per_s:>11.0f}{r.real_tokens / max(r.padded_tokens, 1):>8.3f}"
            f"{cos}{gflops:>9.1f}{100 * gflops / mm:>6.1f}%  {r.note}"
        )
    return "\n".join(lines)


def st_best(results: dict[str, Result], floor: float) -> str | None:
    """Return the fastest sentence-transformers row whose min cosine to torch fp32 meets floor."""
    rows = [
        m
        for m, r in results.items()
        if (m.startswith("st_") or m == "sentence_transformers")
        and r.seconds > 0
        and r.fidelity is not None
        and r.fidelity.min >= floor
    ]
    return max(rows, key=lambda m: results[m].tokens_per_s) if rows else None


def target_lines(results: dict[str, Result], floor: float, best: str | None) -> list[str]:
    """Return the issue's targets as measured ratios, each with PASS or MISS."""
    e = results.get("engine")
    if e is None or e.seconds <= 0:
        return []
    pad = e.real_tokens / max(e.padded_tokens, 1)
    checks = [
        (f"engine(auto) / sentence_transformers_best [{best}] at floor {floor}", best, 1.5),
        ("engine(auto) / ceiling (no padding, texts whole, same mode)", "ceiling", 0.9),
        ("engine(auto) / naive", "naive", 4.0),
    ]
    same = {"fp32": "sentence_transformers", "bf16": "st_torch_bf16", "fp16": "st_torch_fp16", "int8": "st_onnx_int8"}
    if e.precision in same:
        checks.insert(
            1, (f"engine(auto) / sentence-transformers in the same precision [{same[e.precision]}]", same[e.precision], 1.5)
        )
    lines = []
    for label, other, goal in checks:
        if other in results and results[other].seconds > 0:
            ratio = e.tokens_per_s / results[other].tokens_per_s
            lines.append(f"{label:<66} {ratio:6.2f}x  (target >= {goal}x: {'PASS' if ratio >= goal else 'MISS'})")
    packed = results.get("ceiling_packed")
    if packed is not None and packed.seconds > 0:
        ratio = e.tokens_per_s / packed.tokens_per_s
        lines.append(f"{'engine(auto) / packed 64-token rows (reference: 64-token attention)':<66} {ratio:6.2f}x")
    lines.append(f"{'engine(auto) padding efficiency':<66} {pad:6.3f}   (target >= 0.97: {'PASS' if pad >= 0.97 else 'MISS'})")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", help="Parquet file with a `text` column (default: demo items)")
    parser.add_argument("--n", type=int, default=2000, help="number of texts")
    parser.add_argument("--json", help="write the rows, targets, CPU flags and calibration here")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per mode (the median is kept)")
    parser.add_argument("--warmup", type=int, default=None, help="texts in each mode's untimed warm-up pass (default all)")
    parser.add_argument("--modes", default=",".join(ALL_MODES), help="comma-separated subset of " + ",".join(ALL_MODES))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--model-dir", default=None, help="a sentence-transformers folder (default: the packaged MiniLM)")
    parser.add_argument("--cache-dir", default=None, help="engine conversions/calibration (default: a fresh temp folder)")
    parser.add_argument("--st-python", default="auto", help="python of the ST venv (auto: benchmarks/st_env.sh builds it)")
    parser.add_argument("--calibration-budgets", default=None, help="token budgets auto tries (default: the device's)")
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated rows left out, e.g. engine[torch/int8] where a CPU without VNNI runs it at 100 tok/s",
    )
    parser.add_argument(
        "--compile-modes",
        default="",
        help="CUDA: torch.compile modes timed as extra torch-packed rows (e.g. default,reduce-overhead; none by default)",
    )
    parser.add_argument(
        "--st-batch-sizes",
        default=None,
        help="ST batch sizes tried in order (default 32 on CPU; 256,512,1024 on CUDA: raised until it stops getting "
        f"faster, at most {ST_SEARCH_SIZES} sizes on the first {ST_SEARCH_TEXTS:,} texts)",
    )
    return parser.parse_args(argv)


def build_runners(
    args: argparse.Namespace,
    reference: TextEncoder,
    auto: TextEncoder,
    pinned: dict[str, TextEncoder],
    lengths: np.ndarray,
    threads: int,
    st_env: StEnv | None,
    engines: dict[str, TextEncoder],
) -> tuple[dict[str, Callable[[list[str]], Result]], dict[str, str]]:
    """Return (mode -> runner, mode -> note) for the modes asked for, in table order; `engines` gets the encoder of
    every row the engine runs (their shapes are warmed before timing, their time broken down after)."""
    modes, notes = args.modes.split(","), {}
    runners: dict[str, Callable[[list[str]], Result]] = {}
    path = model_dir(args.model_dir)
    sizes = [int(s) for s in args.st_batch_sizes.split(",")]
    if "naive" in modes:
        runners["naive"] = lambda t: run_naive(reference, t)
    if "sentence_transformers" in modes:
        runners["sentence_transformers"] = make_st_torch(path, reference.device, lengths, None, sizes)
    if "st_torch_bf16" in modes and (
        reference.device.type == "cuda" or unavailable_reason("torch", "bf16", reference.device) is None
    ):
        runners["st_torch_bf16"] = make_st_torch(path, reference.device, lengths, torch.bfloat16, sizes)
    if "st_torch_bf16" in modes and reference.device.type == "cuda":
        runners["st_torch_fp16"] = make_st_torch(path, reference.device, lengths, torch.float16, sizes)
    if st_env is not None:
        for row in ST_ENV_ROWS:
            if row in st_env.ready["ready"]:
                runners[row] = st_env.runner(row)
            else:
                notes[row] = f"failed to load: {st_env.ready['load'].get(row)}"
    if "ray_data" in modes:
        ray = make_ray_data(threads, str(path))
        if ray is None:
            notes["ray_data"] = "skipped: ray not installed (pip install 'ray[data]==2.60.0')"
        else:
            runners["ray_data"], startup = ray
            notes["ray_data"] = f"steady state; Ray start-up {startup:.1f}s apart"
    if "engine_modes" in modes:
        for row, enc in pinned.items():
            runners[row], engines[row] = functools.partial(run_engine, enc), enc
    if "engine" in modes:
        runners["engine"], engines["engine"] = (lambda t: run_engine(auto, t)), auto
        notes["engine"] = f"auto -> {auto.mode.label}"
    if "pretokenized" in modes:
        runners["pretokenized"], engines["pretokenized"] = (lambda t: run_pretokenized(auto, t)), auto
        notes["pretokenized"] = f"{auto.mode.label} on texts tokenized before the clock: the device side, warm"
    if "host" in modes:
        host = host_encoder(auto)
        runners["host"], engines["host"] = functools.partial(run_host, host), host
        notes["host"] = (
            f"no-op model: tokenize ({host.tokenizers.threads} tokenizer threads), plan, collate, copies, pooling "
            f"on {os.cpu_count()} cores"
        )
    if "ceiling" in modes:
        runners["ceiling"] = lambda t: run_ceiling(auto, t)
        notes["ceiling"] = f"no padding, texts whole: full batches timed per row length in {auto.mode.label}"
    if "ceiling_packed" in modes:
        runners["ceiling_packed"] = lambda t: run_ceiling_packed(auto, t)
        notes["ceiling_packed"] = (
            f"packed 32x64 in {auto.backend.name}/{auto.backend.precision}"
            + (f", {auto.backend.streams} streams" if auto.backend.streams > 1 else "")
            + "; 64-token attention: a reference, not a bound"
        )
    for row in filter(None, args.skip.split(",")):
        if runners.pop(row, None) is not None:
            notes[row] = "left out (--skip)"
    return runners, notes


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table; return 0."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(argv)
    threads = configure_threads(args.threads)
    device = resolve_device(args.device)
    args.st_batch_sizes = args.st_batch_sizes or ("256,512,1024" if device.type == "cuda" else "32")
    texts = load_texts(args.texts, args.n)
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        cache = args.cache_dir or tmp
        budgets = tuple(int(b) for b in args.calibration_budgets.split(",")) if args.calibration_budgets else None
        base = EncoderSpec(
            device=str(device), num_threads=threads, model_path=args.model_dir, cache_dir=cache, calibration_budgets=budgets
        )
        reference = load_encoder(
            EncoderSpec(device=str(device), precision="fp32", backend="torch", num_threads=threads, model_path=args.model_dir)
        )
        auto = load_encoder(base)
        pinned, pinned_notes = (
            engine_encoders(args, device, threads, auto.token_budget, cache)
            if "engine_modes" in args.modes.split(",")
            else ({}, {})
        )
        ids, _ = reference.tokenize(texts)
        lengths = np.array([len(x) for x in ids])
        use_st_env = "st_env" in args.modes.split(",") and device.type == "cpu" and args.st_python != "none"
        st_env = StEnv(args, texts, lengths, threads, Path(tmp)) if use_st_env else None
        try:
            engines: dict[str, TextEncoder] = {}
            runners, notes = build_runners(args, reference, auto, pinned, lengths, threads, st_env, engines)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            for row, encoder in engines.items():  # every batch shape of the corpus once, untimed
                warmed = warm_up(encoder, texts)
                log.info("warm-up %-24s %d batch shapes", row, warmed)
            results = measure_ray_apart(runners, texts, args.repeats, args.warmup)
            profiles = {row: breakdown(encoder, texts, row == "pretokenized") for row, encoder in engines.items()}
        finally:
            if st_env is not None:
                st_env.close()
        report(args, results, {**notes, **pinned_notes}, reference, auto, texts, lengths, device, threads, profiles)
    return 0


def measure_ray_apart(
    runners: dict[str, Callable[[list[str]], Result]], texts: list[str], repeats: int, warmup: int | None
) -> dict[str, Result]:
    """Return every row's result, Ray Data's passes first and then Ray shut down: its idle daemons (raylet, GCS,
    workers) keep a core of 2 busy enough to slow every row interleaved with them (multi-stream rows most)."""
    ray_runner = runners.pop("ray_data", None)
    results = measure({"ray_data": ray_runner}, texts, repeats, warmup) if ray_runner is not None else {}
    if ray_runner is not None:
        import ray

        ray.shutdown()
    return {**results, **measure(runners, texts, repeats, warmup)}


def report(
    args: argparse.Namespace,
    results: dict[str, Result],
    notes: dict[str, str],
    reference: TextEncoder,
    auto: TextEncoder,
    texts: list[str],
    lengths: np.ndarray,
    device: torch.device,
    threads: int,
    profiles: dict[str, dict[str, float]],
) -> None:
    """Print the header, the table, the breakdowns, calibration and targets; write the JSON when asked."""
    for mode, note in notes.items():
        results.setdefault(mode, Result(0.0, 0, 0, 0))
        results[mode].note = (results[mode].note + "; " if results[mode].note else "") + note
    ref = results.get("engine[torch/fp32]", results.get("naive"))
    reference_embeddings = ref.embeddings if ref is not None and ref.embeddings is not None else None
    if reference_embeddings is None:
        reference_embeddings = run_engine(reference, texts).embeddings
    assert reference_embeddings is not None, "the reference run keeps its embeddings"
    add_fidelity(results, reference_embeddings)
    ordered = {m: results[m] for m in [*sorted(results, key=_row_order)]}
    mm = matmul_gflops(device, n=8192, dtype=torch.bfloat16) if device.type == "cuda" else matmul_gflops(device)
    defaults = EncoderSettings()
    floor = floor_for(auto.backend.precision, defaults.fidelity_floor_float, defaults.fidelity_floor_int8)
    best = st_best(results, floor)
    print(cpu_flags())
    print(
        f"{len(texts)} texts, {int(lengths.sum())} real tokens (median {int(np.median(lengths))}, p90 "
        f"{int(np.percentile(lengths, 90))}), device {device}, {threads} threads, torch {torch.__version__}, "
        f"{args.repeats} interleaved passes, median kept; load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    yardstick = "bf16 torch.mm 8192^3" if device.type == "cuda" else "fp32 torch.mm 2048^3"
    print(f"dense {yardstick}: {mm:.1f} GFLOP/s; fidelity = cosine to the engine's torch fp32 (= sentence-transformers fp32)")
    if device.type == "cpu" and native_bf16_cpu():  # emulated bf16 (AVX2) took minutes for these 150 GEMMs
        _, width, ffn = model_shape(model_dir(args.model_dir))
        print(
            f"bf16 GEMM on the encoder's FFN shape (2048x{width}x{ffn}, torch/oneDNN): "
            f"{gemm_gflops(2048, width, ffn, torch.bfloat16):.1f} GFLOP/s (the compute bound of every bf16 row)"
        )
    cal = auto.calibration
    if cal is not None:
        print(f"auto chose {cal.mode.label} (min cos {cal.fidelity.min:.5f}) in {cal.seconds:.1f}s of calibration (apart):")
        for row in cal.table:
            fidelity = cast(dict[str, float] | None, row["fidelity"])
            fid = fidelity["min"] if fidelity else float("nan")
            print(f"    {row['mode']:<28}{row['tokens_per_s']:>9.0f} tok/s  min cos {fid:.5f}  {row['note']}")
    print(render(ordered, float(flops_per_text(lengths, model_shape(model_dir(args.model_dir))).sum()), int(lengths.sum()), mm))
    if device.type == "cuda":
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    if profiles:
        print(
            "\nwhere the time goes: one profiled pass per row, the device synchronised at every phase's end "
            "(* collate runs in its own thread, on the critical path only as idle; with several streams, phases overlap "
            "and idle is the wait for them):"
        )
        print(render_breakdowns(profiles))
    feed = host_lines(results, device)
    print("\n" + "\n".join([*feed, *target_lines(results, floor, best)]))
    if args.json:
        _write_json(Path(args.json), ordered, best, floor, auto, [*feed, *target_lines(results, floor, best)], profiles)


def _row_order(mode: str) -> tuple[int, str]:
    order = ["naive", "sentence_transformers", "st_torch_bf16", "st_torch_fp16", *ST_ENV_ROWS, "ray_data"]
    if mode in order:
        return order.index(mode), mode
    return (len(order) + 1 if mode.startswith("engine[") else len(order) + 2 if mode == "engine" else len(order) + 3), mode


def host_lines(results: dict[str, Result], device: torch.device) -> list[str]:
    """Return what the host-side row says: tokens/s the host feeds, per core, and the cores the device side needs."""
    host = results.get("host")
    if host is None or host.seconds <= 0:
        return []
    cores = os.cpu_count() or 1
    per_core = host.tokens_per_s / cores
    lines = [f"{'host side (no-op model)':<66} {host.tokens_per_s:,.0f} tok/s, {per_core:,.0f} tok/s per core ({cores} cores)"]
    device_side = results.get("pretokenized")
    if device_side is not None and device_side.seconds > 0:
        need = device_side.tokens_per_s / max(per_core, 1e-9)
        rate = f"{device} at {device_side.tokens_per_s:,.0f} tok/s"
        lines.append(f"{'cores to feed the device side at its pre-tokenized rate':<66} {need:6.1f}  ({rate})")
    return lines


def _write_json(
    path: Path,
    results: dict[str, Result],
    best: str | None,
    floor: float,
    auto: TextEncoder,
    targets: list[str],
    profiles: dict[str, dict[str, float]],
) -> None:
    rows: dict[str, Any] = {
        m: {
            "texts_per_s": r.texts / r.seconds,
            "real_tok_per_s": r.tokens_per_s,
            "padding_eff": r.real_tokens / max(r.padded_tokens, 1),
            "passes_s": r.passes,
            "note": r.note,
            "fidelity": r.fidelity.as_dict() if r.fidelity else None,
        }
        for m, r in results.items()
        if r.seconds > 0
    }
    if best:
        rows["sentence_transformers_best"] = {**rows[best], "row": best, "floor": floor}
    rows["_meta"] = {"cpu": cpu_flags(), "auto": auto.mode_record(), "targets": targets, "breakdown_s": profiles}
    path.write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
