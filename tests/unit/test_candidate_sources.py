"""Unit tests of the candidate sources on tiny inline frames with answers checkable by hand."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest

from models.recommender.retrieval import ItemChunks
from models.recommender.sources.als import AlsParams, fit_als
from models.recommender.sources.base import Catalogue, EncodedLog, History, Source, encode_run, history_of, user_item_matrix
from models.recommender.sources.content import fit_content
from models.recommender.sources.cooccurrence import CooccurrenceParams, fit_cooccurrence, user_sequences
from models.recommender.sources.popularity import (
    PopularityParams,
    fit_most_popular,
    fit_topic_trending,
    fit_trending,
    robust_trending,
    trending_scores,
)

NOW = datetime(2026, 11, 1, tzinfo=UTC)
WEIGHTS = {"view": 1.0, "click": 2.0, "purchase": 4.0}
PLAIN = PopularityParams(trend_min_users=1, trend_user_cap=np.inf)  # plain decayed counts: the hand-checked cases


def _frames(
    rows: Sequence[tuple[str, str, str, float]], items: Sequence[tuple[str, str, float]]
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Return (items, interactions): items (id, topic, age days), interactions (user, item, event, age days)."""
    item_frame = pl.DataFrame(
        {
            "item_id": [i for i, _, _ in items],
            "topic": [t for _, t, _ in items],
            "created_at": [NOW - timedelta(days=a) for _, _, a in items],
        }
    )
    inter = pl.DataFrame(
        {
            "user_id": [r[0] for r in rows],
            "item_id": [r[1] for r in rows],
            "event": [r[2] for r in rows],
            "ts": [NOW - timedelta(days=r[3]) for r in rows],
        }
    )
    return item_frame, inter


def _history(
    items: pl.DataFrame, inter: pl.DataFrame, keep_users: list[str] | None = None
) -> tuple[Catalogue, EncodedLog, History]:
    catalogue, log = encode_run(items, inter)
    keep = None
    if keep_users is not None:
        ids = catalogue.user_ids.to_list()
        keep = np.isin(log.user_rows, [ids.index(u) for u in keep_users])
    return catalogue, log, history_of(log, catalogue, keep, NOW, WEIGHTS, 14.0)


ITEMS = [("a", "x", 200), ("b", "x", 200), ("c", "y", 200), ("d", "y", 200), ("e", "y", 200), ("f", "x", 2)]


@pytest.fixture()
def co_case() -> tuple[Catalogue, EncodedLog, History]:
    """u1, u2 consume a then b; u3 only a; u4 c then d; u5 is in the log but has no history in the History."""
    rows = [
        ("u1", "a", "view", 5),
        ("u1", "b", "view", 4),
        ("u2", "a", "view", 5),
        ("u2", "b", "click", 4),
        ("u3", "a", "view", 3),
        ("u4", "c", "view", 3),
        ("u4", "d", "view", 2),
        ("u5", "e", "view", 1),
    ]
    items, inter = _frames(rows, ITEMS)
    return _history(items, inter, keep_users=["u1", "u2", "u3", "u4"])


def _names(catalogue: Catalogue, rows: np.ndarray) -> list[str]:
    return [catalogue.item_ids[int(r)] for r in rows if r >= 0]


def test_encode_run_drops_unknown_items_and_sorts_by_user_then_time() -> None:
    items, inter = _frames(
        [("u2", "a", "view", 1), ("u1", "zzz", "view", 2), ("u1", "b", "view", 3), ("u1", "a", "view", 1)], ITEMS
    )
    catalogue, log = encode_run(items, inter)
    assert catalogue.user_ids.to_list() == ["u1", "u2"]
    assert log.user_rows.tolist() == [0, 0, 1] and _names(catalogue, log.item_rows) == ["b", "a", "a"]
    assert catalogue.topic_names == ("x", "y") and catalogue.topic.tolist() == [0, 0, 1, 1, 1, 0]


def test_history_weights_follow_event_and_recency() -> None:
    items, inter = _frames([("u1", "a", "click", 14.0), ("u1", "b", "purchase", 0.0), ("u1", "c", "unknown", 0.0)], ITEMS)
    _, _, history = _history(items, inter)
    np.testing.assert_allclose(history.weights, [2.0 * 0.5, 4.0, 0.0], rtol=1e-6)


def test_cooccurrence_finds_the_pair_and_excludes_seen(co_case: tuple[Catalogue, EncodedLog, History]) -> None:
    catalogue, _, history = co_case
    source = fit_cooccurrence(history, CooccurrenceParams(window=3))
    users = catalogue.user_ids.to_list()
    lists = source.recommend(np.array([users.index("u3"), users.index("u1"), users.index("u5")]), 3)["cooccurrence"]
    assert _names(catalogue, lists.rows[0]) == ["b"]  # a -> b from u1 and u2; c, d never with a
    assert _names(catalogue, lists.rows[1]) == []  # u1 has seen a and b, the only items linked to them
    assert _names(catalogue, lists.rows[2]) == [] and np.isneginf(lists.scores[2]).all()  # no history


def test_cooccurrence_similarity_by_hand() -> None:
    """Two users, both a then b, views 0 days old: s(a, b) = co / sqrt(m_a m_b) = 1 / log2(4) * 2 / 2."""
    items, inter = _frames(
        [("u1", "a", "view", 0), ("u1", "b", "view", 0), ("u2", "a", "view", 0), ("u2", "b", "view", 0), ("u3", "a", "view", 0)],
        ITEMS,
    )
    _, _, history = _history(items, inter)
    source = fit_cooccurrence(history, CooccurrenceParams(window=1))
    # co(a, b) = 2 users x sqrt(1 x 1) / distance 1 / log2(2 + 2 items) = 1.0; m_a = 3 (three users), m_b = 2
    a, b = 0, 1
    assert source.table[a, b] == pytest.approx(1.0 / np.sqrt(3 * 2), rel=1e-5)
    u3 = 2
    lists = source.recommend(np.array([u3]), 2)["cooccurrence"]
    assert lists.rows[0, 0] == b and lists.scores[0, 0] == pytest.approx(1.0 / np.sqrt(6), rel=1e-5)


def test_cooccurrence_passes_do_not_change_the_table(co_case: tuple[Catalogue, EncodedLog, History]) -> None:
    _, _, history = co_case
    one = fit_cooccurrence(history, CooccurrenceParams(window=3)).table
    many = fit_cooccurrence(history, CooccurrenceParams(window=3, pairs_per_pass=2)).table
    assert (one != many).nnz == 0


def test_user_sequences_keep_the_latest_distinct_items() -> None:
    items, inter = _frames(
        [("u1", "a", "view", 5), ("u1", "b", "view", 4), ("u1", "a", "click", 3), ("u1", "c", "view", 2)], ITEMS
    )
    catalogue, _, history = _history(items, inter)
    seq = user_sequences(history, max_history=2)
    assert _names(catalogue, seq.items) == ["a", "c"]  # by latest interaction: b (4), a (3), c (2): last two


def _block_case() -> tuple[Catalogue, History]:
    """Users 0-9 consume items a, b, c; users 10-19 items d, e; user 'probe' only a and b."""
    rows = [(f"g1-{u}", i, "view", 1.0) for u in range(10) for i in "abc"]
    rows += [(f"g2-{u}", i, "view", 1.0) for u in range(10) for i in "de"]
    rows += [("probe", "a", "view", 1.0), ("probe", "b", "view", 1.0)]
    items, inter = _frames(rows, ITEMS)
    catalogue, _, history = _history(items, inter)
    return catalogue, history


def test_als_ranks_the_co_consumed_item_first_and_is_deterministic() -> None:
    catalogue, history = _block_case()
    params = AlsParams(factors=4, iterations=10, seed=3, threads=1)
    first, second = fit_als(history, params), fit_als(history, params)
    probe = np.array([catalogue.user_ids.to_list().index("probe")])
    lists = first.recommend(probe, 3)["als"]
    assert _names(catalogue, lists.rows[0])[0] == "c"
    assert "a" not in _names(catalogue, lists.rows[0]) and "f" not in _names(catalogue, lists.rows[0])  # seen; no interactions
    np.testing.assert_array_equal(first.model.item_factors, second.model.item_factors)


def test_als_asked_for_more_items_than_a_user_has_unseen_returns_only_unseen_ones() -> None:
    """probe saw a and b; of six items, f has no interaction: only c, d and e may come back, then empty slots."""
    catalogue, history = _block_case()
    probe = np.array([catalogue.user_ids.to_list().index("probe")])
    lists = fit_als(history, AlsParams(factors=4, iterations=10, seed=3, threads=1)).recommend(probe, 6)["als"]
    assert sorted(_names(catalogue, lists.rows[0])) == ["c", "d", "e"]
    assert (lists.rows[0, 3:] == -1).all() and np.isneginf(lists.scores[0, 3:]).all()


def test_als_fitted_on_a_history_without_interactions_returns_empty_lists() -> None:
    """Every interaction held out (a log of one interaction per user): no item is warm, so no slot is filled."""
    items, inter = _frames([("u1", "a", "view", 5), ("u2", "b", "view", 4)], ITEMS)
    _, _, history = _history(items, inter, keep_users=[])
    lists = fit_als(history, AlsParams(factors=4, iterations=2, seed=3, threads=1)).recommend(np.arange(2), 3)["als"]
    assert lists.rows.shape == (2, 3) and (lists.rows == -1).all() and np.isneginf(lists.scores).all()


def test_als_rejects_an_unknown_confidence() -> None:
    _, history = _block_case()
    with pytest.raises(ValueError, match="confidence"):
        fit_als(history, AlsParams(confidence="square"))


def _unit(rows: list[list[float]]) -> np.ndarray:
    x = np.array(rows, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_content_alone_reaches_the_item_with_no_interactions(co_case: tuple[Catalogue, EncodedLog, History]) -> None:
    """f (2 days old, no interaction) points the way a does: content_new gives it to u3, who only saw a."""
    catalogue, _, history = co_case
    vectors = _unit([[1, 0, 0], [0.8, 0.6, 0], [0, 1, 0], [0, 0.8, 0.6], [0, 0, 1], [0.99, 0.1, 0]])
    source = fit_content(ItemChunks.of(vectors, 2), history, catalogue.created_us, max_new_items=1)
    users = catalogue.user_ids.to_list()
    lists = source.recommend(np.array([users.index("u3"), users.index("u5")]), 2)
    assert _names(catalogue, lists["content"].rows[0]) == ["f", "b"]
    assert _names(catalogue, lists["content_new"].rows[0]) == ["f"]  # e has no interaction either, but is older
    wider = fit_content(ItemChunks.of(vectors, 2), history, catalogue.created_us).recommend(np.array([0]), 3)
    assert sorted(_names(catalogue, wider["content_new"].rows[0])) == ["e", "f"]
    assert _names(catalogue, lists["content"].rows[1]) == []  # no history, no vector
    others: list[Source] = [
        fit_cooccurrence(history),
        fit_trending(history),
        fit_topic_trending(history, catalogue),
        fit_als(history),
    ]
    for other in others:
        for found in other.recommend(np.arange(catalogue.n_users), 6).values():
            assert catalogue.item_ids.to_list().index("f") not in found.rows


def test_trending_decays_with_age_and_skips_seen() -> None:
    """b: two views 14 days old (2 x 0.5 ** 2 = 0.5 at a 7-day half-life); c: one view today (1.0)."""
    items, inter = _frames(
        [("u1", "b", "view", 14), ("u2", "b", "view", 14), ("u3", "c", "view", 0), ("u3", "a", "purchase", 21)], ITEMS
    )
    catalogue, _, history = _history(items, inter)
    np.testing.assert_allclose(trending_scores(history, 7.0)[:3], [4 * 0.125, 0.5, 1.0], rtol=1e-6)
    lists = fit_trending(history, PLAIN).recommend(np.array([0, 2]), 3)["trending"]
    assert _names(catalogue, lists.rows[0]) == ["c", "a"]  # u1 saw b; a (0.5) ties b, comes after c
    assert _names(catalogue, lists.rows[1]) == ["b"]  # u3 saw c and a
    popular = fit_most_popular(history).recommend(np.array([2]), 3)["popularity"]
    assert _names(catalogue, popular.rows[0]) == ["b"]


def test_topic_trending_follows_the_users_topics_and_skips_users_without_history(
    co_case: tuple[Catalogue, EncodedLog, History],
) -> None:
    catalogue, _, history = co_case
    source = fit_topic_trending(history, catalogue, PLAIN)
    users = catalogue.user_ids.to_list()
    lists = source.recommend(np.array([users.index("u4"), users.index("u3"), users.index("u5")]), 3)["topic_trending"]
    assert _names(catalogue, lists.rows[0])[0] in {"a", "b"}
    u3 = _names(catalogue, lists.rows[1])
    assert u3[0] == "b" and "a" not in u3  # topic x first, a seen
    assert _names(catalogue, lists.rows[2]) == []
    # u4 (topic y only) has seen c and d, every y item with interactions: x items come, scaled by the smoothing
    assert lists.scores[0, 0] < 0.1 * fit_trending(history, PLAIN).score.max()


def test_trending_needs_distinct_users_and_caps_each_users_weight() -> None:
    """a: three users, one view each; b: one user, ten purchases; c: two users clicking; all today (users old: e)."""
    rows = [(u, "a", "view", 0) for u in ("u1", "u2", "u3")] + [("u4", "b", "purchase", 0)] * 10
    rows += [("u5", "c", "click", 0), ("u6", "c", "click", 0)]
    rows += [(f"u{k}", "e", "view", 400) for k in range(1, 7)]  # every user's first interaction: long ago
    catalogue, _, history = _history(*_frames(rows, ITEMS))
    plain = trending_scores(history, 7.0)[:3]
    np.testing.assert_allclose(plain, [3.0, 40.0, 4.0], rtol=1e-6)  # b would trend first on one user's repeats
    capped = trending_scores(history, 7.0, min_users=1, user_cap=2.0)[:3]
    np.testing.assert_allclose(capped, [3.0, 2.0, 4.0], rtol=1e-6)
    robust = robust_trending(history, PopularityParams(trend_min_users=3, trend_user_cap=2.0))[:3]
    np.testing.assert_allclose(robust, [3.0, 0.0, 0.0], rtol=1e-6)
    lists = fit_trending(history, PopularityParams(trend_min_users=3, trend_user_cap=2.0)).recommend(np.array([3]), 3)
    assert _names(catalogue, lists["trending"].rows[0]) == ["a"]  # b and c never trend


def test_trending_counts_brand_new_users_in_proportion_to_their_tenure() -> None:
    """a: three users of 10 days' standing view it today; b: three users whose first event is b, 6 hours ago."""
    rows = [(u, "e", "view", 10.0) for u in ("u1", "u2", "u3")] + [(u, "a", "view", 0.0) for u in ("u1", "u2", "u3")]
    rows += [(u, "b", "click", 0.25) for u in ("u4", "u5", "u6")]
    _, _, history = _history(*_frames(rows, ITEMS))
    params = PopularityParams(trend_min_users=3, trend_user_cap=2.0, trend_new_user_days=1.0)
    scores = robust_trending(history, params)[:2]
    np.testing.assert_allclose(scores, [3.0, 3 * 2.0 * 0.5 ** (0.25 / 7.0) * 0.25], rtol=1e-6)  # a quarter of a day
    full = robust_trending(history, PopularityParams(trend_min_users=3, trend_user_cap=2.0, trend_new_user_days=0.0))[:2]
    assert full[1] > full[0]  # without the tenure rule the new users' clicks would lead


def test_seen_matrix_sums_repeated_interactions(co_case: tuple[Catalogue, EncodedLog, History]) -> None:
    _, _, history = co_case
    matrix = user_item_matrix(history)
    assert matrix.shape == (5, 6) and matrix.nnz == 7 and matrix[4].nnz == 0


def test_content_user_vectors_equal_todays_formula(co_case: tuple[Catalogue, EncodedLog, History]) -> None:
    """Summing block by block gives retrieval.user_vectors' vectors (same weights, same normalisation)."""
    import torch

    from models.recommender.retrieval import Interactions, user_vectors

    catalogue, _, history = co_case
    vectors = _unit(np.random.default_rng(1).standard_normal((6, 5)).tolist())
    source = fit_content(ItemChunks.of(vectors, 4), history, catalogue.created_us)
    users = np.arange(catalogue.n_users)
    inter = Interactions(
        history.user_rows.astype(np.int64), history.item_rows.astype(np.int64), history.weights, catalogue.n_users
    )
    expected = user_vectors(torch.from_numpy(vectors), inter).numpy()
    np.testing.assert_allclose(source._user_vectors(source._user_history(users)).numpy(), expected, atol=1e-6)
