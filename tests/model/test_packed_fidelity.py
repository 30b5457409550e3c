"""The padding-free path (torch-packed) on all-MiniLM-L6-v2 (or NIGHTSCORE_MODEL) against the padded one, on the
configured device (NIGHTSCORE_DEVICE; the CPU on a CPU-only machine) and against CPU fp32.

Every length from 1 to the maximum, a batch of one, texts past the maximum. benchmarks/gpu_check.sh runs this file
with NIGHTSCORE_DEVICE=cuda, where fp16/bf16 attention is FlashAttention's variable-length kernel; it imports nothing
the GPU host lacks (no polars).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.settings import load_settings
from models.encoder.backends.registry import unavailable_reason
from models.encoder.backends.torch_backend import BF16_MIN_GEMM_RATIO, bf16_gemm_ratio
from models.encoder.batching import plan_packed
from models.encoder.device import resolve_device
from models.encoder.engine import encode_texts, run_batches
from models.encoder.loader import load_encoder
from models.encoder.precision import PROBE_TEXTS
from models.encoder.spec import EncoderSpec
from models.encoder.text_encoder import TextEncoder
from models.encoder.tokens import TokenizedTexts
from tests.cosine import cos_rows

TEXTS = [
    *PROBE_TEXTS,
    "a",
    "",
    "Breaking news",
    "東京は日本の首都です。",
    "emoji time 🙂🚀🔥 and more 🎉",
    "very " * 300 + "long",
    "word " * 600,
    " ".join(f"item{i} costs {i * 3.5:.2f} euros;" for i in range(150)),
] * 2


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
    expected, _ = encode_texts(padded, TEXTS)
    out, stats = encode_texts(packed, TEXTS)
    same, against_cpu = cos_rows(out, expected), cos_rows(out, texts_on_cpu_fp32)
    print(
        f"torch-packed/{precision} on {device} ({packed.backend.version}): min cos {same.min():.6f} to padded, "
        f"{against_cpu.min():.6f} to CPU fp32"
    )
    floor = 0.9999 if precision == "fp32" else 0.999
    assert same.min() >= floor and against_cpu.min() >= floor
    assert stats.padded_tokens == stats.real_tokens and stats.truncated >= 4


@pytest.fixture(scope="module")
def every_length(cpu_fp32: TextEncoder) -> tuple[TokenizedTexts, np.ndarray]:
    """Return rows of every length and their CPU fp32 vectors, padded one row per batch: no padding at all."""
    tokens = _every_length(cpu_fp32)
    return tokens, run_batches(cpu_fp32, tokens, [np.array([i]) for i in range(len(tokens))])[0]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_every_length_and_a_batch_of_one(every_length: tuple[TokenizedTexts, np.ndarray], precision: str) -> None:
    device = _device()
    reason = unavailable_reason("torch-packed", precision, device)
    if reason:
        pytest.skip(f"torch-packed/{precision} on {device.type}: {reason}")
    packed = _encoder(device, "torch-packed", precision)
    tokens, reference = every_length
    rows = alone_rows(tokens.lengths, device)
    batched = rows if emulated(precision, device) else np.arange(len(tokens))
    together, _ = run_batches(packed, tokens, [batched[b] for b in plan_packed(tokens.lengths[batched], 4096)])
    singles, _ = run_batches(packed, tokens, [np.array([i]) for i in rows])
    floor = 0.9999 if precision == "fp32" else 0.999
    assert cos_rows(together[batched], reference[batched]).min() >= floor
    assert cos_rows(singles[rows], reference[rows]).min() >= floor


def emulated(precision: str, device: torch.device) -> bool:
    """Return whether this CPU only emulates the precision: bf16 whose Linear runs under the rate auto needs.

    auto never runs it there and a pin is checked at the kernels' edge lengths (alone_rows) in a batch too; every length
    in bf16 cost 80 s of a 2-core AVX2 EPYC's suite, at 1/6 of fp32's rate. Hosts with native bf16 check every length.
    """
    return device.type == "cpu" and precision == "bf16" and bf16_gemm_ratio(torch.get_num_threads()) < BF16_MIN_GEMM_RATIO


def alone_rows(lengths: np.ndarray, device: torch.device) -> np.ndarray:
    """Return the rows to run alone, a batch of one each: every length on an accelerator (benchmarks/gpu_check.sh), and
    on the CPU the short ones (1-33) and those at a block boundary of 32 (lengths 32k-1, 32k, 32k+1) and the longest.

    The batched pass still runs every length on every device; one row per call on the CPU cost 9 s of the suite's 2-core
    time at every length, where the kernels' edge cases are the block boundaries.
    """
    if device.type != "cpu":
        return np.arange(len(lengths))
    lengths = np.asarray(lengths)
    keep = (lengths <= 33) | np.isin(lengths % 32, (0, 1, 31)) | (lengths == lengths.max())
    return np.flatnonzero(keep)
