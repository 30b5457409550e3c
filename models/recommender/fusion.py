"""Fusion of the sources' lists: union, weighted reciprocal-rank fusion, a quota of new items, and its tuning.

For a user and an item in the union of every list's top N:
    fused(u, j) = sum over lists s containing j of weight_s / (rrf_k + rank_s(u, j))     (rank from 1)
The user's K candidates are first the best ``round(new_quota x K)`` new items (no interaction in the
History) by fused score, when there are that many, then the best of the rest; they are ordered by fused
score (ties: lower item row). Items whose fused score is 0 (only lists of weight 0) are dropped.
A user whose lists hold fewer than K unseen items is topped up (top_up) with the best remaining unseen items
of a fill list (trending, then catalogue order): no source ranks them, their score sits below the user's others.

Tuning (tune_fusion) uses a validation split carved out of the training part: coordinate ascent over
each list's weight and rrf_k maximising recall@K (the lists that feed the quota, content_new, never get
weight 0: their items would score 0 and leave the quota empty), then the smallest quota whose cold-item recall on
validation reaches ``cold_target`` (the largest quota when none does), then one more weight round at that
quota. Every step keeps the best value seen (ties keep the current one), so it is deterministic.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from core.settings import CandidateSettings
from models.recommender.evaluation import Split, metrics_of
from models.recommender.sources.base import Lists

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FusionParams:
    """Weights per list name, the RRF constant, the new-item quota (share of K) and K."""

    weights: Mapping[str, float]
    rrf_k: float = 60.0
    new_quota: float = 0.1
    k: int = 100


@dataclass(frozen=True)
class Union:
    """Distinct (user, item) entries of the lists, grouped by user, with every list's rank and score."""

    names: tuple[str, ...]
    users: np.ndarray
    items: np.ndarray
    ranks: np.ndarray
    scores: np.ndarray
    n_users: int


@dataclass(frozen=True)
class Fused:
    """Per user, candidates in slots: item rows, the selection score, the RRF score and rank, per list rank/score.

    ``scores`` is what selected and ordered the candidates (the RRF score, or the first-stage model's
    score); ``rrf`` and ``rrf_rank`` (1 = the user's best union entry by RRF) are kept either way. Empty
    slots: item -1, scores -inf, rrf_rank 0; a list that does not hold the item: rank 0, score NaN (per
    list values on the last axis, in names order).
    """

    names: tuple[str, ...]
    rows: np.ndarray
    scores: np.ndarray
    ranks: np.ndarray
    source_scores: np.ndarray
    rrf: np.ndarray
    rrf_rank: np.ndarray

    def users_at(self, positions: np.ndarray) -> Fused:
        """Return the candidates of the users at the given positions only."""
        return Fused(
            self.names,
            self.rows[positions],
            self.scores[positions],
            self.ranks[positions],
            self.source_scores[positions],
            self.rrf[positions],
            self.rrf_rank[positions],
        )

    def take(self, slots: np.ndarray, scores: np.ndarray | None = None) -> Fused:
        """Return the candidates at the given (users, K) slot indices (-1: empty), optionally rescored."""
        safe = np.maximum(slots, 0)
        empty = slots < 0

        def pick(values: np.ndarray, fill: float) -> np.ndarray:
            out = np.take_along_axis(values, safe.reshape(safe.shape + (1,) * (values.ndim - 2)), axis=1)
            out[empty] = fill
            return out

        new_scores = self.scores if scores is None else scores
        return Fused(
            self.names,
            pick(self.rows, -1),
            pick(new_scores, -np.inf),
            pick(self.ranks, 0),
            pick(self.source_scores, np.nan),
            pick(self.rrf, -np.inf),
            pick(self.rrf_rank, 0),
        )


def union_of(lists: Mapping[str, Lists]) -> Union:
    """Return the union of the lists (all of one set of users, same row order)."""
    names = tuple(sorted(lists))
    n_users = len(next(iter(lists.values())).rows) if lists else 0
    parts: tuple[list[np.ndarray], ...] = ([], [], [], [], [])  # users, items, source, rank, score
    for source, name in enumerate(names):
        rows = lists[name].rows
        user, slot = np.nonzero(rows >= 0)
        for part, values in zip(
            parts, (user, rows[user, slot], np.full(len(user), source), slot + 1, lists[name].scores[user, slot]), strict=True
        ):
            part.append(values)
    u, i, s, r, v = (np.concatenate(x) if x else np.zeros(0) for x in parts)
    n_items = int(i.max(initial=0)) + 1
    keys, inverse = np.unique(u.astype(np.int64) * n_items + i.astype(np.int64), return_inverse=True)
    ranks = np.zeros((len(keys), len(names)), dtype=np.int32)
    scores = np.full((len(keys), len(names)), np.nan, dtype=np.float32)
    ranks[inverse, s.astype(np.int64)] = r
    scores[inverse, s.astype(np.int64)] = v
    return Union(names, (keys // n_items).astype(np.int64), (keys % n_items).astype(np.int64), ranks, scores, n_users)


def _within_user(mask: np.ndarray, users: np.ndarray, n_users: int) -> np.ndarray:
    """Return, for entries sorted by user, how many earlier entries of the same user have mask set."""
    running = np.cumsum(mask) - mask
    first = np.searchsorted(users, np.arange(n_users))
    before = np.r_[running, running[-1] + mask[-1] if len(mask) else 0][first]
    return running - before[users]


def rrf_scores(union: Union, params: FusionParams) -> np.ndarray:
    """Return every union entry's weighted reciprocal-rank score."""
    weights = np.array([params.weights.get(name, 0.0) for name in union.names], dtype=np.float64)
    return np.where(union.ranks > 0, weights / (params.rrf_k + np.maximum(union.ranks, 1)), 0.0).sum(axis=1)


def _choose(union: Union, fused: np.ndarray, quota: int, k: int, is_new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (the chosen union entries in output order, the RRF rank of every entry, 0 if dropped)."""
    keep = np.flatnonzero(fused > 0)
    # the union is sorted by (user, item) and lexsort is stable: equal scores keep the lower item first
    order = keep[np.lexsort((-fused[keep], union.users[keep]))]
    users, new = union.users[order], is_new[union.items[order]]
    rank = np.zeros(len(fused), dtype=np.int32)
    rank[order] = _within_user(np.ones(len(order), dtype=bool), users, union.n_users) + 1
    by_quota = new & (_within_user(new, users, union.n_users) < quota)
    room = k - np.bincount(users[by_quota], minlength=union.n_users)
    rest = ~by_quota
    return order[by_quota | (rest & (_within_user(rest, users, union.n_users) < room[users]))], rank


def select(union: Union, params: FusionParams, is_new: np.ndarray) -> Fused:
    """Return the K fused candidates per user of a union by RRF (see the module docstring)."""
    fused = rrf_scores(union, params)
    chosen, rank = _choose(union, fused, round(params.new_quota * params.k), params.k, is_new)
    slot = _within_user(np.ones(len(chosen), dtype=bool), union.users[chosen], union.n_users)
    return _fused_arrays(union, chosen, slot, fused, rank, params.k)


def _fused_arrays(union: Union, chosen: np.ndarray, slot: np.ndarray, fused: np.ndarray, rank: np.ndarray, k: int) -> Fused:
    """Return the Fused arrays with the chosen entries at their slots."""
    n, s = union.n_users, len(union.names)
    rows = np.full((n, k), -1, dtype=np.int32)
    scores = np.full((n, k), -np.inf, dtype=np.float32)
    ranks = np.zeros((n, k, s), dtype=np.int32)
    source_scores = np.full((n, k, s), np.nan, dtype=np.float32)
    rrf_rank = np.zeros((n, k), dtype=np.int32)
    u = union.users[chosen]
    rows[u, slot], scores[u, slot], rrf_rank[u, slot] = union.items[chosen], fused[chosen], rank[chosen]
    ranks[u, slot], source_scores[u, slot] = union.ranks[chosen], union.scores[chosen]
    return Fused(union.names, rows, scores, ranks, source_scores, scores.copy(), rrf_rank)


def whole_union(lists: Mapping[str, Lists], params: FusionParams) -> Fused:
    """Return every union entry of each user in RRF order (lists of weight 0 kept, at a negligible weight)."""
    union = union_of(lists)
    floor = 1e-6 * max([w for w in params.weights.values() if w > 0], default=1.0)
    kept = replace(params, weights={n: max(params.weights.get(n, 0.0), floor) for n in union.names}, new_quota=0.0)
    width = int(np.bincount(union.users, minlength=union.n_users).max(initial=0)) if len(union.users) else 0
    chosen, rank = _choose(union, rrf_scores(union, kept), 0, width, np.zeros(1 + int(union.items.max(initial=0)), bool))
    slot = _within_user(np.ones(len(chosen), dtype=bool), union.users[chosen], union.n_users)
    out = _fused_arrays(union, chosen, slot, rrf_scores(union, params), rank, max(width, 1))
    return out


def source_only(params: FusionParams, name: str) -> FusionParams:
    """Return params whose selection is one list's items in its order (every other list at weight 0, no quota)."""
    return replace(params, weights={n: 1.0 if n == name else 0.0 for n in {*params.weights, name}}, new_quota=0.0)


def top_up(fused: Fused, fill: Lists) -> Fused:
    """Return the candidates with each user's empty slots filled from the fill list (its items not already there, in order).

    A filled slot is held by no list (ranks 0, source scores NaN, RRF 0); its score is below the user's others
    (the lower of 0 and the user's lowest score, minus 1, 2, ...) so that rank order and score order agree.
    """
    rows = fused.rows.astype(np.int64)
    width = rows.shape[1]
    n_items = int(max(rows.max(initial=0), fill.rows.max(initial=0))) + 1
    user = np.arange(len(rows), dtype=np.int64)[:, None]
    fresh = (fill.rows >= 0) & ~np.isin(user * n_items + fill.rows, (user * n_items + rows)[rows >= 0])
    have = (rows >= 0).sum(axis=1, keepdims=True)
    slot = have + np.cumsum(fresh, axis=1) - 1
    take = fresh & (slot < width)
    if not take.any():
        return fused
    u, j = np.nonzero(take)
    s = slot[take]
    finite = np.where(np.isfinite(fused.scores) & (fused.rows >= 0), fused.scores, np.inf).min(axis=1)
    base = np.minimum(np.where(np.isfinite(finite), finite, 0.0), 0.0)
    out = replace(fused, rows=fused.rows.copy(), scores=fused.scores.copy(), rrf=fused.rrf.copy(), rrf_rank=fused.rrf_rank.copy())
    out.rows[u, s] = fill.rows[u, j]
    out.scores[u, s] = base[u] - (s - have[u, 0] + 1)
    out.rrf[u, s], out.rrf_rank[u, s] = 0.0, 0
    return out


def select_slots(rows: np.ndarray, scores: np.ndarray, is_new: np.ndarray, k: int, quota: float) -> np.ndarray:
    """Return (users, k) slot indices of the best k by score per row, the best round(quota k) new items first in.

    Ties keep the lower slot; the chosen slots are ordered by score; -1 fills what cannot be filled.
    """
    filled = rows >= 0
    score = np.where(filled, scores, -np.inf)
    order = np.argsort(-score, axis=1, kind="stable")
    ordered_ok = np.take_along_axis(filled, order, axis=1)
    new = np.take_along_axis(filled & is_new[np.maximum(rows, 0)], order, axis=1)
    q = round(quota * k)
    by_quota = new & (np.cumsum(new, axis=1) <= q)
    rest = ordered_ok & ~by_quota
    room = k - by_quota.sum(axis=1, keepdims=True)
    chosen = by_quota | (rest & (np.cumsum(rest, axis=1) <= room))
    position = np.where(chosen, np.cumsum(chosen, axis=1) - 1, k)
    out = np.full((rows.shape[0], k + 1), -1, dtype=np.int64)
    np.put_along_axis(out, position, np.where(chosen, order, -1), axis=1)
    return out[:, :k]


_DEFAULTS = CandidateSettings()


@dataclass(frozen=True)
class TuningGrid:
    """The values tune_fusion tries."""

    weights: Sequence[float] = (0.0, 0.3, 1.0, 3.0)
    rrf_k: Sequence[float] = (5.0, 20.0, 60.0)
    new_quota: Sequence[float] = tuple(_DEFAULTS.fusion_quota_grid)
    rounds: int = 2
    cold_target: float = _DEFAULTS.fusion_cold_target
    fixed: Mapping[str, float] = field(default_factory=dict)
    quota_lists: Sequence[str] = ("content_new",)


@dataclass(frozen=True)
class _Labels:
    """Per union entry: relevant in the split, and relevant with a cold item; relevant counts per user."""

    relevant: np.ndarray
    cold: np.ndarray
    n_relevant: np.ndarray
    n_cold: int


def _labels(union: Union, split: Split, n_items: int) -> _Labels:
    """Return the union entries' labels from the split (union users are positions in split.users)."""
    local = np.searchsorted(split.users, split.relevant_users).astype(np.int64)
    keys = union.users * n_items + union.items
    relevant = np.isin(keys, local * n_items + split.relevant_items)
    cold = np.isin(keys, local[split.cold] * n_items + split.relevant_items[split.cold])
    return _Labels(relevant, cold, np.bincount(local, minlength=union.n_users), int(split.cold.sum()))


def _score(union: Union, params: FusionParams, is_new: np.ndarray, labels: _Labels) -> dict[str, float]:
    """Return recall@K and cold recall@K of the chosen entries (the metrics_of definitions)."""
    chosen, _ = _choose(union, rrf_scores(union, params), round(params.new_quota * params.k), params.k, is_new)
    hits = np.bincount(union.users[chosen[labels.relevant[chosen]]], minlength=union.n_users)
    evaluated = labels.n_relevant > 0
    recall = float((hits[evaluated] / labels.n_relevant[evaluated]).mean()) if evaluated.any() else math.nan
    cold = float(labels.cold[chosen].sum() / labels.n_cold) if labels.n_cold else math.nan
    return {"recall_at_k": recall, "cold_recall_at_k": cold}


def _weight_rounds(
    union: Union, params: FusionParams, grid: TuningGrid, is_new: np.ndarray, labels: _Labels, rounds: int
) -> tuple[FusionParams, float]:
    """Return the params after coordinate ascent on recall@K over weights and rrf_k, and their recall."""
    best = _score(union, params, is_new, labels)["recall_at_k"]
    for _ in range(rounds):
        for name in union.names:
            if name in grid.fixed:
                continue
            for value in grid.weights:
                if value <= 0 and name in grid.quota_lists:
                    continue  # the quota draws new items from these lists: a weight of 0 would empty it
                trial = replace(params, weights={**params.weights, name: value})
                recall = _score(union, trial, is_new, labels)["recall_at_k"]
                if recall > best + 1e-12:
                    params, best = trial, recall
        for value in grid.rrf_k:
            recall = _score(union, replace(params, rrf_k=value), is_new, labels)["recall_at_k"]
            if recall > best + 1e-12:
                params, best = replace(params, rrf_k=value), recall
    return params, best


def _pick_quota(union: Union, params: FusionParams, grid: TuningGrid, is_new: np.ndarray, labels: _Labels) -> FusionParams:
    """Return params with the smallest quota whose validation cold recall reaches the target (else the largest)."""
    for quota in sorted(grid.new_quota):
        cold = _score(union, replace(params, new_quota=quota), is_new, labels)["cold_recall_at_k"]
        if math.isnan(cold) or cold >= grid.cold_target:
            return replace(params, new_quota=quota)
    return replace(params, new_quota=max(grid.new_quota))


def tune_fusion(
    lists: Mapping[str, Lists], split: Split, is_new: np.ndarray, n_items: int, k: int, grid: TuningGrid = TuningGrid()
) -> tuple[FusionParams, dict[str, float]]:
    """Return the tuned FusionParams and their validation metrics (lists are of split.users, in that order)."""
    union = union_of(lists)
    labels = _labels(union, split, n_items)
    params = FusionParams({name: grid.fixed.get(name, 1.0) for name in union.names}, new_quota=0.0, k=k)
    params, _ = _weight_rounds(union, params, grid, is_new, labels, grid.rounds)
    params = _pick_quota(union, params, grid, is_new, labels)
    params, _ = _weight_rounds(union, params, grid, is_new, labels, 1)
    metrics = metrics_of(select(union, params, is_new).rows, split, n_items, k)
    log.info("fusion tuned on %d validation users: %s -> %s", len(split.users), params, metrics)
    return params, metrics
