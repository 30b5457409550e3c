"""Top-n per row of a sparse triple: the dense Lists form and the entries-only form keep the same entries."""

from __future__ import annotations

import numpy as np
import pytest

from models.recommender.sources.base import top_n_entries, top_n_per_row


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_entries_are_the_filled_slots_of_the_dense_form_in_the_same_order(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_rows, n = 50, 4
    rows = rng.integers(0, n_rows, 600)
    cols = rng.integers(0, 200, 600)
    values = rng.integers(0, 5, 600).astype(np.float32)  # many ties: order is value desc, then col asc
    dense = top_n_per_row(rows, cols, values, n_rows, n)
    filled = dense.rows >= 0
    r, c, v = top_n_entries(rows, cols, values, n)
    assert np.array_equal(r, np.repeat(np.arange(n_rows), n).reshape(filled.shape)[filled])
    assert np.array_equal(c, dense.rows[filled]) and np.array_equal(v, dense.scores[filled])
    assert np.bincount(r, minlength=n_rows).max() <= n


def test_no_entries_give_empty_triples() -> None:
    empty = np.zeros(0, dtype=np.int64)
    r, c, v = top_n_entries(empty, empty, np.zeros(0, dtype=np.float32), 3)
    assert len(r) == len(c) == len(v) == 0
