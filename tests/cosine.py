"""Row-wise cosine for the tests that also run on the GPU host, which has numpy but not polars (tests/helpers.py)."""

from __future__ import annotations

import numpy as np


def cos_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return the row-wise cosine of two matrices, computed in float64."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(axis=1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-300)
