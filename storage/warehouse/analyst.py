"""What analysts' SQL shares on both backends: the result as a capped stream of row batches, and its messages."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

from core.errors import QueryTimeout

BATCH_ROWS = 1_000  # rows fetched (and rendered) at a time: memory stays flat whatever the result's size
# Whitespace, comments and opening parentheses before a statement's first keyword.
_LEADING_NOISE = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/|\()*", re.DOTALL)


class RowStream:
    """An analyst query's result while it is read: its columns, then its rows in batches, at most ``limit`` in all.

    ``truncated`` is known once the batches are read to the end: whether the query had more rows than the limit.
    """

    def __init__(self, columns: list[str], batches: Iterator[Sequence[tuple[Any, ...]]], limit: int = 0) -> None:
        self.columns, self.limit, self.truncated = columns, limit, False
        self._batches = batches

    def __iter__(self) -> Iterator[list[tuple[Any, ...]]]:
        """Yield the rows in batches, stopping at the limit (0: none); a row past it sets truncated."""
        taken = 0
        for batch in self._batches:
            if self.limit and taken + len(batch) > self.limit:
                if taken < self.limit:
                    yield list(batch[: self.limit - taken])
                self.truncated = True
                return
            taken += len(batch)
            if batch:
                yield list(batch)

    @staticmethod
    def next_fetch(limit: int, fetched: int) -> int:
        """Return how many rows a backend fetches next after fetched: a batch, up to the limit and one more (0: done)."""
        return BATCH_ROWS if not limit else max(0, min(BATCH_ROWS, limit + 1 - fetched))


def leading_keyword(sql: str) -> str:
    """Return a statement's first keyword in capitals ('' when there is none): what a refusal names."""
    found = re.match(r"[A-Za-z]+", _LEADING_NOISE.sub("", sql, count=1))
    return found.group(0).upper() if found else ""


def timed_out(timeout_s: float) -> QueryTimeout:
    """Return the failure of a statement stopped at the query timeout."""
    return QueryTimeout(
        f"query stopped after {timeout_s:g} s (NIGHTSCORE_QUERY_TIMEOUT_S): narrow it (a WHERE on run_date or run_id, "
        "a LIMIT) or raise the setting"
    )
