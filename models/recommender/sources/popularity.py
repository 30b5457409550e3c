"""Popularity sources: trending (recency-decayed counts), topic-affine trending, and plain most-popular.

trending(j)            = sum over the users u who interacted with j of min(trend_user_cap, tenure_u x sum over
                         u's interactions with j of event_weight x 0.5 ** (age_days / trend_half_life_days)),
                         and 0 while fewer than trend_min_users distinct users did; tenure_u = min(1, days since
                         u's first interaction / trend_new_user_days): a handful of new users (fake ones, a bot)
                         cannot make an item trend (benchmarks/trending_robustness.py measures it)
topic_trending(u, j)   = (affinity_u(topic_j) + smoothing) x trending(j), affinity = the user's share of
                         interactions in each topic; the source for thin-history users (users with no
                         history get nothing from it; they get trending)
most_popular(j)        = number of interactions with j: the baseline of the evaluation and the gate
fill                   = every item by trending, then (trending 0) catalogue order: what tops up a user's
                         candidates when the fused lists hold fewer than K unseen items
Every list excludes the user's seen items; ties go to the lower item row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from core.settings import CandidateSettings
from models.recommender.sources.base import Catalogue, History, Lists, empty_lists, item_counts, to_epoch_us, user_item_matrix

_US_PER_DAY = 86_400 * 1_000_000


_DEFAULTS = CandidateSettings()
FILL = "fill"  # the name of the fill order's list (and of a topped-up candidate's source)


@dataclass(frozen=True)
class PopularityParams:
    """Parameters of the popularity sources."""

    trend_half_life_days: float = _DEFAULTS.trend_half_life_days
    topic_smoothing: float = _DEFAULTS.topic_smoothing
    trend_min_users: int = _DEFAULTS.trend_min_users
    trend_user_cap: float = _DEFAULTS.trend_user_cap
    trend_new_user_days: float = _DEFAULTS.trend_new_user_days


def tenure(history: History, full_days: float) -> np.ndarray:
    """Return each interaction's user's weight: days since the user's first interaction / full_days, at most 1."""
    if full_days <= 0 or len(history.user_rows) == 0:
        return np.ones(len(history.user_rows))
    first = np.full(history.n_users, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, history.user_rows, history.ts_us.astype(np.int64))
    days = (to_epoch_us(history.now) - first[history.user_rows]) / _US_PER_DAY
    return np.clip(days / full_days, 0.0, 1.0)


def trending_scores(
    history: History, half_life_days: float, min_users: int = 1, user_cap: float = np.inf, new_user_days: float = 0.0
) -> np.ndarray:
    """Return each item's recency-decayed, event-weighted interaction count as of history.now.

    A user's events count in proportion to the user's tenure (full after new_user_days), each user's part of an
    item's count is at most user_cap, and an item fewer than min_users distinct users interacted with scores 0
    (the defaults: plain decayed counts, the ranker's feature).
    """
    age_days = np.clip((to_epoch_us(history.now) - history.ts_us) / _US_PER_DAY, 0.0, None)
    decayed = history.event_weight * 0.5 ** (age_days / half_life_days) * tenure(history, new_user_days)
    pairs = sp.coo_matrix((decayed, (history.item_rows, history.user_rows)), shape=(history.n_items, history.n_users)).tocsr()
    pairs.sum_duplicates()  # one entry per (item, user): that user's whole weight on the item
    scores = np.asarray(pairs.minimum(user_cap).sum(axis=1)).ravel() if np.isfinite(user_cap) else pairs.sum(axis=1).A1
    scores[np.diff(pairs.indptr) < min_users] = 0.0
    return np.asarray(scores, dtype=np.float64)


def robust_trending(history: History, params: PopularityParams) -> np.ndarray:
    """Return the trending scores of the popularity sources and the fallback list: new users discounted, capped, min users."""
    return trending_scores(
        history, params.trend_half_life_days, params.trend_min_users, params.trend_user_cap, params.trend_new_user_days
    )


def _ranked_unseen(order: np.ndarray, score: np.ndarray, seen: sp.csr_matrix, users: np.ndarray, n: int) -> Lists:
    """Return, per user, the first n items of a global order (best first) that the user has not seen."""
    sub = seen[users]
    width = min(len(order), n + int(np.diff(sub.indptr).max(initial=0)))
    head = order[:width]
    out = empty_lists(len(users), n)
    if width == 0:
        return out
    keys = np.repeat(np.arange(len(users), dtype=np.int64), np.diff(sub.indptr)) * seen.shape[1] + sub.indices
    grid = np.arange(len(users), dtype=np.int64)[:, None] * seen.shape[1] + head[None, :]
    unseen = ~np.isin(grid, keys)
    position = np.cumsum(unseen, axis=1) - 1
    take = unseen & (position < n)
    user_idx, col_idx = np.nonzero(take)
    out.rows[user_idx, position[take]] = head[col_idx]
    out.scores[user_idx, position[take]] = score[head[col_idx]]
    return out


class GlobalRankSource:
    """A source that ranks every user's unseen items by one global score (trending, most popular)."""

    def __init__(self, name: str, score: np.ndarray, seen: sp.csr_matrix, every_item: bool = False) -> None:
        self.name, self.seen = name, seen
        self.score = score.astype(np.float32)
        ranked = np.arange(len(score)) if every_item else np.flatnonzero(score > 0)
        self.order = ranked[np.lexsort((ranked, -score[ranked]))].astype(np.int32)

    def recommend(self, users: np.ndarray, n: int) -> dict[str, Lists]:
        """Return {name: each user's top-n unseen items by the global score (items scoring 0 never)}."""
        return {self.name: _ranked_unseen(self.order, self.score, self.seen, users, n)}


class TopicTrendingSource:
    """Trending items weighted by the user's topic affinity (users without history get nothing)."""

    name = "topic_trending"

    def __init__(self, trending: np.ndarray, catalogue: Catalogue, history: History, params: PopularityParams) -> None:
        self.seen, self.smoothing = user_item_matrix(history), params.topic_smoothing
        self.trending, self.topic = trending.astype(np.float32), catalogue.topic
        n_topics = len(catalogue.topic_names) + 1  # the last column: items without a topic
        topic = np.where(catalogue.topic[history.item_rows] >= 0, catalogue.topic[history.item_rows], n_topics - 1)
        counts = sp.csr_matrix(
            (np.ones(len(topic), np.float32), (history.user_rows, topic)), shape=(history.n_users, n_topics)
        ).toarray()
        self.has_history = counts.sum(axis=1) > 0
        self.affinity = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
        item_topic = np.where(self.topic >= 0, self.topic, n_topics - 1)
        self.per_topic = [self._order(np.flatnonzero((item_topic == t) & (trending > 0))) for t in range(n_topics)]

    def _order(self, items: np.ndarray) -> np.ndarray:
        return items[np.lexsort((items, -self.trending[items]))].astype(np.int32)

    def recommend(self, users: np.ndarray, n: int) -> dict[str, Lists]:
        """Return {topic_trending: each user's top-n unseen items by (topic affinity + smoothing) x trending}."""
        parts = [_ranked_unseen(order, self.trending, self.seen, users, n) for order in self.per_topic]
        rows = np.concatenate([p.rows for p in parts], axis=1)
        weight = np.repeat(self.affinity[users] + self.smoothing, n, axis=1).astype(np.float32)
        scores = np.concatenate([p.scores for p in parts], axis=1) * weight
        scores[rows < 0] = -np.inf
        order = np.lexsort((np.where(rows < 0, np.iinfo(np.int32).max, rows), -scores), axis=1)[:, :n]
        out = Lists(np.take_along_axis(rows, order, axis=1), np.take_along_axis(scores, order, axis=1))
        if out.rows.shape[1] < n:
            pad = empty_lists(len(users), n - out.rows.shape[1])
            out = Lists(np.hstack([out.rows, pad.rows]), np.hstack([out.scores, pad.scores]))
        out.rows[~self.has_history[users]] = -1
        out.scores[~self.has_history[users]] = -np.inf
        return {self.name: out}


def fit_trending(history: History, params: PopularityParams = PopularityParams()) -> GlobalRankSource:
    """Return the trending source: recency-decayed counts as of history.now."""
    return GlobalRankSource("trending", robust_trending(history, params), user_item_matrix(history))


def fit_fill(history: History, params: PopularityParams = PopularityParams()) -> GlobalRankSource:
    """Return the fill order: every item by trending, items scoring 0 after the others in catalogue order."""
    scores = robust_trending(history, params)
    return GlobalRankSource(FILL, scores, user_item_matrix(history), every_item=True)


def fit_most_popular(history: History) -> GlobalRankSource:
    """Return the most-popular baseline: plain interaction counts."""
    return GlobalRankSource("popularity", item_counts(history).astype(np.float64), user_item_matrix(history))


def fit_topic_trending(
    history: History, catalogue: Catalogue, params: PopularityParams = PopularityParams()
) -> TopicTrendingSource:
    """Return the topic-affine trending source."""
    return TopicTrendingSource(robust_trending(history, params), catalogue, history, params)
