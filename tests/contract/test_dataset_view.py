"""Contract tier: a dataset streamed batch by batch is seen by its suite exactly as the whole frame is."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from data_contracts.dataset_view import sample_positions, stream_view, view_of
from data_contracts.datasets import dataset_stats


def scores_frame(n: int, seed: int = 0) -> pl.DataFrame:
    """Return n item_scores-like rows: ids, a topic (some null), a score and a 4-float embedding."""
    rng = np.random.default_rng(seed)
    topics = [["sports", "tech", "food", None][t] for t in rng.integers(0, 4, n)]
    return pl.DataFrame({
        "item_id": [f"i{i:05d}" for i in range(n)], "topic": topics, "topic_score": rng.uniform(0, 1, n),
        "user_id": [f"u{i % 37:02d}" for i in range(n)],
        "embedding": rng.normal(size=(n, 4)).astype(np.float32).tolist(),
    })


def batches(frame: pl.DataFrame, size: int) -> list[pl.DataFrame]:
    """Return frame cut into batches of size rows (the last one shorter)."""
    return [frame.slice(start, size) for start in range(0, frame.height, size)]


@pytest.mark.parametrize("batch", [1, 7, 100, 5000])
def test_streamed_view_equals_the_whole_frame_view(batch: int) -> None:
    frame = scores_frame(1000)
    whole, streamed = view_of(frame, 120), stream_view(batches(frame, batch), frame.height, 120)
    assert streamed.rows.equals(whole.rows) and streamed.rows.height == 120
    assert streamed.height == whole.height == 1000
    assert streamed.topic_counts.sort("topic").equals(whole.topic_counts.sort("topic"))
    assert streamed.user_counts.sort("user_id").equals(whole.user_counts.sort("user_id"))
    assert streamed.topic_score_mean == pytest.approx(frame["topic_score"].mean(), rel=1e-12)


def test_aggregates_count_every_row_not_the_sample() -> None:
    frame = scores_frame(1000)
    view = stream_view(batches(frame, 64), frame.height, 50)
    expected = frame.group_by("topic").len().sort("topic", nulls_last=True)
    got = view.topic_counts.sort("topic", nulls_last=True)
    assert got["topic"].to_list() == expected["topic"].to_list() and got["n"].to_list() == expected["len"].to_list()
    assert view.user_counts.height == 37 and view.user_counts["n"].sum() == 1000
    stats = dataset_stats("item_scores", view)
    assert stats["row_count"] == 1000 and sum(v for k, v in stats.items() if k.startswith("topic_share:")) == pytest.approx(1)


def test_sample_is_seeded_sorted_and_only_above_the_limit() -> None:
    positions = sample_positions(1000, 50)
    assert positions is not None and len(set(positions.tolist())) == 50 and np.all(np.diff(positions) > 0)
    assert np.array_equal(positions, sample_positions(1000, 50))
    assert sample_positions(50, 50) is None and sample_positions(10, None) is None
    frame = scores_frame(1000)
    assert view_of(frame, 50).rows["item_id"].to_list() == frame["item_id"].gather(positions).to_list()


def test_embeddings_become_norms_and_nan_propagates() -> None:
    frame = scores_frame(10).with_columns(pl.Series("embedding", [[3.0, 4.0, 0.0, 0.0]] * 10, dtype=pl.List(pl.Float32)))
    view = view_of(frame, None)
    assert "embedding" not in view.columns and view.rows["embedding_norm"].to_list() == [5.0] * 10
    nan = frame.with_columns(pl.when(pl.col("item_id") == "i00003").then(float("nan")).otherwise(pl.col("topic_score"))
                             .alias("topic_score"))
    assert math.isnan(view_of(nan, None).topic_score_mean)
    assert "mean_topic_score" not in dataset_stats("item_scores", nan)


def test_batches_that_do_not_add_up_are_an_error() -> None:
    frame = scores_frame(100)
    with pytest.raises(ValueError, match="expected 101 rows, the batches held 100"):
        stream_view(batches(frame, 30), 101, None)


def test_empty_dataset_keeps_its_columns() -> None:
    empty = scores_frame(5).clear()
    view = view_of(empty, 10)
    assert view.height == 0 and view.columns == ["item_id", "topic", "topic_score", "user_id", "embedding_norm"]
    assert view.topic_score_mean is None
