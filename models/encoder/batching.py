"""Length-aware planning: buckets, shards and token-budget batches over a whole run's texts."""

from __future__ import annotations

import numpy as np


def bucket_of(lengths: np.ndarray, boundaries: list[int]) -> np.ndarray:
    """Return each length's bucket index: the first boundary >= length (the last bucket takes the rest)."""
    idx = np.searchsorted(np.asarray(boundaries), np.asarray(lengths), side="left")
    return np.minimum(idx, len(boundaries) - 1).astype(np.int32)


def length_order(lengths: np.ndarray) -> np.ndarray:
    """Return row indices sorted by length, longest first, ties by input position (stable)."""
    return np.lexsort((np.arange(len(lengths)), -np.asarray(lengths, dtype=np.int64)))


def plan_batches(lengths: np.ndarray, token_budget: int) -> list[np.ndarray]:
    """Return batches of row indices, each with rows x longest length <= token_budget.

    Rows are taken longest first, so every batch pads only to its own first row and the
    lengths inside a batch are as close as the data allows. A single row longer than the
    budget forms a batch of its own (it still has to be encoded).
    """
    order = length_order(lengths)
    sorted_lengths = np.asarray(lengths, dtype=np.int64)[order]
    batches: list[np.ndarray] = []
    start = 0
    n = len(order)
    while start < n:
        longest = max(int(sorted_lengths[start]), 1)
        rows = max(token_budget // longest, 1)
        stop = min(start + rows, n)
        batches.append(order[start:stop])
        start = stop
    return batches


def plan_packed(lengths: np.ndarray, token_budget: int) -> list[np.ndarray]:
    """Return padding-free batches of row indices, each with real tokens <= token_budget (a longer row alone).

    Rows are still taken longest first: attention runs per row, and rows of similar length keep its work (and the
    CPU's padded attention grid) small.
    """
    order = length_order(lengths)
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64)[order])
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        before = int(ends[start - 1]) if start else 0
        stop = max(int(np.searchsorted(ends, before + token_budget, side="right")), start + 1)
        batches.append(order[start:stop])
        start = stop
    return batches


def assign_shards(lengths: np.ndarray, boundaries: list[int], shard_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (bucket, shard) per row: rows grouped by length bucket, each bucket cut into shards.

    Shards never mix buckets, so each shard's batches pad little; shard numbers are dense and
    deterministic (bucket order, then length order inside the bucket).
    """
    buckets = bucket_of(lengths, boundaries)
    shards = np.empty(len(lengths), dtype=np.int32)
    next_shard = 0
    for bucket in np.unique(buckets):
        rows = np.flatnonzero(buckets == bucket)
        rows = rows[length_order(np.asarray(lengths)[rows])]
        shard_ids = next_shard + np.arange(len(rows)) // shard_size
        shards[rows] = shard_ids
        next_shard = int(shard_ids[-1]) + 1
    return buckets, shards


def padded_tokens(lengths: np.ndarray, batches: list[np.ndarray]) -> int:
    """Return the number of token slots the batches compute, padding included."""
    lengths = np.asarray(lengths)
    return int(sum(len(b) * int(lengths[b].max()) for b in batches if len(b)))
