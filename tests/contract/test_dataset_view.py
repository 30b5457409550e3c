"""Contract tier: a dataset streamed batch by batch is seen by its suite exactly as the whole frame is."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import polars as pl
import pytest

from data_contracts.dataset_view import DatasetView, ViewBuilder, view_of
from data_contracts.datasets import dataset_stats


def stream_view(batches: Iterable[pl.DataFrame]) -> DatasetView:
    """Return the view of a dataset read batch by batch (as the streamed contracts build it)."""
    builder = ViewBuilder()
    for batch in batches:
        builder.add(batch)
    return builder.view()


def scores_frame(n: int, seed: int = 0) -> pl.DataFrame:
    """Return n item_scores-like rows: ids, a topic (some null), a score and a 4-float embedding."""
    rng = np.random.default_rng(seed)
    topics = [["sports", "tech", "food", None][t] for t in rng.integers(0, 4, n)]
    return pl.DataFrame(
        {
            "item_id": [f"i{i:05d}" for i in range(n)],
            "topic": topics,
            "topic_score": rng.uniform(0, 1, n),
            "user_id": [f"u{i % 37:02d}" for i in range(n)],
            "embedding": rng.normal(size=(n, 4)).astype(np.float32).tolist(),
        }
    )


def batches(frame: pl.DataFrame, size: int) -> list[pl.DataFrame]:
    """Return frame cut into batches of size rows (the last one shorter)."""
    return [frame.slice(start, size) for start in range(0, frame.height, size)]


@pytest.mark.parametrize("batch", [1, 7, 100, 5000])
def test_streamed_view_equals_the_whole_frame_view(batch: int) -> None:
    frame = scores_frame(1000)
    whole, streamed = view_of(frame), stream_view(batches(frame, batch))
    assert streamed.height == whole.height == 1000 and streamed.columns == whole.columns == tuple(frame.columns)
    assert streamed.topic_counts.sort("topic").equals(whole.topic_counts.sort("topic"))
    assert streamed.user_counts.sort("user_id").equals(whole.user_counts.sort("user_id"))
    assert streamed.topic_score_mean == pytest.approx(frame["topic_score"].mean(), rel=1e-12)


def test_aggregates_count_every_row() -> None:
    frame = scores_frame(1000)
    view = stream_view(batches(frame, 64))
    expected = frame.group_by("topic").len().sort("topic", nulls_last=True)
    got = view.topic_counts.sort("topic", nulls_last=True)
    assert got["topic"].to_list() == expected["topic"].to_list() and got["n"].to_list() == expected["len"].to_list()
    assert view.user_counts.height == 37 and view.user_counts["n"].sum() == 1000
    stats = dataset_stats("item_scores", view)
    assert stats["row_count"] == 1000 and sum(v for k, v in stats.items() if k.startswith("topic_share:")) == pytest.approx(1)


def test_builder_passes_batches_through_unchanged() -> None:
    frame, builder = scores_frame(20), ViewBuilder()
    passed = [builder.add(batch) for batch in batches(frame, 6)]
    assert pl.concat(passed).equals(frame) and builder.view().height == 20


def test_nan_topic_score_propagates_to_the_mean_and_leaves_it_out_of_the_stats() -> None:
    frame = scores_frame(10)
    nan = frame.with_columns(
        pl.when(pl.col("item_id") == "i00003").then(float("nan")).otherwise(pl.col("topic_score")).alias("topic_score")
    )
    assert math.isnan(view_of(nan).topic_score_mean)  # type: ignore[arg-type]
    assert "mean_topic_score" not in dataset_stats("item_scores", nan)
    assert "mean_topic_score" in dataset_stats("item_scores", frame)


def test_empty_dataset_has_no_rows_and_no_mean() -> None:
    view = stream_view([])
    assert view.height == 0 and view.topic_score_mean is None and view.topic_counts.height == 0
    assert view_of(scores_frame(5).clear()).columns == ("item_id", "topic", "topic_score", "user_id", "embedding")
