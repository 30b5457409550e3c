"""The co-visitation boost: candidates that co-occur with a user's fresh events score higher.

A published run may name its co-visitation neighbours in serving.json (``serving/<run_id>/neighbours.parquet``:
item_id, neighbour_id, weight; a few per item). They are held as CSR arrays over an item id index, each item's
weights divided by its largest (so one fresh event adds at most 1 to a candidate). A candidate's boost is the sum,
over the user's fresh event items, of its normalised weight as their neighbour; the service adds
``cooc_boost`` times it to the ranker's score.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import polars as pl


@dataclass(frozen=True)
class Neighbours:
    """Each item's neighbours: row r's are columns[indptr[r]:indptr[r + 1]] with weights (max 1 per row)."""

    index: dict[str, int]  # item id -> its row (and column) number
    indptr: np.ndarray
    columns: np.ndarray
    weights: np.ndarray

    @property
    def size(self) -> int:
        """Return the number of (item, neighbour) pairs held."""
        return len(self.columns)


def neighbours_from_frame(frame: pl.DataFrame) -> Neighbours:
    """Return the compact form of a neighbour table (item_id, neighbour_id, weight); non-positive weights dropped."""
    vocab = pl.concat([frame.get_column("item_id"), frame.get_column("neighbour_id")]).unique(maintain_order=True)
    codes = pl.DataFrame({"id": vocab, "code": np.arange(len(vocab), dtype=np.int64)})
    pairs = (
        frame.filter(pl.col("weight") > 0)
        .join(codes.rename({"id": "item_id", "code": "row"}), on="item_id")
        .join(codes.rename({"id": "neighbour_id", "code": "col"}), on="neighbour_id")
        .with_columns((pl.col("weight") / pl.col("weight").max().over("row")).cast(pl.Float32))
        .sort("row", "col")
    )
    rows = pairs.get_column("row").to_numpy()
    return Neighbours(
        dict(zip(vocab.to_list(), range(len(vocab)), strict=True)),
        np.searchsorted(rows, np.arange(len(vocab) + 1)).astype(np.int64),
        pairs.get_column("col").to_numpy().astype(np.int32),
        pairs.get_column("weight").to_numpy(),
    )


def boost_scores(neighbours: Neighbours, recent: Iterable[str], candidates: list[str]) -> np.ndarray:
    """Return each candidate's summed normalised weight as a neighbour of the recent items (0 for none)."""
    rows = np.array([neighbours.index[i] for i in recent if i in neighbours.index], dtype=np.int64)
    starts = neighbours.indptr[rows]
    lengths = neighbours.indptr[rows + 1] - starts
    out = np.zeros(len(candidates), dtype=np.float32)
    if lengths.sum() == 0:
        return out
    flat = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
    found, inverse = np.unique(neighbours.columns[flat], return_inverse=True)
    sums = np.bincount(inverse, weights=neighbours.weights[flat]).astype(np.float32)
    wanted = np.array([neighbours.index.get(i, -1) for i in candidates], dtype=np.int64)
    at = np.minimum(np.searchsorted(found, wanted), len(found) - 1)
    hit = found[at] == wanted
    out[hit] = sums[at[hit]]
    return out
