"""Unit tests of top-K over item blocks (ItemChunks): same rows as the whole-matrix top-K, ties included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.recommender.retrieval import Interactions, ItemChunks, top_k_items, user_vectors


def _unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _seen(rng: np.random.Generator, n_users: int, n_items: int, most: int) -> Interactions:
    users, items = [], []
    for u in range(n_users):
        picked = rng.choice(n_items, size=int(rng.integers(0, most + 1)), replace=False)
        users += [u] * len(picked)
        items += picked.tolist()
    perm = rng.permutation(len(users))
    return Interactions(
        np.asarray(users, np.uint32)[perm], np.asarray(items, np.uint32)[perm], rng.random(len(users)).astype(np.float32), n_users
    )


@pytest.mark.parametrize("block", [1, 3, 7, 64, 300, 1000])
@pytest.mark.parametrize("chunk", [1, 9, 57])
def test_streamed_equals_whole_matrix(block: int, chunk: int) -> None:
    rng = np.random.default_rng(42)
    users, items = _unit(rng, 57, 16), _unit(rng, 300, 16)
    seen = _seen(rng, 57, 300, 40)
    whole = top_k_items(torch.from_numpy(users), torch.from_numpy(items), seen, 10, chunk)
    streamed = top_k_items(torch.from_numpy(users), ItemChunks.of(items, block), seen, 10, chunk)
    assert np.array_equal(streamed[0], whole[0])
    np.testing.assert_allclose(streamed[1], whole[1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("block", [1, 2, 5, 11, 50])
def test_streamed_ties_broken_by_lower_item_index(block: int) -> None:
    rng = np.random.default_rng(5)
    items, user = _unit(rng, 50, 8), _unit(rng, 1, 8)
    for i in (41, 7, 23):  # exact ties in different blocks
        items[i] = user[0]
    rows, scores = top_k_items(
        torch.from_numpy(user),
        ItemChunks.of(items, block),
        Interactions(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), 1),
        3,
        1,
    )
    assert rows[0].tolist() == [7, 23, 41]
    assert scores[0, 0] == scores[0, 1] == scores[0, 2]


def test_streamed_wide_tie_and_unfillable_slots() -> None:
    rng = np.random.default_rng(6)
    items = _unit(rng, 30, 4)
    users = np.zeros((2, 4), dtype=np.float32)  # every score 0: the lowest unseen rows win
    seen = Interactions(np.array([0, 0, 1] + [1] * 29), np.array([0, 5, 0, *list(range(1, 30))]), np.ones(32, np.float32), 2)
    rows, scores = top_k_items(torch.from_numpy(users), ItemChunks.of(items, 4), seen, 5, 2)
    assert rows[0].tolist() == [1, 2, 3, 4, 6]
    assert rows[1].tolist() == [-1] * 5 and np.all(np.isneginf(scores[1]))


def test_user_vectors_from_chunks_are_identical() -> None:
    rng = np.random.default_rng(7)
    items = _unit(rng, 200, 16)
    seen = _seen(rng, 20, 200, 30)
    whole = user_vectors(torch.from_numpy(items), seen)
    streamed = user_vectors(ItemChunks.of(items, 17), seen)
    assert torch.equal(whole, streamed)
