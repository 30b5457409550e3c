"""Content source: today's user-vector cosine over the item embeddings (models.retrieval), in two views.

    content       the top-N unseen items by cos(user vector, item embedding) over the whole catalogue
    content_new   the same score restricted to new items: no interaction in the History and created at
                  most ``new_days`` before the History's now (items with no interaction that are older
                  are dead stock, rarely wanted); the only list that reaches new items, and the one the
                  fusion's quota draws from
User vectors are the weighted sum of the user's items' embeddings, normalised (retrieval.user_vectors, with
the History's weights). Embeddings stream as ItemChunks: each recommend call makes two passes over the
blocks (gather the users' items, then score every block once for both views). Users with no history get
nothing (their vector would be zero).
"""

from __future__ import annotations

import numpy as np
import torch

from models.retrieval import Interactions, ItemChunks, streamed_top_k_views, user_vectors
from models.sources.base import History, Lists, item_counts, to_epoch_us

CONTENT, CONTENT_NEW = "content", "content_new"
_US_PER_DAY = 86_400 * 1_000_000


class ContentSource:
    """Fitted content source: embeddings as blocks, the History's rows grouped by user, the new-item view."""

    name = CONTENT

    def __init__(self, items: ItemChunks, history: History, new_items: np.ndarray, device: torch.device,
                 chunk: int) -> None:
        if items.n_items != history.n_items:
            raise ValueError(f"embeddings cover {items.n_items} items, the history {history.n_items}")
        self.items, self.history, self.device, self.chunk = items, history, device, chunk
        self.new_items = new_items
        self.starts = np.searchsorted(history.user_rows, np.arange(history.n_users + 1))

    def _user_history(self, users: np.ndarray) -> Interactions:
        """Return the History rows of the given users, re-numbered 0..len(users)-1 in that order."""
        pieces = [np.arange(self.starts[u], self.starts[u + 1]) for u in users]
        index = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
        local = np.repeat(np.arange(len(users)), [len(p) for p in pieces])
        return Interactions(local, self.history.item_rows[index].astype(np.int64), self.history.weights[index],
                            len(users))

    def recommend(self, users: np.ndarray, n: int) -> dict[str, Lists]:
        """Return {content, content_new} lists of the given user rows."""
        inter = self._user_history(users)
        vectors = user_vectors(self.items, inter).to(self.device)
        views = streamed_top_k_views(vectors, self.items, inter, n, self.chunk, [None, self.new_items])
        has_history = np.bincount(inter.user_rows, minlength=len(users)) > 0
        out = {}
        for name, (rows, scores) in zip((CONTENT, CONTENT_NEW), views, strict=True):
            rows, scores = rows.astype(np.int32), scores.astype(np.float32)
            rows[~has_history], scores[~has_history] = -1, -np.inf
            out[name] = _pad(Lists(rows, scores), n)
        return out


def _pad(lists: Lists, n: int) -> Lists:
    """Return lists widened to n slots (top-k is capped at the catalogue size)."""
    missing = n - lists.rows.shape[1]
    if missing <= 0:
        return lists
    rows = np.hstack([lists.rows, np.full((len(lists.rows), missing), -1, np.int32)])
    return Lists(rows, np.hstack([lists.scores, np.full((len(lists.rows), missing), -np.inf, np.float32)]))


def new_item_mask(history: History, created_us: np.ndarray, new_days: float) -> np.ndarray:
    """Return the items with no interaction in the History created at most new_days before its now."""
    age_days = (to_epoch_us(history.now) - created_us) / _US_PER_DAY
    return (item_counts(history) == 0) & (age_days <= new_days)


def fit_content(items: ItemChunks, history: History, created_us: np.ndarray, new_days: float = 30.0,
                device: torch.device | None = None, chunk: int = 2048) -> ContentSource:
    """Return the content source over streamed item embeddings (unit-norm rows, in item-row order)."""
    return ContentSource(items, history, new_item_mask(history, created_us, new_days), device or torch.device("cpu"), chunk)
