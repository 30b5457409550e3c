"""What every candidate source shares: the run's frames encoded as integer rows, a History, ranked Lists.

The frames are encoded once (encode_run): item rows follow the items frame's order, user rows the sorted
distinct user ids of the interactions. A History is the part of the log a source may learn from (every
interaction before a cutoff, or all of them), with each interaction's weight as of the History's ``now``:

    weight = event_weight(event) x 0.5 ** (age_days / half_life_days),  age measured from now, clipped at 0.

A source returns Lists: (users, n) item rows best first with their scores, -1 / -inf in slots it cannot
fill. Items a user has in the History are never returned to that user.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

import numpy as np
import polars as pl
import scipy.sparse as sp

_US_PER_DAY = 86_400 * 1_000_000


@dataclass(frozen=True)
class Catalogue:
    """The run's items and users by row: ids, creation time (epoch us), topic code (-1: none), topic score."""

    item_ids: pl.Series
    user_ids: pl.Series
    created_us: np.ndarray
    topic: np.ndarray
    topic_names: tuple[str, ...]
    topic_score: np.ndarray

    @property
    def n_items(self) -> int:
        """Return the number of item rows."""
        return len(self.item_ids)

    @property
    def n_users(self) -> int:
        """Return the number of user rows."""
        return len(self.user_ids)


@dataclass(frozen=True)
class EncodedLog:
    """Interactions over known items as parallel arrays, sorted by (user row, ts, item row)."""

    user_rows: np.ndarray
    item_rows: np.ndarray
    ts_us: np.ndarray
    events: pl.Series


@dataclass(frozen=True)
class History:
    """The interactions a source learns from, weighted as of ``now`` (sorted by user row, then ts)."""

    user_rows: np.ndarray
    item_rows: np.ndarray
    ts_us: np.ndarray
    event_weight: np.ndarray
    weights: np.ndarray
    n_users: int
    n_items: int
    now: datetime


@dataclass(frozen=True)
class Lists:
    """Per-user ranked items: rows and scores of shape (users, n); empty slots hold -1 and -inf."""

    rows: np.ndarray
    scores: np.ndarray


class Source(Protocol):
    """A fitted candidate source: one or more named lists (content also yields its new-items view)."""

    name: str

    def recommend(self, users: np.ndarray, n: int) -> dict[str, Lists]:
        """Return {list name: the top-n unseen items of the given user rows, best first}."""
        ...


def encode_run(items: pl.DataFrame, interactions: pl.DataFrame) -> tuple[Catalogue, EncodedLog]:
    """Return the catalogue and the encoded log; interactions of unknown items are dropped.

    Args:
        items: item_id, created_at and, when known, topic (text, may be null) and topic_score.
        interactions: user_id, item_id, event, ts.
    """
    topics = (
        items.get_column("topic").drop_nulls().unique().sort() if "topic" in items.columns else pl.Series([], dtype=pl.String)
    )
    index = items.select("item_id").with_row_index("item_row")
    users = interactions.select("user_id").unique().sort("user_id").with_row_index("user_row")
    joined = (
        interactions.join(index, on="item_id")
        .join(users, on="user_id")
        .with_columns(pl.col("ts").dt.epoch("us").alias("ts_us"))
        .sort("user_row", "ts_us", "item_row")
    )
    topic_code = (
        items.get_column("topic").replace_strict(topics.to_list(), list(range(len(topics))), default=-1, return_dtype=pl.Int32)
        if "topic" in items.columns
        else pl.Series(np.full(items.height, -1, np.int32))
    )
    score = items.get_column("topic_score") if "topic_score" in items.columns else pl.Series(np.zeros(items.height))
    catalogue = Catalogue(
        index.get_column("item_id"),
        users.get_column("user_id"),
        items.get_column("created_at").dt.epoch("us").fill_null(0).to_numpy().astype(np.int64),
        topic_code.fill_null(-1).to_numpy().astype(np.int32),
        tuple(topics.to_list()),
        score.cast(pl.Float32).fill_null(0.0).to_numpy().astype(np.float32),
    )
    log = EncodedLog(
        joined.get_column("user_row").to_numpy().astype(np.int32),
        joined.get_column("item_row").to_numpy().astype(np.int32),
        joined.get_column("ts_us").to_numpy().astype(np.int64),
        joined.get_column("event"),
    )
    return catalogue, log


def history_of(
    log: EncodedLog,
    catalogue: Catalogue,
    keep: np.ndarray | None,
    now: datetime,
    event_weights: Mapping[str, float],
    half_life_days: float,
) -> History:
    """Return the History of the log rows where keep is True (all when None), weighted as of now."""
    keep = np.ones(len(log.user_rows), dtype=bool) if keep is None else keep
    event = (
        log.events.filter(pl.Series(keep)).replace_strict(dict(event_weights), default=0.0, return_dtype=pl.Float64).to_numpy()
    )
    ts = log.ts_us[keep]
    age_days = np.clip((to_epoch_us(now) - ts) / _US_PER_DAY, 0.0, None)
    weights = (event * 0.5 ** (age_days / half_life_days)).astype(np.float32)
    return History(
        log.user_rows[keep], log.item_rows[keep], ts, event.astype(np.float32), weights, catalogue.n_users, catalogue.n_items, now
    )


def to_epoch_us(moment: datetime) -> int:
    """Return a datetime (naive = UTC) as integer microseconds since the Unix epoch."""
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return (aware - datetime(1970, 1, 1, tzinfo=UTC)) // datetime.resolution


def user_item_matrix(history: History, values: np.ndarray | None = None) -> sp.csr_matrix:
    """Return the (users, items) CSR matrix of summed weights (or of the given per-row values)."""
    data = history.weights if values is None else values
    matrix = sp.csr_matrix(
        (data.astype(np.float32), (history.user_rows, history.item_rows)),
        shape=(history.n_users, history.n_items),
        dtype=np.float32,
    )
    matrix.sum_duplicates()
    return matrix


def history_lengths(history: History) -> np.ndarray:
    """Return the number of interactions of each user row."""
    return np.bincount(history.user_rows, minlength=history.n_users)


def item_counts(history: History) -> np.ndarray:
    """Return the number of interactions of each item row."""
    return np.bincount(history.item_rows, minlength=history.n_items)


def empty_lists(n_users: int, n: int) -> Lists:
    """Return Lists with every slot empty."""
    return Lists(np.full((n_users, n), -1, dtype=np.int32), np.full((n_users, n), -np.inf, dtype=np.float32))


def _ranked(rows: np.ndarray, cols: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return the triple sorted by row, value desc, col asc, and each entry's position within its row."""
    order = np.lexsort((cols, -values, rows))
    rows, cols, values = rows[order], cols[order], values[order]
    first = np.r_[True, rows[1:] != rows[:-1]] if len(rows) else np.zeros(0, dtype=bool)
    starts = np.maximum.accumulate(np.where(first, np.arange(len(rows)), 0))
    return rows, cols, values, np.arange(len(rows)) - starts


def top_n_per_row(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, n_rows: int, n: int) -> Lists:
    """Return the top-n (value desc, col asc) entries of each row of a sparse (rows, cols, values) triple."""
    out = empty_lists(n_rows, n)
    if len(rows) == 0:
        return out
    rows, cols, values, position = _ranked(rows, cols, values)
    keep = position < n
    out.rows[rows[keep], position[keep]] = cols[keep]
    out.scores[rows[keep], position[keep]] = values[keep]
    return out


def top_n_entries(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the top-n entries of each row of a sparse triple as a triple (rows ascending, best first): memory in
    entries kept, never rows x n (a catalogue's items x neighbours is mostly empty)."""
    rows, cols, values, position = _ranked(rows, cols, values)
    keep = position < n
    return rows[keep], cols[keep], values[keep]


def drop_seen(seen: sp.csr_matrix, users: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Return a mask of (local user row, item) pairs the user has NOT seen (users[rows] are the user rows)."""
    sub = seen[users]
    n_items = seen.shape[1]
    seen_keys = np.repeat(np.arange(len(users), dtype=np.int64), np.diff(sub.indptr)) * n_items + sub.indices
    return ~np.isin(rows.astype(np.int64) * n_items + cols, seen_keys)
