"""Honest offline evaluation of candidate lists: a time split of the run's own log, metrics, and the gate.

Split (time_split): one global cutoff, the latest ``holdout_share`` of the interactions by time are held
out ("the latest days", sized by a share so that it adapts to any log's time span). Training = every
interaction strictly before the cutoff, from every user; nothing after it leaks into a model, so items
first seen after the cutoff are genuinely new ("cold") in training. The validation split that tunes the
fusion and trains the ranker is the same rule applied inside the training part (never the held-out part).

Relevant items of a user: the distinct held-out items the user has not interacted with in training
(a seen item can never be a candidate). Evaluated users: users with at least one relevant item; users
without any training interaction are evaluated too (only trending reaches them) and counted.

Metrics of a list of K items per user (metrics_of):
    recall@K      |top K & relevant| / |relevant|, averaged over evaluated users
    ndcg@10       binary-relevance NDCG@10 (ideal: min(|relevant|, 10) hits first), averaged over users
    cold_recall@K (user, item) relevant pairs whose item has no training interaction that are in the
                  user's top K, over all such pairs (micro average: most users have none); NaN if none
    coverage@K    distinct items in the evaluated users' top K / catalogue items
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import polars as pl

from core.errors import ContractViolation
from models.recommender.retrieval_quality import NDCG_K, hit_matrix, ndcg_at_k
from models.recommender.sources.base import EncodedLog

METRICS: tuple[str, ...] = ("recall_at_k", "ndcg_at_10", "cold_recall_at_k", "coverage_at_k")
METRICS_SCHEMA = {"method": pl.String, "metric": pl.String, "value": pl.Float64}


@dataclass(frozen=True)
class Split:
    """A time split: the training mask over the log rows, and the relevant (user row, item row) pairs."""

    cutoff_us: int
    train: np.ndarray
    users: np.ndarray
    relevant_users: np.ndarray
    relevant_items: np.ndarray
    cold: np.ndarray
    users_without_history: int


def time_split(log: EncodedLog, holdout_share: float, within: np.ndarray | None = None) -> Split:
    """Return the split holding out the latest holdout_share of the (within) rows by time."""
    if not 0.0 < holdout_share < 1.0:
        raise ValueError(f"holdout_share must lie in (0, 1), got {holdout_share}")
    within = np.ones(len(log.ts_us), dtype=bool) if within is None else within
    ts = log.ts_us[within]
    cutoff = int(np.sort(ts)[min(len(ts) - 1, math.floor(len(ts) * (1.0 - holdout_share)))]) if len(ts) else 0
    train, test = within & (log.ts_us < cutoff), within & (log.ts_us >= cutoff)
    n_items = int(log.item_rows.max(initial=0)) + 1
    train_keys = np.unique(log.user_rows[train].astype(np.int64) * n_items + log.item_rows[train])
    test_keys = np.unique(log.user_rows[test].astype(np.int64) * n_items + log.item_rows[test])
    relevant = test_keys[~np.isin(test_keys, train_keys)]
    users, items = relevant // n_items, relevant % n_items
    trained_items = np.zeros(n_items, dtype=bool)
    trained_items[log.item_rows[train]] = True
    has_history = np.zeros(int(log.user_rows.max(initial=0)) + 1, dtype=bool)
    has_history[log.user_rows[train]] = True
    evaluated = np.unique(users)
    return Split(
        cutoff,
        train,
        evaluated.astype(np.int32),
        users.astype(np.int32),
        items.astype(np.int32),
        ~trained_items[items],
        int((~has_history[evaluated]).sum()),
    )


def metrics_of(rows: np.ndarray, split: Split, n_items: int, k: int) -> dict[str, float]:
    """Return the METRICS of per-user lists (rows aligned with split.users, best first, -1 empty)."""
    local = np.searchsorted(split.users, split.relevant_users)
    top = rows[:, :k].astype(np.int64)
    hits = hit_matrix(top, local, split.relevant_items, n_items)
    n_relevant = np.bincount(local, minlength=len(split.users))
    recall = float((hits.sum(axis=1) / np.maximum(n_relevant, 1)).mean()) if len(split.users) else math.nan
    ndcg = float(ndcg_at_k(hits, np.maximum(n_relevant, 1), NDCG_K).mean()) if len(split.users) else math.nan
    return {
        "recall_at_k": recall,
        "ndcg_at_10": ndcg,
        "cold_recall_at_k": _cold_recall(top, local, split, n_items),
        "coverage_at_k": float(len(np.unique(top[top >= 0]))) / max(n_items, 1),
    }


def _cold_recall(top: np.ndarray, local: np.ndarray, split: Split, n_items: int) -> float:
    """Return the share of cold relevant pairs found in the lists (NaN when there is none)."""
    if not split.cold.any():
        return math.nan
    keys = np.arange(len(top), dtype=np.int64)[:, None] * n_items + top
    cold_keys = local[split.cold].astype(np.int64) * n_items + split.relevant_items[split.cold]
    return float(np.isin(cold_keys, keys[top >= 0]).mean())


def metric_rows(method: str, metrics: Mapping[str, float]) -> pl.DataFrame:
    """Return one method's metrics as retrieval_metrics rows (method, metric, value)."""
    return pl.DataFrame(
        {"method": [method] * len(metrics), "metric": list(metrics), "value": [float(v) for v in metrics.values()]},
        schema=METRICS_SCHEMA,
    )


def metric_value(table: pl.DataFrame, method: str, metric: str) -> float:
    """Return one value of a retrieval_metrics table (NaN when the row is missing)."""
    row = table.filter((pl.col("method") == method) & (pl.col("metric") == metric))
    return float(row.get_column("value")[0]) if row.height else math.nan


def check_gate(
    table: pl.DataFrame, recall_margin: float, min_cold_recall: float, fused: str = "fused", baseline: str = "popularity"
) -> None:
    """Raise ContractViolation when the fused recall@K < popularity's + margin, or its cold recall < the minimum.

    A NaN cold recall (no held-out item without training interactions) does not fail the gate: there is
    nothing to measure. A NaN recall (nobody to evaluate) fails it: the run cannot show its quality.
    """
    recall, popular = metric_value(table, fused, "recall_at_k"), metric_value(table, baseline, "recall_at_k")
    if not (recall >= popular + recall_margin):
        raise ContractViolation(
            f"candidate gate: fused recall@K {recall:.4f} is below popularity's {popular:.4f} + margin {recall_margin:.4f}"
        )
    cold = metric_value(table, fused, "cold_recall_at_k")
    if not math.isnan(cold) and cold < min_cold_recall:
        raise ContractViolation(f"candidate gate: fused cold-item recall@K {cold:.4f} is below the minimum {min_cold_recall:.4f}")
