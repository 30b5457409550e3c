"""Small helpers shared by the test tiers: numbers and demo input folders."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tasks.results import Published


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


def published(**record: object) -> "Published":
    """Return a Published run with a plausible scoring_runs record; keyword arguments override its columns."""
    import json
    from datetime import datetime, timezone

    from tasks.results import Published, RunRecord

    stage_seconds = record.pop("stage_seconds", {"encode": 36.0, "publish": 4.0})
    data_docs = record.pop("data_docs", {"items": "/lake/docs/index.html"})
    at = datetime(2026, 11, 30, 3, tzinfo=timezone.utc)
    values: dict[str, object] = {
        "run_id": "r1", "flow_run_id": None, "flow_name": "nightly", "run_date": "2026-11-30", "status": "published",
        "started_at": at, "finished_at": at, "rows_in": 2000, "rows_quarantined": 0, "rows_scored": 2000, "rows_reused": 0,
        "rows_computed": 2000, "shards_reused": 0, "interactions_in": 100, "interactions_quarantined": 0,
        "users_with_candidates": 10, "recall_at_k": 0.5, "ndcg_at_10": 0.2, "popularity_recall_at_k": 0.4,
        "popularity_ndcg_at_10": 0.1, "real_tokens": 1000, "padded_tokens": 1100, "padding_efficiency": 1000 / 1100,
        "truncated_texts": 0, "texts_per_s": 90.0, "wall_seconds": 100.0, "device": "cuda:0", "model_version": "m",
        "contract_versions": "c", "stage_seconds": json.dumps(stage_seconds), "data_docs": json.dumps(data_docs),
        **record,
    }
    return Published(RunRecord(**values), dict(data_docs), dict(stage_seconds), shards=4, cache_entries=10)  # type: ignore[arg-type]
