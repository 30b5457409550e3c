"""Which reduced precision this host only emulates, for the model tier's tests that also run on the GPU host (no
polars): a pinned precision still runs there, at a fraction of fp32's rate, and is checked on fewer tokens."""

from __future__ import annotations

import torch

from models.encoder.backends.torch_backend import BF16_MIN_GEMM_RATIO, bf16_gemm_ratio


def emulated(precision: str, device: torch.device) -> bool:
    """Return whether the precision is emulated here: bf16 on a CPU whose bf16 Linear runs under auto's
    BF16_MIN_GEMM_RATIO of fp32's rate (auto never picks it there; 17.5 against 132 GFLOP/s on a 2-core AVX2 EPYC)."""
    return device.type == "cpu" and precision == "bf16" and bf16_gemm_ratio(torch.get_num_threads()) < BF16_MIN_GEMM_RATIO
