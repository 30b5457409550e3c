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

The gate and the fallback compare two lists on the same users (a paired bootstrap of the per-user recall@K
difference, seeded): a run fails only when the published list is worse than popularity (+ margin) with
confidence, i.e. the one-sided upper bound of (published - popularity) is below the margin; below
``min_users`` evaluated users nothing is gated ("not enough data to gate"), and the cold-item floor is only
checked with at least ``min_cold_pairs`` cold pairs. The same comparison on the validation split tells the
candidate stage when a source beats its own fusion (fallback_source).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import polars as pl

from core.errors import ContractViolation
from core.settings import CandidateSettings
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


def user_recall(rows: np.ndarray, split: Split, n_items: int, k: int) -> np.ndarray:
    """Return each evaluated user's recall@K (aligned with split.users) of per-user lists (best first, -1 empty)."""
    local = np.searchsorted(split.users, split.relevant_users)
    hits = hit_matrix(rows[:, :k].astype(np.int64), local, split.relevant_items, n_items)
    return hits.sum(axis=1) / np.maximum(np.bincount(local, minlength=len(split.users)), 1)


def metrics_of(rows: np.ndarray, split: Split, n_items: int, k: int) -> dict[str, float]:
    """Return the METRICS of per-user lists (rows aligned with split.users, best first, -1 empty)."""
    local = np.searchsorted(split.users, split.relevant_users)
    top = rows[:, :k].astype(np.int64)
    hits = hit_matrix(top, local, split.relevant_items, n_items)
    n_relevant = np.bincount(local, minlength=len(split.users))
    recall = float((hits.sum(axis=1) / np.maximum(n_relevant, 1)).mean()) if len(split.users) else math.nan  # = user_recall
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


_DEFAULTS = CandidateSettings()
NOT_ENOUGH_DATA = "not enough data to gate"


@dataclass(frozen=True)
class GateRule:
    """When the gate fails a run and the stage falls back to a source (CandidateSettings' gate_* fields)."""

    recall_margin: float = _DEFAULTS.gate_recall_margin
    min_cold_recall: float = _DEFAULTS.gate_min_cold_recall
    min_users: int = _DEFAULTS.gate_min_users
    min_cold_pairs: int = _DEFAULTS.gate_min_cold_pairs
    rounds: int = _DEFAULTS.gate_bootstrap_rounds
    confidence: float = _DEFAULTS.gate_confidence
    seed: int = _DEFAULTS.seed

    @classmethod
    def from_settings(cls, options: CandidateSettings) -> GateRule:
        """Return the gate's rule from the candidate settings."""
        return cls(
            options.gate_recall_margin,
            options.gate_min_cold_recall,
            options.gate_min_users,
            options.gate_min_cold_pairs,
            options.gate_bootstrap_rounds,
            options.gate_confidence,
            options.seed,
        )


@dataclass(frozen=True)
class Gap:
    """A paired comparison of two lists on the same users: mean per-user recall@K difference and its one-sided bounds."""

    users: int
    mean: float
    low: float
    high: float

    def text(self, confidence: float) -> str:
        """Return the gap as one phrase: mean, interval and users."""
        return f"{self.mean:+.4f} ({confidence:.0%} bounds {self.low:+.4f}..{self.high:+.4f}, {self.users} users)"


_BOOTSTRAP_BLOCK = 4_000_000  # resampled indices held at once (rounds x users), ~32 MB


def paired_gap(a: np.ndarray, b: np.ndarray, rounds: int, confidence: float, seed: int) -> Gap:
    """Return the mean of a - b (per-user values, same users) with its one-sided bootstrap bounds at confidence.

    low is the (1 - confidence) quantile of the resampled means, high the confidence quantile.
    """
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if len(diff) == 0:
        return Gap(0, math.nan, math.nan, math.nan)
    rng, means = np.random.default_rng(seed), []
    block = max(1, _BOOTSTRAP_BLOCK // len(diff))
    for start in range(0, rounds, block):
        picks = rng.integers(0, len(diff), size=(min(block, rounds - start), len(diff)))
        means.append(diff[picks].mean(axis=1))
    resampled = np.concatenate(means)
    low, high = np.quantile(resampled, [1.0 - confidence, confidence])
    return Gap(len(diff), float(diff.mean()), float(low), float(high))


def fallback_source(fused: np.ndarray, sources: Mapping[str, np.ndarray], rule: GateRule) -> tuple[str | None, Gap | None]:
    """Return the source whose per-user recall@K beats the fused list's with confidence (the best such), and its gap.

    None when no source does, or with fewer than rule.min_users users (too few to tell).
    """
    if len(fused) < rule.min_users:
        return None, None
    gaps = {name: paired_gap(fused, recall, rule.rounds, rule.confidence, rule.seed) for name, recall in sorted(sources.items())}
    losing = [name for name, gap in gaps.items() if gap.high < 0.0]
    if not losing:
        return None, None
    best = max(losing, key=lambda name: (float(sources[name].mean()), name))
    return best, gaps[best]


def check_gate(
    table: pl.DataFrame,
    recall: Mapping[str, np.ndarray],
    rule: GateRule,
    fused: str = "fused",
    baseline: str = "popularity",
) -> str:
    """Return the gate's outcome as one line; raise ContractViolation when the fused list is worse with confidence.

    Args:
        table: retrieval_metrics rows (the fused cold recall and the split's cold_pairs are read from it).
        recall: per-user recall@K of the held-out users by method (fused and baseline, same users).
        rule: the margin, floors, minimum counts and the bootstrap's rounds, confidence and seed.
    """
    users = len(recall.get(fused, ()))
    if users < rule.min_users:
        return f"{NOT_ENOUGH_DATA}: {users} held-out users (fewer than {rule.min_users})"
    gap = paired_gap(recall[fused], recall[baseline], rule.rounds, rule.confidence, rule.seed)
    if not gap.high >= rule.recall_margin:
        raise ContractViolation(
            f"candidate gate: fused recall@K {metric_value(table, fused, 'recall_at_k'):.4f} is below popularity's "
            f"{metric_value(table, baseline, 'recall_at_k'):.4f} + margin {rule.recall_margin:.4f} with confidence: "
            f"fused - popularity {gap.text(rule.confidence)}"
        )
    return f"passed: fused - popularity recall@K {gap.text(rule.confidence)}{_cold_gate(table, fused, rule)}"


def _cold_gate(table: pl.DataFrame, fused: str, rule: GateRule) -> str:
    """Return the cold-recall floor's note (empty when checked and met); raise ContractViolation when it is not met."""
    cold, pairs = metric_value(table, fused, "cold_recall_at_k"), metric_value(table, "split", "cold_pairs")
    if rule.min_cold_recall <= 0.0:
        return ""
    if math.isnan(cold) or not pairs >= rule.min_cold_pairs:
        return f"; cold recall not gated ({0 if math.isnan(pairs) else int(pairs)} cold pairs, fewer than {rule.min_cold_pairs})"
    if cold < rule.min_cold_recall:
        raise ContractViolation(
            f"candidate gate: fused cold-item recall@K {cold:.4f} is below the minimum {rule.min_cold_recall:.4f}"
        )
    return ""
