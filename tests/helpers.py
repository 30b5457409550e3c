"""Small numeric helpers shared by the test tiers."""

from __future__ import annotations

import numpy as np


def cos_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return the row-wise cosine of two matrices, computed in float64."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
