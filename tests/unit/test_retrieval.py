"""Unit tests of stage-one retrieval: user vectors and exact chunked top-K with seen items excluded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.recommender.retrieval import Interactions, top_k_items, user_vectors


def _unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _interactions(
    user_rows: list[int], item_rows: list[int], n_users: int, weights: list[float] | None = None, dtype: type = np.uint32
) -> Interactions:
    w = np.ones(len(user_rows), dtype=np.float32) if weights is None else np.asarray(weights, dtype=np.float64)
    return Interactions(np.asarray(user_rows, dtype=dtype), np.asarray(item_rows, dtype=dtype), w, n_users)


def _brute_top_k(users: np.ndarray, items: np.ndarray, seen: Interactions, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference: full float64 scores, seen -> -inf, sort by (score desc, item asc), pad with -1/-inf."""
    k = min(k, items.shape[0])
    scores = users.astype(np.float64) @ items.astype(np.float64).T
    scores[seen.user_rows.astype(np.int64), seen.item_rows.astype(np.int64)] = -np.inf
    rows = np.full((users.shape[0], k), -1, dtype=np.int64)
    vals = np.full((users.shape[0], k), -np.inf)
    for u in range(users.shape[0]):
        order = np.lexsort((np.arange(items.shape[0]), -scores[u]))[:k]
        finite = np.isfinite(scores[u, order])
        rows[u, : finite.sum()] = order[finite]
        vals[u, : finite.sum()] = scores[u, order[finite]]
    return rows, vals


@pytest.fixture(scope="module")
def random_case() -> tuple[np.ndarray, np.ndarray, Interactions]:
    """57 users x 300 items x dim 16, each user with 0..40 seen items (uint32 rows, as polars gives)."""
    rng = np.random.default_rng(42)
    users, items = _unit(rng, 57, 16), _unit(rng, 300, 16)
    u_rows, i_rows = [], []
    for u in range(57):
        picked = rng.choice(300, size=int(rng.integers(0, 41)), replace=False)
        u_rows += [u] * len(picked)
        i_rows += picked.tolist()
    # Shuffle so the interactions are not grouped by user.
    perm = rng.permutation(len(u_rows))
    seen = _interactions(np.array(u_rows)[perm].tolist(), np.array(i_rows)[perm].tolist(), 57)
    return users, items, seen


@pytest.mark.parametrize("chunk", [1, 7, 57, 1000])
def test_top_k_matches_brute_force(random_case: tuple[np.ndarray, np.ndarray, Interactions], chunk: int) -> None:
    users, items, seen = random_case
    rows, scores = top_k_items(torch.from_numpy(users), torch.from_numpy(items), seen, k=10, chunk=chunk)
    ref_rows, ref_scores = _brute_top_k(users, items, seen, 10)
    assert rows.shape == scores.shape == (57, 10)
    assert np.array_equal(rows, ref_rows)
    np.testing.assert_allclose(scores, ref_scores, rtol=0, atol=1e-5)


def test_top_k_identical_across_chunk_sizes(random_case: tuple[np.ndarray, np.ndarray, Interactions]) -> None:
    users, items, seen = random_case
    results = [top_k_items(torch.from_numpy(users), torch.from_numpy(items), seen, 10, c) for c in (1, 7, 57, 1000)]
    for rows, scores in results[1:]:
        assert np.array_equal(rows, results[0][0])
        # Scores may differ in the last float32 bit (a 1-row matmul takes another BLAS path).
        np.testing.assert_allclose(scores, results[0][1], rtol=0, atol=1e-6)


def test_top_k_never_returns_seen(random_case: tuple[np.ndarray, np.ndarray, Interactions]) -> None:
    users, items, seen = random_case
    rows, _ = top_k_items(torch.from_numpy(users), torch.from_numpy(items), seen, k=25, chunk=7)
    seen_pairs = set(zip(seen.user_rows.tolist(), seen.item_rows.tolist(), strict=False))
    assert seen_pairs, "the fixture must have seen items"
    for u in range(rows.shape[0]):
        assert not {(u, i) for i in rows[u].tolist()} & seen_pairs


def test_top_k_excludes_best_item_when_seen() -> None:
    items = np.eye(4, dtype=np.float32)
    users = np.array([[1.0, 0.5, 0.0, 0.0], [1.0, 0.5, 0.0, 0.0]], dtype=np.float32)
    users /= np.linalg.norm(users, axis=1, keepdims=True)
    seen = _interactions([1], [0], 2, dtype=np.int64)
    rows, scores = top_k_items(torch.from_numpy(users), torch.from_numpy(items), seen, k=2, chunk=1)
    assert rows.tolist() == [[0, 1], [1, 2]]
    np.testing.assert_allclose(scores[1], [0.5 / np.sqrt(1.25), 0.0], atol=1e-6)


def test_top_k_pads_users_with_few_unseen_items() -> None:
    rng = np.random.default_rng(3)
    users, items = _unit(rng, 3, 8), _unit(rng, 12, 8)
    # User 0 has seen 9 of 12 items (3 left), user 1 has seen all 12, user 2 none.
    seen = _interactions([0] * 9 + [1] * 12, list(range(9)) + list(range(12)), 3)
    rows, scores = top_k_items(torch.from_numpy(users), torch.from_numpy(items), seen, k=5, chunk=2)
    assert sorted(rows[0, :3].tolist()) == [9, 10, 11]
    assert rows[0, 3:].tolist() == [-1, -1]
    assert np.all(np.isneginf(scores[0, 3:])) and np.all(np.isfinite(scores[0, :3]))
    assert rows[1].tolist() == [-1] * 5 and np.all(np.isneginf(scores[1]))
    assert np.all(rows[2] >= 0) and np.all(np.isfinite(scores[2]))
    ref_rows, _ = _brute_top_k(users, items, seen, 5)
    assert np.array_equal(rows, ref_rows)


def test_top_k_k_larger_than_catalogue() -> None:
    rng = np.random.default_rng(4)
    users, items = _unit(rng, 2, 8), _unit(rng, 6, 8)
    seen = _interactions([0], [2], 2)
    rows, scores = top_k_items(torch.from_numpy(users), torch.from_numpy(items), seen, k=50, chunk=10)
    assert rows.shape == (2, 6)
    assert rows[0, -1] == -1 and np.isneginf(scores[0, -1])
    assert sorted(rows[1].tolist()) == list(range(6))


def test_top_k_ties_broken_by_lower_item_index() -> None:
    rng = np.random.default_rng(5)
    items = _unit(rng, 50, 8)
    user = _unit(rng, 1, 8)
    # Three exact copies of the user's own direction, spread over the catalogue, plus two copies
    # of a second-best vector: equal scores must come out lowest item index first.
    second = user[0] + 0.3 * _unit(rng, 1, 8)[0]
    second /= np.linalg.norm(second)
    for i in (41, 7, 23):
        items[i] = user[0]
    for i in (30, 12):
        items[i] = second
    seen = _interactions([], [], 1)
    for chunk in (1, 4):
        rows, scores = top_k_items(torch.from_numpy(user), torch.from_numpy(items), seen, k=5, chunk=chunk)
        assert rows[0].tolist() == [7, 23, 41, 12, 30]
        assert scores[0, 0] == scores[0, 1] == scores[0, 2]
        assert scores[0, 3] == scores[0, 4] < scores[0, 2]


def test_top_k_ties_broken_by_lower_item_index_wide_tie() -> None:
    rng = np.random.default_rng(6)
    items = _unit(rng, 300, 16)
    users = np.zeros((1, 16), dtype=np.float32)  # a user with no interactions: every score is 0
    rows, _ = top_k_items(torch.from_numpy(users), torch.from_numpy(items), _interactions([], [], 1), k=10, chunk=1)
    assert rows[0].tolist() == list(range(10))


def test_user_vectors_weighted_mean_normalised() -> None:
    items = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0.6, 0.8, 0]], dtype=np.float32)
    inter = _interactions([0, 0, 1, 1, 1, 2], [0, 1, 0, 3, 2, 2], 4, weights=[3.0, 1.0, 1.0, 2.0, 0.5, 2.0])
    got = user_vectors(torch.from_numpy(items), inter).numpy()
    raw = np.array(
        [
            3.0 * items[0] + 1.0 * items[1],
            1.0 * items[0] + 2.0 * items[3] + 0.5 * items[2],
            2.0 * items[2],
            np.zeros(3),
        ]
    )
    expected = raw.copy()
    expected[:3] /= np.linalg.norm(raw[:3], axis=1, keepdims=True)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_allclose(got[0], [3 / np.sqrt(10), 1 / np.sqrt(10), 0], atol=1e-6)
    assert got.dtype == np.float32
    # A user without interactions stays the zero vector (no NaN from normalising).
    assert np.all(got[3] == 0)


def test_user_vectors_repeated_interactions_add_up() -> None:
    items = np.array([[1, 0], [0, 1]], dtype=np.float32)
    twice = _interactions([0, 0, 0], [0, 0, 1], 1, weights=[1.0, 1.0, 1.0])
    once = _interactions([0, 0], [0, 1], 1, weights=[2.0, 1.0])
    a = user_vectors(torch.from_numpy(items), twice).numpy()
    b = user_vectors(torch.from_numpy(items), once).numpy()
    np.testing.assert_allclose(a, b, atol=1e-7)
    np.testing.assert_allclose(a[0], [2 / np.sqrt(5), 1 / np.sqrt(5)], atol=1e-6)


def test_user_vectors_feed_top_k() -> None:
    rng = np.random.default_rng(8)
    items = _unit(rng, 40, 8)
    inter = _interactions([0, 0, 1], [3, 5, 9], 2, weights=[1.0, 2.0, 1.0])
    users = user_vectors(torch.from_numpy(items), inter)
    rows, _ = top_k_items(users, torch.from_numpy(items), inter, k=5, chunk=1)
    ref_rows, _ = _brute_top_k(users.numpy(), items, inter, 5)
    assert np.array_equal(rows, ref_rows)
    assert not {3, 5} & set(rows[0].tolist()) and 9 not in rows[1]
