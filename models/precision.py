"""Precision modes of the encoder and their fidelity floors against fp32.

fp32 is exact and the CPU default; bf16/fp16 are the CUDA defaults (autocast); int8 is dynamic
quantization of the Linear layers (per-channel weights) for CPU hosts. A mode whose measured fidelity
on a fixed probe set falls under its floor refuses to run rather than publish silently worse scores.
"""

from __future__ import annotations

import copy
import logging
from typing import Callable

import numpy as np
import torch

from nightscore.errors import ModelLoadError

log = logging.getLogger(__name__)

# Minimum cosine to the fp32 embedding, over every probe text.
FIDELITY_FLOOR: dict[str, float] = {"fp32": 0.9999, "bf16": 0.995, "fp16": 0.999, "int8": 0.99}

PROBE_TEXTS: list[str] = [
    "The striker scored twice as the home team won the championship final.",
    "Parliament passed the budget bill after a long debate among coalition parties.",
    "A new processor doubles the speed of cloud servers running machine learning code.",
    "Slow-roast the chicken with garlic, butter and thyme for about an hour.",
    "Cheap flights and beach hotels make the island a popular winter destination.",
    "Stocks fell as investors worried that inflation would keep interest rates high.",
    "Doctors recommend regular exercise and sleep to lower the risk of heart disease.",
    "The band's new album mixes jazz, soul and electronic music.",
    "hello",
    "Ünïcödé, emoji 🎉, numbers 3.14159 and punctuation?!",
    " ".join(["long text about markets, banks and the economy"] * 40),
    "Weather today: cloudy with a chance of rain in the afternoon.",
]


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Return a copy of model with its Linear layers dynamically quantized to int8 (per-channel weights)."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    return quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)


def fidelity(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Return the minimum row-wise cosine between two sets of unit-norm embeddings."""
    return float(np.min(np.sum(reference * candidate, axis=1)))


def check_fidelity(precision: str, embed_fp32: Callable[[list[str]], np.ndarray], embed_mode: Callable[[list[str]], np.ndarray]) -> float:
    """Return the probe fidelity of a precision mode; raise ModelLoadError when it is under the floor."""
    measured = fidelity(embed_fp32(PROBE_TEXTS), embed_mode(PROBE_TEXTS))
    floor = FIDELITY_FLOOR[precision]
    if measured < floor:
        raise ModelLoadError(
            f"precision {precision} refused: cosine to fp32 is {measured:.4f} on the probe texts, under its floor {floor}"
        )
    log.info("precision %s fidelity %.5f (floor %s)", precision, measured, floor)
    return measured
