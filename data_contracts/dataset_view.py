"""What a dataset suite reads of a dataset: whole-dataset aggregates gathered while its batches pass by.

The suites check dataset-level properties only (row-level rules are the pandera contracts' job), so they
need no rows at all:

- ``height``: the row count of the whole dataset;
- rows per topic and the topic_score mean (item_scores), rows per user (interactions, user_candidates).

`ViewBuilder` folds batches in as the stage that reads them for its row contracts streams them, so a dataset
is read once for both kinds of contract, and a 1M-item dataset costs a few small tables, not its rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

COUNT = "n"


@dataclass(frozen=True)
class DatasetView:
    """A dataset as its suite reads it: columns, row count, per-topic and per-user counts, mean topic_score."""

    columns: tuple[str, ...]
    height: int
    topic_counts: pl.DataFrame  # topic, n (rows per topic; empty without a topic column)
    user_counts: pl.DataFrame  # user_id, n (rows per user; empty without a user_id column)
    topic_score_mean: float | None  # mean of the non-null topic scores (NaN if one is NaN); None without any


class ViewBuilder:
    """Running aggregates of the batches seen so far; `view()` returns them as a DatasetView."""

    def __init__(self) -> None:
        self.columns: tuple[str, ...] = ()
        self.height = 0
        self.topics = pl.DataFrame(schema={"topic": pl.String, COUNT: pl.Int64})
        self.users = pl.DataFrame(schema={"user_id": pl.String, COUNT: pl.Int64})
        self.score_sum, self.score_n = 0.0, 0

    def add(self, batch: pl.DataFrame) -> pl.DataFrame:
        """Fold one batch into the aggregates and return it unchanged (so a stream can pass through)."""
        self.columns = self.columns or tuple(batch.columns)
        self.height += batch.height
        if "topic" in batch.columns:
            self.topics = _merge_counts(self.topics, batch, "topic")
        if "user_id" in batch.columns:
            self.users = _merge_counts(self.users, batch, "user_id")
        if "topic_score" in batch.columns:
            scores = batch.get_column("topic_score")
            self.score_n += scores.count()
            self.score_sum += float(scores.cast(pl.Float64).sum())
        return batch

    def view(self) -> DatasetView:
        """Return the aggregates of every batch added."""
        mean = self.score_sum / self.score_n if self.score_n else None
        return DatasetView(self.columns, self.height, self.topics, self.users, mean)


def view_of(frame: pl.DataFrame) -> DatasetView:
    """Return the view of a whole frame (the same view its batches would give)."""
    builder = ViewBuilder()
    builder.add(frame)
    return builder.view()


def _merge_counts(running: pl.DataFrame, batch: pl.DataFrame, key: str) -> pl.DataFrame:
    """Return running's per-key row counts plus the batch's (a null key is a key)."""
    counts = batch.select(pl.col(key).cast(pl.String)).group_by(key).agg(pl.len().cast(pl.Int64).alias(COUNT))
    return pl.concat([running, counts]).group_by(key).agg(pl.col(COUNT).sum())
