"""Content source: today's user-vector cosine over the item embeddings (models.recommender.retrieval), in two views.

    content       the top-N unseen items by cos(user vector, item embedding) over the whole catalogue
    content_new   the same score restricted to new items: no interaction in the History (of those, the
                  ``max_new_items`` created last, which bounds the cost on a catalogue with a long
                  untouched tail); the only list that reaches such items, the one the fusion's quota
                  draws from
User vectors are the weighted sum of the user's items' embeddings, normalised (retrieval.user_vectors'
formula with the History's weights, summed block by block so that memory stays users x dim). Embeddings stream
as ItemChunks: each recommend call makes two passes over the
blocks (gather the users' items, then score every block: retrieval.top_k_items); the new items' vectors
are gathered once (first call) and scored as one small matrix. Users with no history get nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from models.recommender.retrieval import Interactions, ItemChunks, top_k_items
from models.recommender.sources.base import History, Lists, item_counts

CONTENT, CONTENT_NEW = "content", "content_new"
NEW_SCORE_BUDGET = 1 << 24  # floats in one (users x new items) score block: 64 MiB


class ContentSource:
    """Fitted content source: embeddings as blocks, the History's rows grouped by user, the new-item view."""

    name = CONTENT

    def __init__(self, items: ItemChunks, history: History, new_items: np.ndarray, device: torch.device, chunk: int) -> None:
        if items.n_items != history.n_items:
            raise ValueError(f"embeddings cover {items.n_items} items, the history {history.n_items}")
        self.items, self.history, self.device, self.chunk = items, history, device, chunk
        self.new_rows = np.flatnonzero(new_items)
        self._new_vectors: torch.Tensor | None = None
        self.starts = np.searchsorted(history.user_rows, np.arange(history.n_users + 1))

    def _user_history(self, users: np.ndarray) -> Interactions:
        """Return the History rows of the given users, re-numbered 0..len(users)-1 in that order."""
        pieces = [np.arange(self.starts[u], self.starts[u + 1]) for u in users]
        index = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
        local = np.repeat(np.arange(len(users)), [len(p) for p in pieces])
        return Interactions(local, self.history.item_rows[index].astype(np.int64), self.history.weights[index], len(users))

    def _user_vectors(self, inter: Interactions) -> torch.Tensor:
        """Return retrieval.user_vectors' unit vectors, summed block by block (memory: users x dim)."""
        total: torch.Tensor | None = None
        for offset, block in self.items.blocks(torch.device("cpu")):
            pick = (inter.item_rows >= offset) & (inter.item_rows < offset + block.shape[0])
            part = Interactions(inter.user_rows[pick], inter.item_rows[pick] - offset, inter.weights[pick], inter.n_users)
            vectors = _weighted_sum(block, part)
            total = vectors if total is None else total + vectors
        if total is None:
            return torch.zeros((inter.n_users, 0), device=self.device)
        return torch.nn.functional.normalize(total, p=2, dim=1).to(self.device)

    def _new_matrix(self) -> torch.Tensor:
        """Return the new items' embeddings (gathered in one pass over the blocks, then kept)."""
        if self._new_vectors is None:
            gathered = self.items.gather(self.new_rows).reshape(len(self.new_rows), -1)
            self._new_vectors = torch.from_numpy(np.ascontiguousarray(gathered, dtype=np.float32)).to(self.device)
        return self._new_vectors

    def recommend(self, users: np.ndarray, n: int) -> dict[str, Lists]:
        """Return {content, content_new} lists of the given user rows."""
        inter = self._user_history(users)
        vectors = self._user_vectors(inter)
        rows, scores = top_k_items(vectors, self.items, inter, n, self.chunk)
        out = {CONTENT: (rows, scores)}
        if len(self.new_rows):  # new items have no interaction: nobody has seen them, nothing to mask
            none = Interactions(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), len(users))
            chunk = max(1, min(self.chunk, NEW_SCORE_BUDGET // len(self.new_rows)))
            new_rows, new_scores = top_k_items(vectors, self._new_matrix(), none, n, chunk)
            out[CONTENT_NEW] = (np.where(new_rows >= 0, self.new_rows[np.maximum(new_rows, 0)], -1), new_scores)
        else:
            out[CONTENT_NEW] = (np.full((len(users), 0), -1), np.full((len(users), 0), -np.inf))
        has_history = np.bincount(inter.user_rows, minlength=len(users)) > 0
        lists = {}
        for name, (r, s) in out.items():
            r, s = r.astype(np.int32), s.astype(np.float32)
            r[~has_history], s[~has_history] = -1, -np.inf
            lists[name] = _pad(Lists(r, s), n)
        return lists


def _weighted_sum(block: torch.Tensor, inter: Interactions) -> torch.Tensor:
    """Return the per-user weighted sum of one block's item vectors (rows local to the block)."""
    users = torch.zeros((inter.n_users, block.shape[1]), dtype=torch.float32)
    weighted = block[torch.from_numpy(inter.item_rows.astype(np.int64))]
    weighted = weighted * torch.from_numpy(inter.weights.astype(np.float32))[:, None]
    users.index_add_(0, torch.from_numpy(inter.user_rows.astype(np.int64)), weighted)
    return users


def _pad(lists: Lists, n: int) -> Lists:
    """Return lists widened to n slots (top-k is capped at the catalogue size)."""
    missing = n - lists.rows.shape[1]
    if missing <= 0:
        return lists
    rows = np.hstack([lists.rows, np.full((len(lists.rows), missing), -1, np.int32)])
    return Lists(rows, np.hstack([lists.scores, np.full((len(lists.rows), missing), -np.inf, np.float32)]))


def new_item_mask(history: History, created_us: np.ndarray, max_new_items: int) -> np.ndarray:
    """Return the items with no interaction in the History, at most max_new_items of them (the newest)."""
    untouched = np.flatnonzero(item_counts(history) == 0)
    newest = untouched[np.lexsort((untouched, -created_us[untouched]))][:max_new_items]
    mask = np.zeros(history.n_items, dtype=bool)
    mask[newest] = True
    return mask


def fit_content(
    items: ItemChunks,
    history: History,
    created_us: np.ndarray,
    max_new_items: int = 100_000,
    device: torch.device | None = None,
    chunk: int = 2048,
) -> ContentSource:
    """Return the content source over streamed item embeddings (unit-norm rows, in item-row order)."""
    mask = new_item_mask(history, created_us, max_new_items)
    return ContentSource(items, history, mask, device or torch.device("cpu"), chunk)
