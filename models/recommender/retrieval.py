"""Stage one of the ranker: user vectors from interactions, exact top-K items by cosine, in chunks.

User vector (documented formula):
    u = normalize( sum_i  w_event(i) * 0.5 ** (age_days(i) / half_life_days) * e_item(i) )
where age_days is measured from the run's reference time. Items a user interacted with are
excluded from that user's candidates. Ties in score are broken by the lower item index.

Memory: items come either as one (n_items, dim) tensor or as `ItemChunks`, consecutive blocks of rows
read once per pass. With chunks, top_k_items keeps a running top-K per user (state O(users x K)) and
the score block is chunk x block rows, so nothing of size O(items x dim) is ever held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import polars as pl
import torch


@dataclass(frozen=True)
class Interactions:
    """Interactions as parallel arrays: user row, item row and weight per interaction."""

    user_rows: np.ndarray
    item_rows: np.ndarray
    weights: np.ndarray
    n_users: int


ITEM_BLOCK = 16_384  # default item rows per block: a score block is user chunk x ITEM_BLOCK floats


@dataclass(frozen=True)
class ItemChunks:
    """Item embeddings as consecutive blocks of rows: ``read()`` yields float32 (rows, dim) arrays covering 0..n_items-1."""

    n_items: int
    read: Callable[[], Iterable[np.ndarray]]

    @classmethod
    def of(cls, vectors: np.ndarray, size: int) -> ItemChunks:
        """Return chunks of an in-memory matrix, size rows each (tests and small callers)."""
        return cls(len(vectors), lambda: (vectors[start : start + size] for start in range(0, len(vectors), size)))

    def blocks(self, device: torch.device) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield (first item row, block tensor on device) for each block, in row order."""
        offset = 0
        for block in self.read():
            yield offset, torch.from_numpy(np.array(block, dtype=np.float32, order="C", copy=True)).to(device)
            offset += len(block)

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """Return the vectors of ascending unique item rows, in one pass over the blocks."""
        parts, offset = [], 0
        for block in self.read():
            lo, hi = np.searchsorted(rows, [offset, offset + len(block)])
            parts.append(np.asarray(block, dtype=np.float32)[rows[lo:hi] - offset])
            offset += len(block)
        return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)


def interaction_weight_expr(now: datetime, event_weights: Mapping[str, float], half_life_days: float) -> pl.Expr:
    """Return the weight of each interaction (columns event, ts): w_event x 0.5 ** (age_days / half_life_days).

    Ages are measured from ``now`` and clipped at 0; unknown events weigh 0.
    """
    age_days = ((pl.lit(now) - pl.col("ts")).dt.total_seconds() / 86_400.0).clip(lower_bound=0.0)
    event = pl.col("event").replace_strict(dict(event_weights), default=0.0, return_dtype=pl.Float64)
    return (event * pl.lit(0.5).pow(age_days / half_life_days)).alias("weight")


def interaction_weights(
    interactions: pl.DataFrame, now: datetime, event_weights: Mapping[str, float], half_life_days: float
) -> np.ndarray:
    """Return each interaction's weight (interaction_weight_expr) as float32, in row order."""
    weight = interaction_weight_expr(now, event_weights, half_life_days)
    return interactions.select(weight).get_column("weight").to_numpy().astype(np.float32)


def user_vectors(item_vectors: torch.Tensor | ItemChunks, inter: Interactions) -> torch.Tensor:
    """Return unit-norm user vectors: the weighted sum of their items' embeddings, normalised.

    With ItemChunks only the interacted items' vectors are gathered (O(distinct interacted items x dim));
    the sum is the same, in the same order, as over the whole matrix.
    """
    if isinstance(item_vectors, ItemChunks):
        rows, inverse = np.unique(inter.item_rows.astype(np.int64), return_inverse=True)
        compact = torch.from_numpy(item_vectors.gather(rows).reshape(len(rows), -1))
        return user_vectors(compact, Interactions(inter.user_rows, inverse.reshape(-1), inter.weights, inter.n_users))
    users = torch.zeros((inter.n_users, item_vectors.shape[1]), dtype=torch.float32, device=item_vectors.device)
    user_rows = torch.from_numpy(inter.user_rows.astype(np.int64)).to(item_vectors.device)
    weighted = item_vectors[torch.from_numpy(inter.item_rows.astype(np.int64)).to(item_vectors.device)]
    weighted = weighted * torch.from_numpy(inter.weights.astype(np.float32)).to(item_vectors.device)[:, None]
    users.index_add_(0, user_rows, weighted)
    return torch.nn.functional.normalize(users, p=2, dim=1)


def top_k_items(
    users: torch.Tensor, items: torch.Tensor | ItemChunks, seen: Interactions, k: int, chunk: int
) -> tuple[np.ndarray, np.ndarray]:
    """Return (item rows, scores), each (n_users, k'), of the top items per user excluding seen ones.

    Memory is bounded by chunk x n_items for a tensor, chunk x block rows plus n_users x k for ItemChunks
    (blocks read once). k' = min(k, n_items); a slot a user cannot fill (fewer unseen items than k) has
    item row -1 and score -inf.
    """
    if isinstance(items, ItemChunks):
        return _streamed_top_k(users, items, seen, k, chunk)
    k = min(k, items.shape[0])
    out_rows = np.full((users.shape[0], k), -1, dtype=np.int64)
    out_scores = np.full((users.shape[0], k), -np.inf, dtype=np.float32)
    order = np.argsort(seen.user_rows, kind="stable")
    seen_users, seen_items = seen.user_rows[order].astype(np.int64), seen.item_rows[order].astype(np.int64)
    bounds = np.searchsorted(seen_users, np.arange(0, users.shape[0] + chunk, chunk))
    for n, start in enumerate(range(0, users.shape[0], chunk)):
        stop = min(start + chunk, users.shape[0])
        lo, hi = bounds[n], bounds[n + 1] if n + 1 < len(bounds) else len(seen_users)
        mask = (seen_users[lo:hi] - start, seen_items[lo:hi])
        rows, scores = _chunk_top_k(users[start:stop], items, mask, k)
        out_rows[start:stop], out_scores[start:stop] = rows, scores
    return out_rows, out_scores


def _seen_by_user(seen: Interactions) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(seen.user_rows, kind="stable")
    return seen.user_rows[order].astype(np.int64), seen.item_rows[order].astype(np.int64)


def _streamed_top_k(
    users: torch.Tensor, items: ItemChunks, seen: Interactions, k: int, chunk: int
) -> tuple[np.ndarray, np.ndarray]:
    """Return top_k_items over item blocks: each block's exact top-K merged into a running top-K per user."""
    k = min(k, items.n_items)
    out_rows = np.full((users.shape[0], k), -1, dtype=np.int64)
    out_scores = np.full((users.shape[0], k), -np.inf, dtype=np.float32)
    seen_users, seen_items = _seen_by_user(seen)
    starts = list(range(0, users.shape[0], chunk))
    bounds = np.searchsorted(seen_users, [*starts, users.shape[0]])
    for offset, block in items.blocks(users.device):
        in_block = (seen_items >= offset) & (seen_items < offset + block.shape[0])
        for n, start in enumerate(starts):
            stop = min(start + chunk, users.shape[0])
            pick = np.flatnonzero(in_block[bounds[n] : bounds[n + 1]]) + bounds[n]
            mask = (seen_users[pick] - start, seen_items[pick] - offset)
            rows, scores = _chunk_top_k(users[start:stop], block, mask, min(k, block.shape[0]))
            rows[rows >= 0] += offset
            out_rows[start:stop], out_scores[start:stop] = _merge_top_k(
                out_rows[start:stop], out_scores[start:stop], rows, scores, k
            )
    return out_rows, out_scores


def _merge_top_k(
    rows_a: np.ndarray, scores_a: np.ndarray, rows_b: np.ndarray, scores_b: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Return the first k of two per-user lists by (score desc, item row asc); empty slots (-1, -inf) last."""
    rows, scores = np.concatenate([rows_a, rows_b], axis=1), np.concatenate([scores_a, scores_b], axis=1)
    order = np.lexsort((rows, -scores), axis=1)[:, :k]
    rows, scores = np.take_along_axis(rows, order, axis=1), np.take_along_axis(scores, order, axis=1)
    rows[~np.isfinite(scores)] = -1
    return rows, scores


def _chunk_top_k(
    users: torch.Tensor, items: torch.Tensor, seen: tuple[np.ndarray, np.ndarray], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Return the exact top-k (score desc, item asc) of users x items with the seen pairs excluded."""
    with torch.inference_mode():
        scores = users @ items.T
        scores[torch.from_numpy(seen[0]).to(scores.device), torch.from_numpy(seen[1]).to(scores.device)] = -torch.inf
        width = min(k + 8, scores.shape[1])
        values_t, index_t = torch.topk(scores, width, dim=1)
        values, index = values_t.cpu().numpy(), index_t.cpu().numpy()
        order = np.lexsort((index, -values), axis=1)[:, :k]  # exact (score desc, item asc): deterministic ties
        rows, vals = np.take_along_axis(index, order, axis=1), np.take_along_axis(values, order, axis=1)
        # torch.topk picks among equal scores arbitrarily: a row whose cut falls inside a run of equal
        # (finite) scores is sorted whole and stably instead, so equal scores come lower item first
        tied = np.flatnonzero((values[:, k - 1] == values[:, width - 1]) & np.isfinite(values[:, k - 1]))
        if width < scores.shape[1] and len(tied):
            exact_vals, exact_rows = torch.sort(
                scores[torch.from_numpy(tied).to(scores.device)], dim=1, descending=True, stable=True
            )
            rows[tied], vals[tied] = exact_rows[:, :k].cpu().numpy(), exact_vals[:, :k].cpu().numpy()
    rows[~np.isfinite(vals)] = -1
    return rows, vals
