"""Item-item co-visitation: items consumed close together by the same users, normalised, as a sparse top-M table.

Fit (fit_cooccurrence), all in sparse arrays, never an items x items dense matrix:
1. Each user's distinct items (weight = sum of their interactions' weights, position = their latest
   interaction), the last ``max_history`` of them by time.
2. Pairs (a, b) of a user's items at most ``window`` positions apart, weighing
       sqrt(w_a * w_b) / distance / log2(2 + items of the user),
   so a heavy user's pairs count less and neighbours in a session more; added in both directions.
3. co(a, b) = sum of pair weights; similarity s(a, b) = co(a, b) / (m_a ** alpha * m_b ** (1 - alpha)),
   m = an item's summed weight over the capped histories (alpha = 0.5 is cosine-like).
4. The ``neighbours`` best b per a are kept. Pairs are aggregated in passes over a partition of a (item row
   mod P, P chosen so that a pass holds at most ``pairs_per_pass`` pairs): memory is bounded by that, plus
   the kept table (items x neighbours at most).
Recommend: a user's score of item j = sum over their capped history of w_i x s(i, j); seen items excluded.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import polars as pl
import scipy.sparse as sp

from core.settings import CandidateSettings
from models.recommender.sources.base import History, Lists, drop_seen, empty_lists, top_n_entries, top_n_per_row, user_item_matrix

log = logging.getLogger(__name__)


_DEFAULTS = CandidateSettings()


@dataclass(frozen=True)
class CooccurrenceParams:
    """Parameters of the co-visitation table (see the module docstring)."""

    max_history: int = _DEFAULTS.cooc_max_history
    window: int = _DEFAULTS.cooc_window
    neighbours: int = _DEFAULTS.cooc_neighbours
    alpha: float = _DEFAULTS.cooc_alpha
    pairs_per_pass: int = _DEFAULTS.cooc_pairs_per_pass
    score_chunk: int = 2048


@dataclass(frozen=True)
class Sequences:
    """Each user's capped distinct items in time order: user row, item row, weight (parallel arrays)."""

    users: np.ndarray
    items: np.ndarray
    weights: np.ndarray


def user_sequences(history: History, max_history: int) -> Sequences:
    """Return each user's last max_history distinct items, ordered by their latest interaction."""
    key = history.user_rows.astype(np.int64) * history.n_items + history.item_rows
    order = np.lexsort((np.arange(len(key)), key))  # history is in time order, so the index is the time
    sorted_key = key[order]
    starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]]) if len(key) else np.zeros(0, np.int64)
    weights = np.add.reduceat(history.weights[order].astype(np.float64), starts) if len(key) else np.zeros(0)
    last = np.maximum.reduceat(order, starts) if len(key) else np.zeros(0, np.int64)
    users, items = sorted_key[starts] // history.n_items, sorted_key[starts] % history.n_items
    by_time = np.lexsort((last, users))
    users, items, weights = users[by_time], items[by_time], weights[by_time]
    from_end = np.r_[np.flatnonzero(users[1:] != users[:-1]), len(users) - 1] if len(users) else np.zeros(0, np.int64)
    ends = np.repeat(from_end, np.diff(np.r_[-1, from_end]))
    keep = ends - np.arange(len(users)) < max_history
    return Sequences(users[keep].astype(np.int32), items[keep].astype(np.int32), weights[keep].astype(np.float32))


def _pairs(seq: Sequences, distance: int, damping: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (a, b, weight) of the items ``distance`` positions apart within a user's sequence."""
    same = seq.users[:-distance] == seq.users[distance:]
    a, b = seq.items[:-distance][same], seq.items[distance:][same]
    weight = np.sqrt(seq.weights[:-distance][same] * seq.weights[distance:][same]) / distance
    return a, b, (weight * damping[seq.users[:-distance][same]]).astype(np.float32)


def _pass_table(
    seq: Sequences, params: CooccurrenceParams, damping: np.ndarray, mass: np.ndarray, part: int, n_parts: int, n_items: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the kept (a, b, similarity) triples of the items a with a mod n_parts == part."""
    rows, cols, vals = [], [], []
    for distance in range(1, params.window + 1):
        a, b, w = _pairs(seq, distance, damping)
        for left, right in ((a, b), (b, a)):
            pick = left % n_parts == part
            rows.append(left[pick] // n_parts)
            cols.append(right[pick])
            vals.append(w[pick])
    n_rows = -(-n_items // n_parts)
    table = sp.coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n_rows, n_items)
    ).tocsr()  # sums duplicate pairs, in a fixed order
    table.sum_duplicates()
    coo = table.tocoo()
    a = coo.row.astype(np.int64) * n_parts + part
    sim = coo.data / (mass[a] ** params.alpha * mass[coo.col] ** (1.0 - params.alpha))
    rows_kept, b, kept = top_n_entries(coo.row, coo.col, sim.astype(np.float32), params.neighbours)
    return rows_kept.astype(np.int64) * n_parts + part, b.astype(np.int64), kept


class CooccurrenceSource:
    """Fitted co-visitation source: the sparse neighbour table and each user's capped, weighted history."""

    name = "cooccurrence"

    def __init__(self, table: sp.csr_matrix, profiles: sp.csr_matrix, seen: sp.csr_matrix, score_chunk: int) -> None:
        self.table, self.profiles, self.seen, self.score_chunk = table, profiles, seen, score_chunk

    def recommend(self, users: np.ndarray, n: int) -> dict[str, Lists]:
        """Return {cooccurrence: the top-n unseen items by summed similarity to each user's history}."""
        out = empty_lists(len(users), n)
        for start in range(0, len(users), self.score_chunk):
            part = users[start : start + self.score_chunk]
            scores = (self.profiles[part] @ self.table).tocoo()
            keep = drop_seen(self.seen, part, scores.row, scores.col) & (scores.data > 0)
            lists = top_n_per_row(scores.row[keep], scores.col[keep], scores.data[keep], len(part), n)
            out.rows[start : start + len(part)], out.scores[start : start + len(part)] = lists.rows, lists.scores
        return {self.name: out}


def fit_cooccurrence(history: History, params: CooccurrenceParams = CooccurrenceParams()) -> CooccurrenceSource:
    """Return the co-visitation source fitted on a History (see the module docstring)."""
    seq = user_sequences(history, params.max_history)
    lengths = np.bincount(seq.users, minlength=history.n_users)
    damping = (1.0 / np.log2(2.0 + lengths)).astype(np.float32)
    mass = np.bincount(seq.items, weights=seq.weights, minlength=history.n_items).astype(np.float64)
    mass = np.maximum(mass, 1e-12)
    n_pairs = 2 * sum(int((seq.users[:-d] == seq.users[d:]).sum()) for d in range(1, params.window + 1) if d < len(seq.users))
    n_parts = max(1, math.ceil(n_pairs / params.pairs_per_pass))
    parts = [_pass_table(seq, params, damping, mass, p, n_parts, history.n_items) for p in range(n_parts)]
    a, b, s = (np.concatenate([part[i] for part in parts]) for i in range(3))
    table = sp.csr_matrix((s, (a, b)), shape=(history.n_items, history.n_items), dtype=np.float32)
    profiles = sp.csr_matrix((seq.weights, (seq.users, seq.items)), shape=(history.n_users, history.n_items), dtype=np.float32)
    log.info("co-visitation: %d pairs in %d passes, %d kept neighbour entries", n_pairs, n_parts, table.nnz)
    return CooccurrenceSource(table, profiles, user_item_matrix(history), params.score_chunk)


NEIGHBOUR_SCHEMA = {"item_id": pl.String(), "neighbour_id": pl.String(), "weight": pl.Float32()}


def neighbour_frame(fitted: CooccurrenceSource, item_ids: pl.Series, top: int) -> pl.DataFrame:
    """Return the fitted table's ``top`` best neighbours of each item as (item_id, neighbour_id, weight), best first.

    Args:
        fitted: a fitted co-visitation source.
        item_ids: the catalogue's item ids, in the table's row order.
        top: neighbours kept per item (the table already holds at most ``CooccurrenceParams.neighbours``).
    """
    coo = fitted.table.tocoo()
    positive = coo.data > 0
    rows, cols, weights = top_n_entries(coo.row[positive], coo.col[positive], coo.data[positive], top)
    return pl.DataFrame(
        {
            "item_id": item_ids.gather(rows.astype(np.int64)),
            "neighbour_id": item_ids.gather(cols.astype(np.int64)),
            "weight": weights.astype(np.float32),
        },
        schema=NEIGHBOUR_SCHEMA,
    )
