"""Popularity sources: trending (recency-decayed counts), topic-affine trending, and plain most-popular.

trending(j)            = sum over j's interactions of event_weight x 0.5 ** (age_days / trend_half_life_days)
topic_trending(u, j)   = (affinity_u(topic_j) + smoothing) x trending(j), affinity = the user's share of
                         interactions in each topic; the source for thin-history users (users with no
                         history get nothing from it; they get trending)
most_popular(j)        = number of interactions with j: the baseline of the evaluation and the gate
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


@dataclass(frozen=True)
class PopularityParams:
    """Parameters of the popularity sources."""

    trend_half_life_days: float = _DEFAULTS.trend_half_life_days
    topic_smoothing: float = _DEFAULTS.topic_smoothing


def trending_scores(history: History, half_life_days: float) -> np.ndarray:
    """Return each item's recency-decayed, event-weighted interaction count as of history.now."""
    age_days = np.clip((to_epoch_us(history.now) - history.ts_us) / _US_PER_DAY, 0.0, None)
    decayed = history.event_weight * 0.5 ** (age_days / half_life_days)
    return np.bincount(history.item_rows, weights=decayed, minlength=history.n_items)


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

    def __init__(self, name: str, score: np.ndarray, seen: sp.csr_matrix) -> None:
        self.name, self.seen = name, seen
        self.score = score.astype(np.float32)
        positive = np.flatnonzero(score > 0)
        self.order = positive[np.lexsort((positive, -score[positive]))].astype(np.int32)

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
    return GlobalRankSource("trending", trending_scores(history, params.trend_half_life_days), user_item_matrix(history))


def fit_most_popular(history: History) -> GlobalRankSource:
    """Return the most-popular baseline: plain interaction counts."""
    return GlobalRankSource("popularity", item_counts(history).astype(np.float64), user_item_matrix(history))


def fit_topic_trending(
    history: History, catalogue: Catalogue, params: PopularityParams = PopularityParams()
) -> TopicTrendingSource:
    """Return the topic-affine trending source."""
    return TopicTrendingSource(trending_scores(history, params.trend_half_life_days), catalogue, history, params)
