"""Unit tests of the co-visitation boost: the published neighbour table and the boost arithmetic."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp

from models.recommender.sources.cooccurrence import CooccurrenceSource, neighbour_frame
from serving.boost import boost_scores, neighbours_from_frame

ITEMS = pl.Series("item_id", ["a", "b", "c", "d"])


def _fitted(dense: list[list[float]]) -> CooccurrenceSource:
    empty = sp.csr_matrix((1, len(dense)), dtype=np.float32)
    return CooccurrenceSource(sp.csr_matrix(np.array(dense, dtype=np.float32)), empty, empty, 16)


def test_neighbour_frame_keeps_the_top_per_item_best_first() -> None:
    fitted = _fitted([[0, 0.5, 0.9, 0.1], [0.5, 0, 0, 0], [0, 0, 0, 0], [0.2, 0.3, 0.4, 0]])
    frame = neighbour_frame(fitted, ITEMS, top=2)
    assert frame.schema == pl.Schema({"item_id": pl.String(), "neighbour_id": pl.String(), "weight": pl.Float32()})
    assert frame.rows() == [
        ("a", "c", pytest.approx(0.9)),
        ("a", "b", pytest.approx(0.5)),
        ("b", "a", pytest.approx(0.5)),
        ("d", "c", pytest.approx(0.4)),
        ("d", "b", pytest.approx(0.3)),
    ]  # c has no neighbour: no row


def _table() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "item_id": ["x", "x", "x", "y", "y", "z"],
            "neighbour_id": ["a", "b", "c", "b", "d", "a"],
            "weight": [0.8, 0.4, 0.2, 2.0, 1.0, 0.0],
        },
        schema={"item_id": pl.String(), "neighbour_id": pl.String(), "weight": pl.Float32()},
    )


@pytest.mark.parametrize(
    ("recent", "expected"),
    [
        (["x"], [1.0, 0.5, 0.25, 0.0, 0.0]),  # x's weights over its largest (0.8)
        (["y"], [0.0, 1.0, 0.0, 0.5, 0.0]),  # y's over 2.0
        (["x", "y"], [1.0, 1.5, 0.25, 0.5, 0.0]),  # summed over the recent items
        (["z", "unknown"], [0.0] * 5),  # a zero weight and an item without neighbours add nothing
        ([], [0.0] * 5),
    ],
)
def test_boost_is_the_sum_of_normalised_neighbour_weights(recent: list[str], expected: list[float]) -> None:
    neighbours = neighbours_from_frame(_table())
    got = boost_scores(neighbours, recent, ["a", "b", "c", "d", "not-an-item"])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_the_boost_of_a_candidate_list_with_repeats_and_the_recent_items_themselves() -> None:
    neighbours = neighbours_from_frame(_table())
    np.testing.assert_allclose(boost_scores(neighbours, ["x"], ["x", "b", "b"]), [0.0, 0.5, 0.5])
    assert neighbours.size == 5  # the zero weight is dropped
