"""Stage-two features of (user, candidate) pairs, computed at batch time by ONE function (candidate_features).

The same function builds the ranker's training rows and the rows published into each user's cache entry;
serving only scores the published matrix, so training and serving can never disagree. Per candidate, in
feature_names() order, everything as of the History's ``now``:

    fused_score        the fusion's weighted reciprocal-rank (RRF) score
    fused_rr           1 / the candidate's RRF rank among the user's union entries (1 = first)
    n_lists            how many source lists hold the candidate
    rr_<list>          1 / its rank in that list, 0 when the list does not hold it   (one per list)
    score_<list>       its score in that list, 0 when the list does not hold it      (one per list)
    log_popularity     log(1 + interactions with the item)
    log_trending       log(1 + the item's recency-decayed, event-weighted count)
    freshness_days     days since the item's created_at (never negative)
    is_new             1 when the item has no interaction in the History
    topic_affinity     the user's share of interactions in the item's topic (0 without a topic)
    topic_score        the zero-shot probability of the item's topic
    log_history        log(1 + the user's interactions)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from models.recommender.fusion import Fused
from models.recommender.sources.base import Catalogue, History, history_lengths, item_counts, to_epoch_us
from models.recommender.sources.popularity import trending_scores

ITEM_FEATURES: tuple[str, ...] = (
    "log_popularity",
    "log_trending",
    "freshness_days",
    "is_new",
    "topic_affinity",
    "topic_score",
    "log_history",
)
_US_PER_DAY = 86_400 * 1_000_000


def feature_names(list_names: tuple[str, ...]) -> tuple[str, ...]:
    """Return the feature names of candidates fused from these lists, in matrix column order."""
    per_list = tuple(f"rr_{n}" for n in list_names) + tuple(f"score_{n}" for n in list_names)
    return ("fused_score", "fused_rr", "n_lists", *per_list, *ITEM_FEATURES)


@dataclass(frozen=True)
class FeatureContext:
    """Item and user feature arrays by row, as of one History's now."""

    item_values: np.ndarray
    item_topic: np.ndarray
    log_history: np.ndarray
    affinity: np.ndarray


def feature_context(history: History, catalogue: Catalogue, trend_half_life_days: float) -> FeatureContext:
    """Return the item and user arrays candidate_features reads."""
    counts = item_counts(history)
    age = np.clip((to_epoch_us(history.now) - catalogue.created_us) / _US_PER_DAY, 0.0, None)
    values = np.stack(
        [
            np.log1p(counts),
            np.log1p(trending_scores(history, trend_half_life_days)),
            age,
            (counts == 0).astype(np.float64),
            catalogue.topic_score.astype(np.float64),
        ],
        axis=1,
    )
    n_topics = len(catalogue.topic_names) + 1  # the last column stands for "no topic" and stays 0
    topic = np.where(catalogue.topic >= 0, catalogue.topic, n_topics - 1)
    item_topic_rows = topic[history.item_rows]
    known = item_topic_rows < n_topics - 1
    shares = sp.csr_matrix(
        (np.ones(int(known.sum()), np.float32), (history.user_rows[known], item_topic_rows[known])),
        shape=(history.n_users, n_topics),
    ).toarray()
    shares /= np.maximum(shares.sum(axis=1, keepdims=True), 1.0)
    return FeatureContext(
        values.astype(np.float32),
        topic.astype(np.int64),
        np.log1p(history_lengths(history)).astype(np.float32),
        shares.astype(np.float32),
    )


def candidate_features(fused: Fused, users: np.ndarray, context: FeatureContext) -> np.ndarray:
    """Return the (users, K, features) float32 matrix of fused candidates; empty slots are all 0.

    Args:
        fused: the fused candidates of the user rows ``users`` (same order).
        users: user rows.
        context: feature_context of the History the candidates came from.
    """
    n_users, k, _ = fused.ranks.shape
    filled = fused.rows >= 0
    item = np.where(filled, fused.rows, 0)
    rr = np.where(fused.ranks > 0, 1.0 / np.maximum(fused.ranks, 1), 0.0)
    rrf_rr = np.where(fused.rrf_rank > 0, 1.0 / np.maximum(fused.rrf_rank, 1), 0.0)
    topic = context.item_topic[item]
    affinity = np.take_along_axis(context.affinity[users], topic, axis=1)
    parts = [
        np.where(filled, fused.rrf, 0.0)[..., None],
        rrf_rr[..., None],
        (fused.ranks > 0).sum(-1)[..., None],
        rr,
        np.nan_to_num(fused.source_scores, nan=0.0),
        context.item_values[item][..., :4],
        affinity[..., None],
        context.item_values[item][..., 4:5],
        np.broadcast_to(context.log_history[users][:, None, None], (n_users, k, 1)),
    ]
    out = np.concatenate([np.asarray(p, dtype=np.float32) for p in parts], axis=-1)
    out[~filled] = 0.0
    return out
