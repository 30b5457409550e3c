"""Unit tests of length planning: buckets, length order, token-budget batches and shards."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.encoder.batching import assign_shards, bucket_of, length_order, padded_tokens, plan_batches

BOUNDARIES = [32, 64, 128, 256]


def _check_plan(lengths: np.ndarray, budget: int, batches: list[np.ndarray]) -> None:
    """Assert the plan invariants: every row once, budget kept, longest first, greedy batches."""
    lengths = np.asarray(lengths, dtype=np.int64)
    flat = np.concatenate(batches) if batches else np.array([], dtype=np.int64)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    assert all(len(b) > 0 for b in batches)
    for i, batch in enumerate(batches):
        longest = int(lengths[batch].max())
        if len(batch) > 1:
            assert len(batch) * longest <= budget
        # The first row of a batch is its longest: padding is to the first row only.
        assert int(lengths[batch[0]]) == longest
        if i + 1 < len(batches):
            # Greedy: one more row would have broken the budget.
            assert (len(batch) + 1) * max(longest, 1) > budget
    # Concatenated in plan order, lengths never grow: the whole run is taken longest first.
    ordered = lengths[flat]
    assert np.all(np.diff(ordered) <= 0)


@pytest.mark.parametrize(
    ("length", "bucket"),
    [(1, 0), (31, 0), (32, 0), (33, 1), (64, 1), (65, 2), (128, 2), (129, 3), (256, 3), (257, 3), (10_000, 3)],
)
def test_bucket_of_boundaries(length: int, bucket: int) -> None:
    assert bucket_of(np.array([length]), BOUNDARIES).tolist() == [bucket]


def test_bucket_of_vectorised_dtype() -> None:
    got = bucket_of(np.array([300, 1, 64, 65]), BOUNDARIES)
    assert got.tolist() == [3, 0, 1, 2]
    assert got.dtype == np.int32


def test_bucket_of_single_boundary_takes_everything() -> None:
    assert bucket_of(np.array([1, 5, 500]), [10]).tolist() == [0, 0, 0]


@pytest.mark.parametrize(
    ("lengths", "expected"),
    [
        ([3, 9, 1, 9, 3], [1, 3, 0, 4, 2]),
        ([5, 5, 5], [0, 1, 2]),
        ([1, 2, 3, 4], [3, 2, 1, 0]),
        ([7], [0]),
        ([], []),
    ],
)
def test_length_order_longest_first_stable(lengths: list[int], expected: list[int]) -> None:
    assert length_order(np.array(lengths, dtype=np.int64)).tolist() == expected


def test_plan_batches_example() -> None:
    lengths = np.array([10, 40, 20, 40, 5, 20])
    batches = plan_batches(lengths, 60)
    assert [b.tolist() for b in batches] == [[1], [3], [2, 5, 0], [4]]
    _check_plan(lengths, 60, batches)
    assert [b.tolist() for b in plan_batches(lengths, 80)] == [[1, 3], [2, 5, 0, 4]]


def test_plan_batches_over_budget_row_alone() -> None:
    lengths = np.array([10, 500, 10, 10])
    batches = plan_batches(lengths, 64)
    assert batches[0].tolist() == [1]
    assert [b.tolist() for b in batches[1:]] == [[0, 2, 3]]
    _check_plan(lengths, 64, batches)


def test_plan_batches_several_over_budget_rows_each_alone() -> None:
    lengths = np.array([300, 200, 400])
    batches = plan_batches(lengths, 100)
    assert [b.tolist() for b in batches] == [[2], [0], [1]]


def test_plan_batches_empty() -> None:
    assert plan_batches(np.array([], dtype=np.int64), 1024) == []
    assert padded_tokens(np.array([], dtype=np.int64), []) == 0


def test_padded_tokens() -> None:
    lengths = np.array([3, 7, 2, 7, 1])
    batches = [np.array([1, 3]), np.array([0, 2, 4])]
    assert padded_tokens(lengths, batches) == 2 * 7 + 3 * 3
    # Empty batches compute nothing.
    assert padded_tokens(lengths, [np.array([], dtype=np.int64), np.array([2])]) == 2


def test_assign_shards_example() -> None:
    lengths = np.array([10, 100, 20, 300, 15, 90, 30, 200])
    buckets, shards = assign_shards(lengths, [32, 128, 512], shard_size=2)
    assert buckets.tolist() == [0, 1, 0, 2, 0, 1, 0, 2]
    # Bucket 0 rows longest first: 6(30), 2(20), 4(15), 0(10) -> shards 0, 0, 1, 1.
    # Bucket 1: 1(100), 5(90) -> shard 2. Bucket 2: 3(300), 7(200) -> shard 3.
    assert shards.tolist() == [1, 2, 0, 3, 1, 2, 0, 3]


@pytest.mark.parametrize("shard_size", [1, 3, 16, 1000])
def test_assign_shards_invariants(shard_size: int) -> None:
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 600, size=257)
    buckets, shards = assign_shards(lengths, BOUNDARIES, shard_size)
    assert np.array_equal(buckets, bucket_of(lengths, BOUNDARIES))
    ids = np.unique(shards)
    assert ids.tolist() == list(range(len(ids)))  # dense, from 0
    for shard in ids:
        rows = shards == shard
        assert len(np.unique(buckets[rows])) == 1  # never mixes buckets
        assert rows.sum() <= shard_size
    # Shards follow bucket order.
    first_bucket = [int(buckets[shards == s][0]) for s in ids]
    assert first_bucket == sorted(first_bucket)
    again = assign_shards(lengths.copy(), BOUNDARIES, shard_size)
    assert np.array_equal(again[0], buckets) and np.array_equal(again[1], shards)


def test_assign_shards_empty() -> None:
    buckets, shards = assign_shards(np.array([], dtype=np.int64), BOUNDARIES, 4)
    assert len(buckets) == 0 and len(shards) == 0


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 600), min_size=0, max_size=300),
    budget=st.integers(64, 8192),
)
def test_plan_batches_property(lengths: list[int], budget: int) -> None:
    arr = np.array(lengths, dtype=np.int64)
    batches = plan_batches(arr, budget)
    _check_plan(arr, budget, batches)
    # Padded slots are bounded by real tokens below and by padding everything to the global max above.
    padded = padded_tokens(arr, batches)
    assert int(arr.sum()) <= padded <= len(arr) * (int(arr.max()) if len(arr) else 0)
