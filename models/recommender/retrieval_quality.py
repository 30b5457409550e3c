"""Offline quality of stage-one retrieval on an interaction log: leave-last-out recall@K and NDCG@10.

Protocol (evaluate_retrieval):
1. Interactions whose item has no vector are dropped, as the run's inner join drops them.
2. Each user's interactions are ordered by ts (ties by item_id, then event). Users with fewer than
   ``holdout + 2`` interactions are skipped; for the others the last ``holdout`` interactions are held
   out. The training part is every interaction that is not held out (skipped users' included).
3. Each evaluated user's vector comes from their training interactions with the run's formula
   (models.recommender.retrieval.user_vectors with weights from ``weight_fn``); the candidates are the exact top-K
   items by score, excluding the user's training items (models.recommender.retrieval.top_k_items), i.e. what the
   nightly run would return had the log ended before the held-out interactions.
4. A user's relevant items are the distinct held-out items not in their training part: an item seen
   in training can never be a candidate (the run excludes it), so counting it would measure that rule,
   not the ranking. Users left with no relevant item are skipped too (counted in users_skipped).
5. recall@K = |top K & relevant| / |relevant|. NDCG@10 uses binary relevance:
   sum over ranks r <= 10 of hit_r / log2(r + 1), divided by the same sum for the ideal list
   (min(|relevant|, 10) hits first). Both are averaged over evaluated users (macro average).
6. Baseline: the items interacted with most often in the training part (ties by lower item row),
   minus the user's training items, scored the same way. Its counts include other users' later
   interactions, the usual leave-last-out leak, so the baseline is if anything optimistic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import polars as pl
import torch

from models.recommender.retrieval import ITEM_BLOCK, Interactions, ItemChunks, interaction_weights, top_k_items, user_vectors

log = logging.getLogger(__name__)

NDCG_K = 10

WeightFn = Callable[[pl.DataFrame], np.ndarray]
"""Training interactions (user_id, item_id, event, ts, ...) -> one weight per row, in row order."""


@dataclass(frozen=True)
class RetrievalQuality:
    """Leave-last-out metrics of stage-one retrieval and of the popularity baseline."""

    recall_at_k: float
    ndcg_at_10: float
    popularity_recall_at_k: float
    popularity_ndcg_at_10: float
    users_evaluated: int
    users_skipped: int
    k: int


def run_weights(now: datetime, event_weights: Mapping[str, float], half_life_days: float) -> WeightFn:
    """Return the run's weight function: event weight x 0.5 ** (age_days / half_life_days), aged from now."""

    def weights(frame: pl.DataFrame) -> np.ndarray:
        return interaction_weights(frame, now, event_weights, half_life_days)

    return weights


def split_last(interactions: pl.DataFrame, holdout: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Return (training part, held out): the last ``holdout`` interactions of users with >= holdout + 2."""
    if holdout < 1:
        raise ValueError(f"holdout must be at least 1, got {holdout}")
    ordered = interactions.sort("user_id", "ts", "item_id", "event", maintain_order=True)
    position = pl.int_range(pl.len()).over("user_id")
    count = pl.len().over("user_id")
    held = (count >= holdout + 2) & (position >= count - holdout)
    marked = ordered.with_columns(held.alias("_held"))
    return marked.filter(~pl.col("_held")).drop("_held"), marked.filter(pl.col("_held")).drop("_held")


def hit_matrix(ranked: np.ndarray, relevant_users: np.ndarray, relevant_items: np.ndarray, n_items: int) -> np.ndarray:
    """Return ranked.shape booleans: whether ranked[u, r] is a relevant item of user row u (-1 never is).

    Args:
        ranked: (n_users, width) item rows per user, best first, -1 for empty slots.
        relevant_users, relevant_items: parallel arrays of (user row, item row) relevant pairs.
        n_items: number of item rows (to encode pairs as one integer).
    """
    keys = relevant_users.astype(np.int64) * n_items + relevant_items.astype(np.int64)
    candidates = np.arange(ranked.shape[0], dtype=np.int64)[:, None] * n_items + ranked
    return np.isin(candidates, keys) & (ranked >= 0)


def recall_at_k(hits: np.ndarray, n_relevant: np.ndarray, k: int) -> np.ndarray:
    """Return per-user recall@k: relevant items in the first k slots / relevant items."""
    return hits[:, :k].sum(axis=1) / n_relevant


def ndcg_at_k(hits: np.ndarray, n_relevant: np.ndarray, k: int = NDCG_K) -> np.ndarray:
    """Return per-user NDCG@k with binary relevance (ideal list: min(n_relevant, k) hits first)."""
    discounts = 1.0 / np.log2(np.arange(2, k + 2, dtype=np.float64))
    top = hits[:, :k].astype(np.float64)
    dcg = top @ discounts[: top.shape[1]]
    ideal = np.cumsum(discounts)[np.minimum(n_relevant, k) - 1]
    return dcg / ideal


def _relevant(train: pl.DataFrame, held: pl.DataFrame) -> pl.DataFrame:
    """Return the distinct (user_id, item_row) held-out pairs whose item is not in the user's training part."""
    seen = train.select("user_id", "item_row").unique()
    return held.select("user_id", "item_row").unique().join(seen, on=["user_id", "item_row"], how="anti")


def _rows(frame: pl.DataFrame, users: pl.DataFrame) -> pl.DataFrame:
    """Return frame's rows of the evaluated users with their user_row, in frame order."""
    return frame.join(users, on="user_id", how="inner", maintain_order="left")


def _popularity_top_k(counts: np.ndarray, seen: Interactions, k: int, chunk: int) -> np.ndarray:
    """Return the top-k item rows per user by training count, excluding seen items, ties by lower row."""
    # A 1-d "embedding" (user 1, item count) makes top_k_items rank by count with its exact tie rule.
    # Item blocks: most counts tie at 0, so one block's top-K widens to the whole block, never to every item.
    users = torch.ones((seen.n_users, 1), dtype=torch.float32)
    rows, _ = top_k_items(users, ItemChunks.of(counts.astype(np.float32)[:, None], ITEM_BLOCK), seen, k, chunk)
    return rows


def _scores(ranked: np.ndarray, relevant: pl.DataFrame, n_relevant: np.ndarray, n_items: int, k: int) -> tuple[float, float]:
    """Return (mean recall@k, mean NDCG@10) of ranked lists against the relevant pairs."""
    hits = hit_matrix(ranked, relevant["user_row"].to_numpy(), relevant["item_row"].to_numpy(), n_items)
    return float(recall_at_k(hits, n_relevant, k).mean()), float(ndcg_at_k(hits, n_relevant).mean())


def evaluate_retrieval(
    item_ids: Sequence[str] | pl.Series,
    item_vectors: np.ndarray | ItemChunks,
    interactions: pl.DataFrame,
    weight_fn: WeightFn,
    k: int = 100,
    holdout: int = 2,
    chunk: int = 2048,
) -> RetrievalQuality:
    """Return leave-last-out recall@k and NDCG@10 of stage-one retrieval and of the popularity baseline.

    Args:
        item_ids: one id per row of item_vectors.
        item_vectors: (n_items, dim) item embeddings as the run uses them (unit rows: scores are cosines), or
            ItemChunks of them (streamed in blocks: the run's way of never holding them all).
        interactions: the log, with columns user_id, item_id, event, ts.
        weight_fn: weights of the training interactions (see run_weights for the run's formula).
        k, holdout, chunk: candidates per user, held-out interactions per user, users per matrix product.
    """
    index = pl.DataFrame({"item_id": pl.Series(item_ids, dtype=pl.String)}).with_row_index("item_row")
    train, held = split_last(interactions.join(index, on="item_id", how="inner"), holdout)
    relevant = _relevant(train, held)
    users = relevant.select("user_id").unique().sort("user_id").with_row_index("user_row")
    skipped = interactions.get_column("user_id").n_unique() - users.height
    k = min(k, index.height)
    if users.height == 0:
        log.warning("no user has %d held-out interactions with an unseen item: nothing to evaluate", holdout)
        return RetrievalQuality(float("nan"), float("nan"), float("nan"), float("nan"), 0, skipped, k)
    history = _rows(train, users)
    seen = Interactions(
        history["user_row"].to_numpy(),
        history["item_row"].to_numpy(),
        np.asarray(weight_fn(history), dtype=np.float32),
        users.height,
    )
    relevant = _rows(relevant, users)
    n_relevant = np.bincount(relevant["user_row"].to_numpy(), minlength=users.height)
    vectors = (
        item_vectors
        if isinstance(item_vectors, ItemChunks)
        else torch.from_numpy(np.ascontiguousarray(item_vectors, dtype=np.float32))
    )
    ranked, _ = top_k_items(user_vectors(vectors, seen), vectors, seen, k, chunk)
    popular = _popularity_top_k(np.bincount(train["item_row"].to_numpy(), minlength=index.height), seen, k, chunk)
    recall, ndcg = _scores(ranked, relevant, n_relevant, index.height, k)
    pop_recall, pop_ndcg = _scores(popular, relevant, n_relevant, index.height, k)
    return RetrievalQuality(recall, ndcg, pop_recall, pop_ndcg, users.height, skipped, k)
