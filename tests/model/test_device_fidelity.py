"""Fidelity of every precision on the configured device (NIGHTSCORE_DEVICE): against fp32 on the same device and
against CPU fp32, on all-MiniLM-L6-v2 (or NIGHTSCORE_MODEL). On a CPU-only machine the device is the CPU.

benchmarks/gpu_check.sh runs this file with NIGHTSCORE_DEVICE=cuda on the GPU host (issue 19, step 2).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.settings import EncoderSettings, load_settings
from models.encoder.backends.registry import BACKENDS, unavailable_reason
from models.encoder.device import resolve_device
from models.encoder.engine import encode_texts
from models.encoder.loader import load_encoder
from models.encoder.precision import PROBE_TEXTS
from models.encoder.spec import EncoderSpec
from tests.cosine import cos_rows  # polars-free: this file runs on the GPU host
from tests.emulated import emulated

ONCE = [
    *PROBE_TEXTS,
    "a",
    "",
    "Breaking news",
    "東京は日本の首都です。",
    "word " * 600,
    "The central bank raised interest rates by a quarter point on Wednesday.",
]
TEXTS = ONCE * 3  # where bf16 is only emulated, its check encodes ONCE (tests/emulated.py)


def _device() -> torch.device:
    return resolve_device(load_settings().encoder.device)


def _spec(device: torch.device, backend: str, precision: str) -> EncoderSpec:
    model = load_settings().encoder.model
    return EncoderSpec(device=str(device), backend=backend, precision=precision, model_path=model)


@pytest.fixture(scope="module")
def cpu_fp32() -> np.ndarray:
    return encode_texts(load_encoder(_spec(torch.device("cpu"), "torch", "fp32")), TEXTS)[0]


@pytest.fixture(scope="module")
def device_fp32(cpu_fp32: np.ndarray) -> np.ndarray:
    """Return TEXTS' torch fp32 vectors on the device, encoded once for the module's tests (cpu_fp32's on the CPU)."""
    device = _device()
    return cpu_fp32 if device.type == "cpu" else encode_texts(load_encoder(_spec(device, "torch", "fp32")), TEXTS)[0]


def test_fp32_on_the_device_matches_cpu_fp32(device_fp32: np.ndarray, cpu_fp32: np.ndarray) -> None:
    if _device().type == "cpu":
        pytest.skip("the device is the CPU: its fp32 is the reference itself")
    assert cos_rows(device_fp32, cpu_fp32).min() >= 0.9999  # TF32 is off by default in torch: fp32 stays fp32


@pytest.mark.parametrize("precision", ["bf16", "fp16", "int8"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_precision_against_fp32_on_the_device_and_on_cpu(
    device_fp32: np.ndarray, cpu_fp32: np.ndarray, backend: str, precision: str
) -> None:
    device = _device()
    reason = unavailable_reason(backend, precision, device)
    if reason:
        pytest.skip(f"{backend}/{precision} on {device.type}: {reason}")
    if (backend, precision, device.type, load_settings().encoder.model) == ("openvino", "int8", "cpu", None):
        # the same check as test_encoder_fidelity's on MiniLM's one searched int8 (the session's minilm_int8), whose
        # texts hold these; here it waited minutes for that search while the other worker ran it
        pytest.skip("MiniLM's OpenVINO int8 on the CPU: checked by tests/model/test_encoder_fidelity.py")
    encoder = load_encoder(_spec(device, backend, precision))  # refused (FidelityRefused) if under its floor
    texts = ONCE if emulated(precision, device) else TEXTS
    out, stats = encode_texts(encoder, texts)
    defaults = EncoderSettings()
    floor = defaults.fidelity_floor_int8 if precision == "int8" else defaults.fidelity_floor_float
    same_device = cos_rows(out, device_fp32[: len(texts)])
    against_cpu = cos_rows(out, cpu_fp32[: len(texts)])
    print(f"{backend}/{precision} on {device}: min cos {same_device.min():.5f} (same device), {against_cpu.min():.5f} (CPU fp32)")
    assert same_device.min() >= floor and against_cpu.min() >= floor
    assert stats.padded_tokens >= stats.real_tokens
