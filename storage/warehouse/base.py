"""The warehouse interface: what tasks, the CLI and serving ask of it, and the small records it returns."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeAlias

import pyarrow as pa

from storage.warehouse.analyst import RowStream
from storage.warehouse.runs import QueryResult, RunLookups

Rows: TypeAlias = pa.Table | pa.RecordBatchReader  # a stream is read once, as the insert consumes it


class Warehouse(RunLookups):
    """Where analysts read results: run records, item scores, candidates, quarantine.

    A warehouse is created by the first run that writes to it (the adapter then knows the embedding width);
    an adapter opened without ``embedding_dim`` only reads and updates an existing one.
    """

    @abstractmethod
    def record_run(self, run: dict[str, Any]) -> None:
        """Insert or update one scoring_runs row (keys are RUN_COLUMNS)."""

    @abstractmethod
    def record_quarantine(self, run_id: str, quarantine: pa.Table) -> int:
        """Replace the quarantine rows of run_id; return how many were written."""

    @abstractmethod
    def record_metrics(self, run_id: str, metrics: pa.Table) -> int:
        """Replace the retrieval_metrics rows of run_id; return how many were written."""

    @abstractmethod
    def publish(
        self,
        run: dict[str, Any],
        item_scores: Rows,
        candidates: Rows,
        before_commit: Callable[[str], None] | None = None,
        fence: LeaseFence | None = None,
        keep_replaced: bool = False,
    ) -> str:
        """Publish run in one transaction (rows of the same run_date replaced); return the latest published run after it."""

    @abstractmethod
    def finalize_publication(self, run_id: str) -> int:
        """Delete the rows a published run's publication kept of the runs it replaced; return how many rows went."""

    @abstractmethod
    def mark_run(self, flow_run_id: str, status: str, message: str) -> int:
        """Set status and message of the unpublished run of a Prefect flow run; return rows changed."""

    @abstractmethod
    def rollback_latest(self, before_commit: Callable[[str], None] | None = None) -> tuple[str, str | None]:
        """Mark the latest published run 'rolled_back'; return (rolled_back_run_id, new_latest_run_id)."""

    @abstractmethod
    def retract(self, run_id: str, message: str, before_commit: Callable[[str | None], None] | None = None) -> str | None:
        """Mark a published run 'failed' and delete its rows (a later publish step failed); return the run latest again."""

    @abstractmethod
    def acquire_lease(self, key: str, holder: str, ttl_s: float, is_stale: Callable[[str], bool]) -> LeaseRow | None:
        """Take the lease key for holder unless another live holder has it; return that holder's row, or None when taken."""

    @abstractmethod
    def renew_lease(self, key: str, holder: str, ttl_s: float, run_id: str | None = None) -> bool:
        """Push holder's lease on key ttl_s into the future (and name its run); return False when holder lost it."""

    @abstractmethod
    def release_lease(self, key: str, holder: str) -> None:
        """Drop holder's lease on key (nothing when another holder has it now)."""

    @abstractmethod
    def with_newest(self, action: Callable[[list[str]], None]) -> list[str]:
        """Call action with the two newest published runs (latest first) inside a write transaction; return them.

        No publication commits meanwhile, so action may move the cache pointers to match.
        """

    def prune(self, keep_runs: int | None, keep_days: int | None) -> int:
        """Delete the rows of old runs (never the latest published one); return how many runs were pruned."""
        return self.prune_runs(keep_runs, keep_days).runs

    @abstractmethod
    def prune_runs(self, keep_runs: int | None, keep_days: int | None) -> Pruned:
        """Delete the rows of old runs (never the latest published one); return what went and whose lake folders may go."""

    @abstractmethod
    def query(self, sql: str, params: list[Any] | None = None) -> QueryResult:
        """Run nightscore's own read-only SQL (``?`` placeholders) and return its result; WarehouseMissing before the first run.

        The internal read path (latest run, `nightscore runs`/`status`): trusted SQL only. Analysts' SQL goes
        through `analyst_query`.
        """

    @abstractmethod
    def analyst_rows(self, sql: str, limit: int = 0, timeout_s: float | None = None) -> AbstractContextManager[RowStream]:
        """Open one analyst's read-only statement in the sandbox; yield its rows as a stream (`nightscore query`).

        Exactly one SELECT (WITH, VALUES, table functions, EXPLAIN of a SELECT included) over the warehouse's own
        tables and views; anything else, and any SQL error, raises QueryRefused (exit 2) with a one-line message.
        It never holds what a publication waits for (DuckDB: it reads a snapshot of the file; PostgreSQL: the
        writers' lock is one a read-only role cannot take). limit: rows at most (0: all); timeout_s: the statement
        is stopped after it (QueryTimeout), reading its rows included; Ctrl-C cancels it (KeyboardInterrupt).
        """

    def analyst_query(self, sql: str, limit: int = 0, timeout_s: float | None = None) -> QueryResult:
        """Run one analyst's statement as `analyst_rows` does and return its whole (capped) result."""
        with self.analyst_rows(sql, limit, timeout_s) as stream:
            rows = [row for batch in stream for row in batch]
        return QueryResult(stream.columns, rows, stream.truncated)


@dataclass(frozen=True)
class Pruned:
    """What a prune did in the warehouse, and what it leaves to the lake."""

    runs: int  # runs that lost rows or changed status
    folders: list[tuple[str, str]]  # (run_id, run_date) whose run folders may go: old runs, superseded attempts
    dates_gone: list[str]  # run_dates no published run is left for (their lake partitions may go)


@dataclass(frozen=True)
class LeaseRow:
    """Who holds a lease (a run_leases row): what a waiting attempt names in its message."""

    key: str
    run_id: str | None
    holder: str
    renewed_at: datetime | None
    expires_at: datetime


@dataclass(frozen=True)
class LeaseFence:
    """The lease a publication must still hold when it commits (checked inside its transaction)."""

    key: str
    holder: str


class Session(Protocol):
    """One open write transaction of a backend."""

    row_lock: str  # what a read appends to lock its rows until the transaction ends ("" where the writer holds all)

    def run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Execute one statement with ``?`` placeholders; return its rows (none for plain DML)."""

    def insert(self, table: str, rows: Rows, columns: list[str]) -> None:
        """Append rows (only the named columns) to table; a stream is consumed batch by batch."""


def present_columns(rows: Rows, columns: list[str]) -> list[str]:
    """Return the columns the rows carry, in table order (an absent nullable column is left NULL)."""
    names = set(rows.schema.names)
    return [column for column in columns if column in names]


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]
