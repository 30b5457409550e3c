"""Small helpers shared by the test tiers: numbers and demo input folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def cos_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return the row-wise cosine of two matrices, computed in float64."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def demo_inputs(folder: Path, items: int = 300, users: int = 60, seed: int = 0) -> Path:
    """Write deterministic demo inputs (items.parquet, interactions.parquet) into folder and return it."""
    from nightscore.demo_data import generate_demo_data

    folder.mkdir(parents=True, exist_ok=True)
    item_frame, interactions = generate_demo_data(items, users, seed=seed)
    item_frame.write_parquet(folder / "items.parquet")
    interactions.write_parquet(folder / "interactions.parquet")
    return folder
