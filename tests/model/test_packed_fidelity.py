"""The padding-free path (torch-packed) on all-MiniLM-L6-v2 (or NIGHTSCORE_MODEL) against the padded one, on the
configured device (NIGHTSCORE_DEVICE; the CPU on a CPU-only machine) and against CPU fp32.

Every length from 1 to the maximum on an accelerator (the kernel-edge lengths on the CPU), a batch of one, texts past
the maximum. benchmarks/gpu_check.sh runs this file with NIGHTSCORE_DEVICE=cuda, where fp16/bf16 attention is
FlashAttention's variable-length kernel; it imports nothing the GPU host lacks (no polars).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.settings import load_settings
from models.encoder.backends.registry import unavailable_reason
from models.encoder.batching import plan_packed
from models.encoder.device import resolve_device
from models.encoder.engine import encode_texts, run_batches
from models.encoder.loader import load_encoder
from models.encoder.precision import PROBE_TEXTS
from models.encoder.spec import EncoderSpec
from models.encoder.text_encoder import TextEncoder
from models.encoder.tokens import TokenizedTexts
from tests.cosine import cos_rows
from tests.emulated import emulated

ONCE = [
    *PROBE_TEXTS,
    "a",
    "",
    "Breaking news",
    "東京は日本の首都です。",
    "emoji time 🙂🚀🔥 and more 🎉",
    "very " * 300 + "long",
    "word " * 600,
    " ".join(f"item{i} costs {i * 3.5:.2f} euros;" for i in range(150)),
]
TEXTS = ONCE * 2  # where bf16 is only emulated, its check encodes ONCE (tests/emulated.py)


def _device() -> torch.device:
    return resolve_device(load_settings().encoder.device)


def _encoder(device: torch.device, backend: str, precision: str) -> TextEncoder:
    model = load_settings().encoder.model
    return load_encoder(EncoderSpec(device=str(device), backend=backend, precision=precision, model_path=model))


def _every_length(encoder: TextEncoder) -> TokenizedTexts:
    """Return rows of every length 1..max_length cut from the texts' own tokens (one [CLS] alone, then [CLS] ... [SEP])."""
    stream = encoder.tokenize_packed(PROBE_TEXTS * 20).ids
    cls, sep = int(stream[0]), encoder.tokenizer.token_to_id("[SEP]")
    rows = [[cls]] + [[cls, *stream[1 : n - 1].tolist(), sep] for n in range(2, encoder.max_length + 1)]
    return TokenizedTexts.from_lists(rows)


@pytest.fixture(scope="module")
def cpu_fp32() -> TextEncoder:
    return _encoder(torch.device("cpu"), "torch", "fp32")


@pytest.fixture(scope="module")
def texts_on_cpu_fp32(cpu_fp32: TextEncoder) -> np.ndarray:
    """Return TEXTS' CPU fp32 vectors, encoded once for every precision's test."""
    return encode_texts(cpu_fp32, TEXTS)[0]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_packed_equals_padded_on_the_device_and_cpu_fp32(texts_on_cpu_fp32: np.ndarray, precision: str) -> None:
    device = _device()
    reason = unavailable_reason("torch-packed", precision, device)
    if reason:
        pytest.skip(f"torch-packed/{precision} on {device.type}: {reason}")
    padded, packed = _encoder(device, "torch", precision), _encoder(device, "torch-packed", precision)
    texts = ONCE if emulated(precision, device) else TEXTS
    expected, _ = encode_texts(padded, texts)
    out, stats = encode_texts(packed, texts)
    same, against_cpu = cos_rows(out, expected), cos_rows(out, texts_on_cpu_fp32[: len(texts)])
    print(
        f"torch-packed/{precision} on {device} ({packed.backend.version}): min cos {same.min():.6f} to padded, "
        f"{against_cpu.min():.6f} to CPU fp32"
    )
    floor = 0.9999 if precision == "fp32" else 0.999
    assert same.min() >= floor and against_cpu.min() >= floor
    assert stats.padded_tokens == stats.real_tokens and stats.truncated >= 4


@pytest.fixture(scope="module")
def every_length(cpu_fp32: TextEncoder) -> tuple[TokenizedTexts, np.ndarray, np.ndarray]:
    """Return rows of every length, the rows this device checks (length_rows) and their CPU fp32 vectors, each row
    padded alone: no padding at all."""
    tokens = _every_length(cpu_fp32)
    rows = length_rows(tokens.lengths, _device())
    return tokens, rows, run_batches(cpu_fp32, tokens, [np.array([i]) for i in rows])[0][rows]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_every_length_and_a_batch_of_one(every_length: tuple[TokenizedTexts, np.ndarray, np.ndarray], precision: str) -> None:
    device = _device()
    reason = unavailable_reason("torch-packed", precision, device)
    if reason:
        pytest.skip(f"torch-packed/{precision} on {device.type}: {reason}")
    packed = _encoder(device, "torch-packed", precision)
    tokens, rows, reference = every_length
    together, _ = run_batches(packed, tokens, [rows[b] for b in plan_packed(tokens.lengths[rows], 4096)])
    lengths = tokens.lengths[rows]
    alone = (lengths <= 33) | (lengths == lengths.max()) if emulated(precision, device) else np.ones(len(rows), bool)
    singles, _ = run_batches(packed, tokens, [np.array([i]) for i in rows[alone]])
    floor = 0.9999 if precision == "fp32" else 0.999
    assert cos_rows(together[rows], reference).min() >= floor
    assert cos_rows(singles[rows[alone]], reference[alone]).min() >= floor


def length_rows(lengths: np.ndarray, device: torch.device) -> np.ndarray:
    """Return the rows to check, batched and then a batch of one each: every length on an accelerator
    (benchmarks/gpu_check.sh: FlashAttention's varlen kernel), and on the CPU the short ones (1-33), those at a block
    boundary of 32 (lengths 32k-1, 32k, 32k+1) and the longest.

    On the CPU packed attention is padded SDPA, the padded path's own kernel, whose edge cases are the block boundaries;
    every length 1-256 of the same code runs on the tiny encoder (tests/unit/test_packed.py). Every length of MiniLM is
    two passes of 750 GFLOP: in fp32 26.7 CPU-s of a 2-core AVX2 EPYC (155 GFLOP/s fp32 GEMM), these rows 5.5.
    """
    if device.type != "cpu":
        return np.arange(len(lengths))
    lengths = np.asarray(lengths)
    keep = (lengths <= 33) | np.isin(lengths % 32, (0, 1, 31)) | (lengths == lengths.max())
    return np.flatnonzero(keep)
