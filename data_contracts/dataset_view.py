"""What a dataset suite reads of a dataset, gathered in one streaming pass over its batches.

A suite needs three things, none of which is the whole dataset:

- ``rows``: the rows its per-row expectations read: every row, or a seeded sample of ``sample_rows`` rows
  (the same rows for the same dataset, whether it arrives whole or in batches), each embedding replaced by
  its L2 norm (``embedding_norm``) as the batch passes;
- ``height``: the row count of the whole dataset;
- whole-dataset aggregates behind the derived tables and the stats: rows per topic and the topic_score
  sum (item_scores), rows per user (interactions, user_candidates).

So a 1M-item dataset costs its sample plus a few small tables, not its 1M rows (docs/memory.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import polars as pl

SAMPLE_SEED = 20_261_101  # fixed, so the same dataset always yields the same sample
VIEW_BATCH = 8_192  # rows per slice when a whole frame is viewed (an embedding's norm is computed in float64 lists)
COUNT = "n"


@dataclass(frozen=True)
class DatasetView:
    """A dataset as its suite reads it: row sample, row count, per-topic and per-user aggregates."""

    rows: pl.DataFrame
    height: int
    topic_counts: pl.DataFrame  # topic, n (rows per topic; empty without a topic column)
    user_counts: pl.DataFrame  # user_id, n (rows per user; empty without a user_id column)
    topic_score_mean: float | None  # mean of the non-null topic scores (NaN if one is NaN); None without any

    @property
    def columns(self) -> list[str]:
        """Return the dataset's columns as the per-row expectations see them."""
        return self.rows.columns


def embedding_norm_expr() -> pl.Expr:
    """Return the L2 norm of each row's embedding (null for a null embedding, NaN for a NaN component)."""
    squares = pl.col("embedding").cast(pl.List(pl.Float64)).list.eval(pl.element().pow(2))
    return squares.list.sum().sqrt().alias("embedding_norm")


def sample_positions(height: int, sample_rows: int | None) -> np.ndarray | None:
    """Return the sorted row positions of the seeded sample, or None when every row is read."""
    if sample_rows is None or height <= sample_rows:
        return None
    return np.sort(np.random.default_rng(SAMPLE_SEED).choice(height, size=sample_rows, replace=False))


def view_of(frame: pl.DataFrame, sample_rows: int | None) -> DatasetView:
    """Return the view of a whole frame (the same view its batches would give)."""
    return stream_view(frame.iter_slices(VIEW_BATCH), frame.height, sample_rows, frame.clear())


def stream_view(batches: Iterable[pl.DataFrame], height: int, sample_rows: int | None,
                empty: pl.DataFrame | None = None) -> DatasetView:
    """Return the view of a dataset of height rows read batch by batch (empty: its schema, when there are none)."""
    positions = sample_positions(height, sample_rows)
    totals = _Totals()
    parts, offset = [], 0
    for batch in batches:
        totals.add(batch)
        parts.append(with_norms(_take(batch, positions, offset)))
        offset += batch.height
    if offset != height:
        raise ValueError(f"dataset view: expected {height} rows, the batches held {offset}")
    rows = pl.concat(parts) if parts else with_norms(pl.DataFrame() if empty is None else empty)
    return DatasetView(rows, height, totals.topics, totals.users, totals.mean_topic_score())


def with_norms(frame: pl.DataFrame) -> pl.DataFrame:
    """Return frame with its embedding column (if any) replaced by embedding_norm."""
    return frame.with_columns(embedding_norm_expr()).drop("embedding") if "embedding" in frame.columns else frame


def _take(batch: pl.DataFrame, positions: np.ndarray | None, offset: int) -> pl.DataFrame:
    """Return the batch's rows whose global positions (batch starts at offset) are in the sample."""
    if positions is None:
        return batch
    lo, hi = np.searchsorted(positions, [offset, offset + batch.height])
    return batch.select(pl.all().gather(positions[lo:hi] - offset))


class _Totals:
    """Running per-topic and per-user row counts and the topic_score sum over the batches seen."""

    def __init__(self) -> None:
        self.topics = pl.DataFrame(schema={"topic": pl.String, COUNT: pl.Int64})
        self.users = pl.DataFrame(schema={"user_id": pl.String, COUNT: pl.Int64})
        self.score_sum, self.score_n = 0.0, 0

    def add(self, batch: pl.DataFrame) -> None:
        """Fold one batch into the totals."""
        if "topic" in batch.columns:
            self.topics = _merge_counts(self.topics, batch, "topic")
        if "user_id" in batch.columns:
            self.users = _merge_counts(self.users, batch, "user_id")
        if "topic_score" in batch.columns:
            scores = batch.get_column("topic_score")
            self.score_n += scores.count()
            self.score_sum += float(scores.cast(pl.Float64).sum())

    def mean_topic_score(self) -> float | None:
        """Return the mean of the non-null topic scores seen (NaN propagates), or None without any."""
        return self.score_sum / self.score_n if self.score_n else None


def _merge_counts(running: pl.DataFrame, batch: pl.DataFrame, key: str) -> pl.DataFrame:
    """Return running's per-key row counts plus the batch's (a null key is a key)."""
    counts = batch.select(pl.col(key).cast(pl.String)).group_by(key).agg(pl.len().cast(pl.Int64).alias(COUNT))
    return pl.concat([running, counts]).group_by(key).agg(pl.col(COUNT).sum())
