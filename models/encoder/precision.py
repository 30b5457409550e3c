"""Fidelity of a backend/precision against torch fp32: probe texts, floors, statistics and the refusal.

Floors are settings (passed in, never read here): one for float modes (fp32 on another runtime, bf16,
fp16) and one for int8. A pinned mode under its floor is refused rather than publishing silently worse
vectors; `auto` only ever picks a mode over its floor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.errors import ModelLoadError

# Sentences of several topics; the calibration corpus is built from them, and the short extremes
# ("hello", one symbol) are kept because the shortest texts are where int8 loses most.
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
    "ok",
    "?",
    "Ünïcödé, emoji 🎉, numbers 3.14159 and punctuation?!",
    "Weather today: cloudy with a chance of rain in the afternoon.",
    "Call +44 20 7946 0958 before 9 a.m. or e-mail someone@example.com.",
    " ".join(["long text about markets, banks and the economy"] * 40),
]


class FidelityRefused(ModelLoadError):
    """A pinned backend/precision measured under its fidelity floor against torch fp32 (exit 1)."""


@dataclass(frozen=True)
class Fidelity:
    """Cosine of a mode's vectors to torch fp32's over the same texts: min, 1st percentile and mean."""

    min: float
    p1: float
    mean: float

    def as_dict(self) -> dict[str, float]:
        """Return the three figures rounded for logs, tables and run records."""
        return {"min": round(self.min, 6), "p1": round(self.p1, 6), "mean": round(self.mean, 6)}


def floor_for(precision: str, float_floor: float, int8_floor: float) -> float:
    """Return the fidelity floor of a precision: the int8 floor for int8, the float floor otherwise."""
    return int8_floor if precision == "int8" else float_floor


def fidelity(reference: np.ndarray, candidate: np.ndarray) -> Fidelity:
    """Return the row-wise cosine statistics between two embeddings of the same texts (float64, any norm)."""
    a = np.asarray(reference, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    cos = (a * b).sum(axis=1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    if len(cos) == 0:
        return Fidelity(1.0, 1.0, 1.0)
    return Fidelity(float(cos.min()), float(np.percentile(cos, 1)), float(cos.mean()))


def require_floor(mode: str, measured: Fidelity, floor: float) -> None:
    """Raise FidelityRefused naming the floor and the measured cosine when measured.min is under floor."""
    if measured.min < floor:
        raise FidelityRefused(
            f"mode {mode} refused: min cosine to torch fp32 is {measured.min:.6f} on the probe texts "
            f"(p1 {measured.p1:.6f}, mean {measured.mean:.6f}), under its floor {floor}"
        )
