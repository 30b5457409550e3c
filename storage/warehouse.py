"""The warehouse adapters: DuckDB (embedded default) and PostgreSQL (storage/warehouse_postgres.py).

Both run the same SQL for every write (``SqlWarehouse``); a backend only supplies a transaction, a
bulk insert and a read-only query. Publication, rollback and pruning are each one transaction.
SQL parameters are ``?`` placeholders on both backends.
"""

from __future__ import annotations

import logging
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import duckdb
import pyarrow as pa
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential

from nightscore.errors import NightscoreError, PublishError, QueryRefused, UsageError, WarehouseBusy, WarehouseMissing
from storage.duckdb_gate import GATE, config_key
from storage.warehouse_schema import (
    CANDIDATE_COLUMNS,
    ITEM_SCORE_COLUMNS,
    METRIC_COLUMNS,
    NEWEST_FIRST,
    QUARANTINE_COLUMNS,
    RUN_COLUMNS,
    ddl,
    object_names,
)

log = logging.getLogger(__name__)

# Statuses of runs that were published once: a flow hook must never overwrite them.
ONCE_PUBLISHED = ("published", "replaced", "rolled_back", "pruned")
RUN_DATA_TABLES = ("item_scores", "user_candidates", "quarantine", "retrieval_metrics")
DUCKDB_MEMORY_LIMIT = "512MB"  # buffer pool of a write transaction; more spills to disk
Rows: TypeAlias = pa.Table | pa.RecordBatchReader  # a stream is read once, as the insert consumes it


class QueryResult:
    """Columns and rows of a read-only query."""

    def __init__(self, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        self.columns, self.rows = columns, rows

    def records(self) -> list[dict[str, Any]]:
        """Return the rows as column-name -> value dicts."""
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


@dataclass(frozen=True)
class PublishedRun:
    """The identity of a published run: what "the latest published run" resolves to."""

    run_id: str
    run_date: str  # YYYY-MM-DD


class Warehouse(ABC):
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
    def analyst_query(self, sql: str) -> QueryResult:
        """Run one analyst's read-only statement in the sandbox and return its result (`nightscore query`).

        Exactly one SELECT (WITH, VALUES, table functions included) over the warehouse's own tables and views;
        anything else, and any SQL error, raises QueryRefused (exit 2) with a one-line message.
        """

    def latest_published(self, excluding: str | None = None) -> PublishedRun | None:
        """Return the latest published run (other than ``excluding``), or None when none has published yet.

        The one lookup of "the latest published run" (the ``latest_*`` views order runs the same way). Only a
        warehouse that does not exist yet means "none"; a locked or unreachable one raises.
        """
        sql = (
            f"SELECT run_id, CAST(run_date AS VARCHAR) FROM scoring_runs WHERE status = 'published' AND run_id <> ? "
            f"ORDER BY {NEWEST_FIRST} LIMIT 1"
        )
        try:
            rows = self.query(sql, [excluding or ""]).rows
        except WarehouseMissing:
            return None
        return PublishedRun(rows[0][0], rows[0][1]) if rows else None


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


class SqlWarehouse(Warehouse):
    """The write logic both backends share; a subclass supplies ``_transaction`` and ``query``."""

    @abstractmethod
    def _transaction(self) -> AbstractContextManager[Session]:
        """Return a context that yields a Session, commits on exit and rolls back on any exception."""

    def record_run(self, run: dict[str, Any]) -> None:
        """Insert or update one scoring_runs row."""
        with self._transaction() as session:
            _upsert_run(session, run)

    def record_quarantine(self, run_id: str, quarantine: pa.Table) -> int:
        """Replace the quarantine rows of run_id; return how many were written."""
        with self._transaction() as session:
            session.run("DELETE FROM quarantine WHERE run_id = ?", [run_id])
            session.insert("quarantine", quarantine, QUARANTINE_COLUMNS)
        return quarantine.num_rows

    def record_metrics(self, run_id: str, metrics: pa.Table) -> int:
        """Replace the retrieval_metrics rows of run_id (kept for failed runs too: they say why); return how many."""
        with self._transaction() as session:
            session.run("DELETE FROM retrieval_metrics WHERE run_id = ?", [run_id])
            session.insert("retrieval_metrics", metrics, METRIC_COLUMNS)
        return metrics.num_rows

    def publish(
        self,
        run: dict[str, Any],
        item_scores: Rows,
        candidates: Rows,
        before_commit: Callable[[str], None] | None = None,
        fence: LeaseFence | None = None,
        keep_replaced: bool = False,
    ) -> str:
        """Put this run's rows in and mark it published, all in one transaction; return the latest published run after it.

        The latest is this run unless a newer run_date is published already (a backfill of an older date: its rows
        are queryable by date, latest_* stay on the newer run). A published run of the same run_date becomes
        'replaced'; its rows are deleted now, or with ``keep_replaced`` only by `finalize_publication` (so that a
        later step's failure can `retract` back to it). ``before_commit`` gets the latest run inside the transaction
        (e.g. to switch the cache pointer when it is this run); if it raises, nothing changes. ``fence``: the lease
        this run must still hold, checked inside the transaction.
        """
        with self._transaction() as session:
            if fence is not None:
                _check_fence(session, fence)
            _supersede_run_date(session, run["run_id"], run["run_date"], keep_replaced)
            session.insert("item_scores", item_scores, ITEM_SCORE_COLUMNS)
            session.insert("user_candidates", candidates, CANDIDATE_COLUMNS)
            _upsert_run(session, {**run, "status": "published", "published_at": _now()})
            latest = _latest(session) or run["run_id"]
            if before_commit is not None:
                before_commit(latest)
        return latest

    def finalize_publication(self, run_id: str) -> int:
        """Delete the rows of runs this published run replaced (same run_date); nothing when it is no longer published."""
        with self._transaction() as session:
            found = session.run("SELECT run_date FROM scoring_runs WHERE run_id = ? AND status = 'published'", [run_id])
            if not found:
                return 0
            return sum(
                len(
                    session.run(f"DELETE FROM {table} WHERE run_date = ? AND run_id <> ? RETURNING run_id", [found[0][0], run_id])
                )
                for table in ("item_scores", "user_candidates")
            )

    def mark_run(self, flow_run_id: str, status: str, message: str) -> int:
        """Set status and message of the unpublished run of a Prefect flow run; return rows changed."""
        marks = ", ".join("?" for _ in ONCE_PUBLISHED)
        with self._transaction() as session:
            changed = session.run(
                "UPDATE scoring_runs SET status = ?, message = ?, finished_at = ? "
                f"WHERE flow_run_id = ? AND status NOT IN ({marks}) RETURNING run_id",
                [status, message[:1000], _now(), flow_run_id, *ONCE_PUBLISHED],
            )
        return len(changed)

    def rollback_latest(self, before_commit: Callable[[str], None] | None = None) -> tuple[str, str | None]:
        """Mark the latest published run 'rolled_back' so the previous published run is latest again.

        Args:
            before_commit: called with the new latest run_id inside the transaction (e.g. to switch
                the cache pointer); if it raises, nothing changes.

        Returns:
            (rolled_back_run_id, new_latest_run_id).

        Raises:
            UsageError: fewer than two published runs (nothing to roll back to).
        """
        with self._transaction() as session:
            newest = [row[0] for row in session.run(f"{_PUBLISHED} ORDER BY {NEWEST_FIRST} LIMIT 2")]
            if len(newest) < 2:
                raise UsageError(f"nothing to roll back to: {len(newest)} published run(s) in the warehouse")
            session.run(
                "UPDATE scoring_runs SET status = 'rolled_back', message = ? WHERE run_id = ?",
                [f"rolled back at {_now().isoformat(timespec='seconds')}; {newest[1]} is latest again", newest[0]],
            )
            if before_commit is not None:
                before_commit(newest[1])
        log.info("rolled back %s; latest is %s", newest[0], newest[1])
        return newest[0], newest[1]

    def retract(self, run_id: str, message: str, before_commit: Callable[[str | None], None] | None = None) -> str | None:
        """Take back a publication whose later steps failed; return the run that is latest again (None when none is).

        run_id becomes 'failed' and its item_scores and user_candidates rows are deleted; the run of the same run_date
        it replaced is published again when its rows are still there (a publication with ``keep_replaced`` that was
        not finalized). ``before_commit`` gets the new latest run inside the transaction, e.g. to move the cache
        pointers back. A run that is not published is left alone (nothing to take back).
        """
        with self._transaction() as session:
            changed = session.run(
                "UPDATE scoring_runs SET status = 'failed', message = ? WHERE run_id = ? "
                "AND status = 'published' RETURNING run_date",
                [message[:1000], run_id],
            )
            if changed:
                for table in ("item_scores", "user_candidates"):
                    session.run(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
                _restore_replaced(session, changed[0][0])
            latest = _latest(session)
            if changed and before_commit is not None:
                before_commit(latest)
        return latest

    def with_newest(self, action: Callable[[list[str]], None]) -> list[str]:
        """Call action with the two newest published runs (latest first) inside a write transaction; return them."""
        with self._transaction() as session:
            newest = [row[0] for row in session.run(f"{_PUBLISHED} ORDER BY {NEWEST_FIRST} LIMIT 2")]
            action(newest)
        return newest

    def acquire_lease(self, key: str, holder: str, ttl_s: float, is_stale: Callable[[str], bool]) -> LeaseRow | None:
        """Take key for holder unless a live other holder has it (not expired, not stale); return that holder's row."""
        now = _now()
        with self._lease_transaction() as session:
            rows = session.run(
                "SELECT lease_key, run_id, holder, renewed_at, expires_at FROM run_leases WHERE lease_key = ?", [key]
            )
            current = LeaseRow(*rows[0]) if rows else None
            if (
                current is not None
                and current.holder != holder
                and _aware(current.expires_at) > now
                and not is_stale(current.holder)
            ):
                return current
            session.run("DELETE FROM run_leases WHERE lease_key = ?", [key])
            session.run(
                "INSERT INTO run_leases (lease_key, holder, acquired_at, renewed_at, expires_at) VALUES (?, ?, ?, ?, ?)",
                [key, holder, now, now, now + timedelta(seconds=ttl_s)],
            )
        return None

    def renew_lease(self, key: str, holder: str, ttl_s: float, run_id: str | None = None) -> bool:
        """Push holder's lease on key ttl_s ahead (recording run_id when given); return False when holder lost it."""
        now = _now()
        with self._lease_transaction() as session:
            changed = session.run(
                "UPDATE run_leases SET renewed_at = ?, expires_at = ?, run_id = COALESCE(?, run_id) "
                "WHERE lease_key = ? AND holder = ? RETURNING lease_key",
                [now, now + timedelta(seconds=ttl_s), run_id, key, holder],
            )
        return bool(changed)

    def release_lease(self, key: str, holder: str) -> None:
        """Drop holder's lease on key; another holder's lease stays."""
        with self._lease_transaction() as session:
            session.run("DELETE FROM run_leases WHERE lease_key = ? AND holder = ?", [key, holder])

    def _lease_transaction(self) -> AbstractContextManager[Session]:
        """Return the transaction lease rows change in (PostgreSQL: without the writers' schema lock)."""
        return self._transaction()

    def prune_runs(self, keep_runs: int | None, keep_days: int | None) -> Pruned:
        """Delete item_scores, user_candidates and quarantine rows of old runs in one transaction.

        A run is old when it is beyond the newest ``keep_runs`` published runs (published runs of
        lower rank, and other runs that started before the oldest kept one was published), or when
        its run_date is more than ``keep_days`` days before today. The latest published run is never
        pruned, nor a run whose attempt holds a live lease. scoring_runs rows stay; pruned published runs
        get status 'pruned' so a rollback can never make an empty run latest.

        Returns:
            How many runs lost rows or changed status; the (run_id, run_date) whose lake folders may go (the old
            runs, and failed or interrupted attempts that a later publication of their date superseded); the
            run_dates left without a published run.
        """
        _check_keep(keep_runs, keep_days)
        with self._transaction() as session:
            live = _live_runs(session)
            doomed = _runs_to_prune(session, keep_runs, keep_days) - live
            touched = _runs_with_rows(session, doomed) | _published_among(session, doomed)
            if touched:
                marks = ", ".join("?" for _ in touched)
                for table in RUN_DATA_TABLES:
                    session.run(f"DELETE FROM {table} WHERE run_id IN ({marks})", sorted(touched))
                session.run(
                    f"UPDATE scoring_runs SET status = 'pruned' WHERE status = 'published' AND run_id IN ({marks})",
                    sorted(touched),
                )
            dates = {row[0]: str(row[1]) for row in session.run("SELECT run_id, CAST(run_date AS VARCHAR) FROM scoring_runs")}
            published = {
                str(row[0])
                for row in session.run(f"SELECT CAST(run_date AS VARCHAR) FROM ({_PUBLISHED}) p JOIN scoring_runs USING (run_id)")
            }
            folders = doomed | (_superseded_attempts(session) - live)
        log.info("pruned %d run(s); %d run folder(s) may go", len(touched), len(folders))
        gone = sorted({dates[run_id] for run_id in touched} - published)
        return Pruned(len(touched), sorted((run_id, dates[run_id]) for run_id in folders), gone)


_PUBLISHED = "SELECT run_id FROM scoring_runs WHERE status = 'published'"


def _now() -> datetime:
    return datetime.now(UTC)


def _check_keep(keep_runs: int | None, keep_days: int | None) -> None:
    if keep_runs is None and keep_days is None:
        raise UsageError("prune needs keep_runs, keep_days or both")
    if keep_runs is not None and keep_runs < 1:
        raise UsageError(f"keep_runs must be at least 1, got {keep_runs}")
    if keep_days is not None and keep_days < 0:
        raise UsageError(f"keep_days must be 0 or more, got {keep_days}")


def _runs_to_prune(session: Session, keep_runs: int | None, keep_days: int | None) -> set[str]:
    """Return the run_ids the keep rules let go (the latest published run never among them)."""
    published = session.run(f"SELECT run_id, published_at FROM scoring_runs WHERE status = 'published' ORDER BY {NEWEST_FIRST}")
    runs = session.run("SELECT run_id, run_date, COALESCE(published_at, started_at) FROM scoring_runs")
    doomed: set[str] = set()
    if keep_runs is not None and len(published) > keep_runs:
        kept = {run_id for run_id, _ in published[:keep_runs]}
        cutoff = min((at for _, at in published[:keep_runs] if at is not None), default=None)
        doomed |= {run_id for run_id, _ in published[keep_runs:]}
        if cutoff is not None:
            doomed |= {run_id for run_id, _, at in runs if run_id not in kept and at is not None and at < cutoff}
    if keep_days is not None:
        oldest_kept = date.today() - timedelta(days=keep_days)
        doomed |= {run_id for run_id, run_date, _ in runs if run_date is not None and run_date < oldest_kept}
    return doomed - {published[0][0]} if published else doomed


def _live_runs(session: Session) -> set[str]:
    """Return the runs whose attempt holds a lease that has not expired (never pruned under a running attempt)."""
    exists = session.run(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'run_leases' AND table_schema = current_schema()"
    )
    if not exists or not exists[0][0]:
        return set()
    return {row[0] for row in session.run("SELECT run_id FROM run_leases WHERE expires_at > ? AND run_id IS NOT NULL", [_now()])}


def _superseded_attempts(session: Session) -> set[str]:
    """Return the failed, interrupted or abandoned attempts of a run_date that a later publication of it superseded."""
    rows = session.run(
        "SELECT a.run_id FROM scoring_runs a WHERE a.status IN ('failed', 'interrupted', 'running') AND EXISTS ("
        "SELECT 1 FROM scoring_runs p WHERE p.run_date = a.run_date AND p.run_id <> a.run_id "
        "AND p.published_at IS NOT NULL AND p.published_at > a.started_at)"
    )
    return {row[0] for row in rows}


def _runs_with_rows(session: Session, run_ids: set[str]) -> set[str]:
    """Return the run_ids among run_ids that still have rows in a run data table."""
    if not run_ids:
        return set()
    marks = ", ".join("?" for _ in run_ids)
    union = " UNION ".join(f"SELECT DISTINCT run_id FROM {table} WHERE run_id IN ({marks})" for table in RUN_DATA_TABLES)
    return {row[0] for row in session.run(union, sorted(run_ids) * len(RUN_DATA_TABLES))}


def _published_among(session: Session, run_ids: set[str]) -> set[str]:
    """Return the run_ids among run_ids whose status is still 'published'."""
    if not run_ids:
        return set()
    marks = ", ".join("?" for _ in run_ids)
    return {row[0] for row in session.run(f"{_PUBLISHED} AND run_id IN ({marks})", sorted(run_ids))}


def _latest(session: Session) -> str | None:
    """Return the latest published run as the views define it (NEWEST_FIRST), inside a transaction."""
    rows = session.run(f"{_PUBLISHED} ORDER BY {NEWEST_FIRST} LIMIT 1")
    return rows[0][0] if rows else None


def _supersede_run_date(session: Session, run_id: str, run_date: Any, keep_replaced: bool) -> None:
    """Make room for run_id's rows: its own earlier rows and leftovers of unpublished runs of the date go.

    The published run of the date becomes 'replaced'; its rows go too unless keep_replaced.
    """
    kept = "SELECT run_id FROM scoring_runs WHERE status = 'published' AND run_id <> ?" if keep_replaced else None
    for table in ("item_scores", "user_candidates"):
        session.run(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
        if kept is None:
            session.run(f"DELETE FROM {table} WHERE run_date = ?", [run_date])
        else:
            session.run(f"DELETE FROM {table} WHERE run_date = ? AND run_id NOT IN ({kept})", [run_date, run_id])
    session.run(
        "UPDATE scoring_runs SET status = 'replaced' WHERE run_date = ? AND status = 'published' AND run_id <> ?",
        [run_date, run_id],
    )


def _restore_replaced(session: Session, run_date: Any) -> None:
    """Publish again the newest 'replaced' run of run_date whose rows are still in the warehouse (a retraction's undo)."""
    rows = session.run(
        "SELECT run_id FROM scoring_runs WHERE run_date = ? AND status = 'replaced' AND run_id IN "
        "(SELECT DISTINCT run_id FROM item_scores WHERE run_date = ?) ORDER BY published_at DESC LIMIT 1",
        [run_date, run_date],
    )
    if rows:
        session.run("UPDATE scoring_runs SET status = 'published' WHERE run_id = ?", [rows[0][0]])
        log.warning("run %s of %s is published again: the run that replaced it was retracted", rows[0][0], run_date)


def _check_fence(session: Session, fence: LeaseFence) -> None:
    """Raise PublishError unless fence.holder still holds fence.key (another attempt took the run date over)."""
    # FOR UPDATE (PostgreSQL): no other attempt takes the lease over while this publication commits; DuckDB's writer
    # holds the whole file already.
    rows = session.run(f"SELECT holder FROM run_leases WHERE lease_key = ?{session.row_lock}", [fence.key])
    if not rows or rows[0][0] != fence.holder:
        holder = rows[0][0] if rows else "nobody"
        raise PublishError(f"refusing to publish: this attempt no longer holds the lease on {fence.key} ({holder} does)")


def _aware(value: datetime) -> datetime:
    """Return a timestamp as an aware UTC datetime (DuckDB returns TIMESTAMPTZ in the session's zone)."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _upsert_run(session: Session, run: dict[str, Any]) -> None:
    unknown = set(run) - set(RUN_COLUMNS)
    if unknown:
        raise ValueError(f"unknown scoring_runs columns: {sorted(unknown)}")
    names = list(run)
    updates = ", ".join(f"{n} = excluded.{n}" for n in names if n != "run_id") or "run_id = excluded.run_id"
    session.run(
        f"INSERT INTO scoring_runs ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)}) "
        f"ON CONFLICT (run_id) DO UPDATE SET {updates}",
        [run[n] for n in names],
    )


class DuckDBSession:
    """A write transaction on a DuckDB connection (the process holds the file's one write lock)."""

    row_lock = ""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    def run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Execute one statement; return its rows."""
        return self.con.execute(sql, list(params)).fetchall()

    def insert(self, table: str, rows: Rows, columns: list[str]) -> None:
        """Append rows from Arrow (DuckDB reads the registered table in place, or the stream batch by batch)."""
        columns = present_columns(rows, columns)
        self.con.register("_incoming", rows.select(columns) if isinstance(rows, pa.Table) else rows)
        try:
            self.con.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(columns)} FROM _incoming")
        finally:
            self.con.unregister("_incoming")


# The analysts' DuckDB connection: no file, network or extension access beyond the warehouse file itself
# (COPY, EXPORT, ATTACH, read_csv/read_text/glob and INSTALL are refused by DuckDB), settings frozen.
ANALYST_DUCKDB_CONFIG: dict[str, str | bool] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_unsigned_extensions": False,
    "lock_configuration": True,
}


class DuckDBWarehouse(SqlWarehouse):
    """A DuckDB file; a connection is held only while it is used, with a bounded wait on another process's lock.

    ``lock_timeout_s`` bounds the wait in seconds (retries with exponential backoff until then); without it,
    ``lock_retries`` attempts are made.
    """

    def __init__(
        self,
        path: str,
        embedding_dim: int | None = None,
        lock_retries: int = 8,
        lock_backoff_s: float = 0.25,
        memory_limit: str = DUCKDB_MEMORY_LIMIT,
        lock_timeout_s: float | None = None,
    ) -> None:
        self.path = path
        self.memory_limit = memory_limit
        self.embedding_dim = embedding_dim
        self.lock_retries, self.lock_backoff_s, self.lock_timeout_s = lock_retries, lock_backoff_s, lock_timeout_s

    @contextmanager
    def _transaction(self) -> Iterator[DuckDBSession]:
        if self.embedding_dim is None and not Path(self.path).exists():
            raise WarehouseMissing(f"no warehouse at {self.path}: run `nightscore run nightly` first")
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        with self._connection(read_only=False) as con:
            # DuckDB keeps a transaction's new rows in its buffer pool (default: 80% of RAM); a cap makes a big
            # publication spill to <file>.tmp instead of holding every embedding of the run in memory.
            con.execute(f"SET memory_limit = '{self.memory_limit}'")
            self._ensure_tables(con)
            con.execute("BEGIN")
            try:
                yield DuckDBSession(con)
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    @contextmanager
    def _connection(self, read_only: bool, config: dict[str, str | bool] | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """Yield a connection, closed after; this process's connections of another configuration are waited for."""
        config = config or {}
        with GATE.holding(self.path, config_key(read_only, config), self._wait_bound_s()):
            con = self._connect_with_retry(read_only, config)
            try:
                yield con
            finally:
                con.close()

    def _wait_bound_s(self) -> float:
        """Return how long a connection waits for the file in all (lock_timeout_s, or the retries' backoff)."""
        if self.lock_timeout_s is not None:
            return self.lock_timeout_s
        return sum(min(5.0, self.lock_backoff_s * 2**attempt) for attempt in range(self.lock_retries))

    def _ensure_tables(self, con: duckdb.DuckDBPyConnection) -> None:
        """Create missing tables and views (with the embedding width this adapter was opened with), or require them."""
        if self.embedding_dim is not None:
            with GATE.schema_lock(self.path):  # two threads replacing one view at once conflict
                for statement in ddl(self.embedding_dim, "duckdb"):
                    con.execute(statement)
            self._check_width(con, self.embedding_dim)
        elif _missing_duckdb_objects(con):
            raise WarehouseMissing(f"no warehouse tables in {self.path}: run `nightscore run nightly` first")

    def _check_width(self, con: duckdb.DuckDBPyConnection, width: int) -> None:
        """Refuse a run whose embeddings do not fit the warehouse's item_scores.embedding column."""
        row = con.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_name = 'item_scores' AND column_name = 'embedding'"
        ).fetchone()
        declared = re.search(r"\[(\d+)\]", row[0]) if row else None
        if declared and int(declared.group(1)) != width:
            raise PublishError(
                f"warehouse {self.path} holds {declared.group(1)}-wide embeddings and this run's model makes "
                f"{width}-wide ones: publish to a new warehouse (NIGHTSCORE_WAREHOUSE_URL)"
            )

    def _connect_with_retry(self, read_only: bool, config: dict[str, str | bool] | None = None) -> duckdb.DuckDBPyConnection:
        """Connect, retrying with exponential backoff (tenacity) while another process holds the file's lock.

        A lock still held at the end of the bounded wait raises WarehouseBusy (a PublishError), never
        WarehouseMissing: a locked warehouse is not "no warehouse yet".
        """
        stop = (
            stop_after_delay(self.lock_timeout_s)
            if self.lock_timeout_s is not None
            else stop_after_attempt(self.lock_retries + 1)
        )
        retrying = Retrying(
            retry=retry_if_exception(_is_lock_error),
            stop=stop,
            wait=wait_exponential(multiplier=self.lock_backoff_s, max=5.0),
            reraise=True,
            before_sleep=lambda state: log.warning("warehouse %s locked (attempt %d), retrying", self.path, state.attempt_number),
        )
        started = time.monotonic()
        try:
            return retrying(duckdb.connect, self.path, read_only=read_only, config=config or {})
        except duckdb.IOException as exc:
            if not _is_lock_error(exc):
                raise NightscoreError(f"warehouse {self.path} cannot be opened: {_line(exc)}") from exc
            raise WarehouseBusy(
                f"warehouse {self.path} is locked by another process (waited {time.monotonic() - started:.0f} s): {_line(exc)}"
            ) from exc

    @contextmanager
    def _reading(self, config: dict[str, str | bool] | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """Yield a read-only connection on an existing warehouse (WarehouseMissing when there is none)."""
        if not Path(self.path).exists():
            raise WarehouseMissing(f"no warehouse at {self.path}: run `nightscore run nightly` first")
        with self._connection(read_only=True, config=config) as con:
            if _missing_duckdb_objects(con):
                raise WarehouseMissing(f"no warehouse tables in {self.path}: run `nightscore run nightly` first")
            yield con

    def query(self, sql: str, params: list[Any] | None = None) -> QueryResult:
        """Run SQL on a read-only connection (waiting for a writer's lock) and return its result."""
        with self._reading() as con:
            cursor = con.execute(sql, params or [])
            columns = [d[0] for d in cursor.description or []]
            return QueryResult(columns, cursor.fetchall())

    def analyst_query(self, sql: str) -> QueryResult:
        """Run one analyst SELECT on a sandboxed read-only connection (ANALYST_DUCKDB_CONFIG); QueryRefused otherwise."""
        with self._reading(ANALYST_DUCKDB_CONFIG) as con:
            try:
                _check_analyst_sql(con, sql)
                cursor = con.execute(sql)
                columns = [d[0] for d in cursor.description or []]
                return QueryResult(columns, cursor.fetchall())
            except duckdb.PermissionException as exc:  # the sandbox said no (a file, the network, an extension)
                raise QueryRefused(f"query refused: {_line(exc)}") from exc
            except duckdb.Error as exc:
                raise QueryRefused(f"query failed: {_line(exc)}") from exc


def _check_analyst_sql(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Raise QueryRefused unless sql is one SELECT whose tables are the warehouse's (or DuckDB's catalog) own."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryRefused(f"query failed: {_line(exc)}") from exc
    if len(statements) != 1:
        raise QueryRefused(f"query refused: give exactly one statement, got {len(statements)}")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise QueryRefused(
            f"query refused: only a read-only SELECT (or WITH ... SELECT) is allowed, got {statements[0].type.name}"
        )
    known = {
        str(row[0])
        for row in con.execute("SELECT table_name FROM duckdb_tables() UNION SELECT view_name FROM duckdb_views()").fetchall()
    }
    foreign = sorted(name for name in con.get_table_names(sql) if name not in known)
    if foreign:
        raise QueryRefused(f"query refused: {', '.join(foreign)} is not a warehouse table or view")


def present_columns(rows: Rows, columns: list[str]) -> list[str]:
    """Return the columns the rows carry, in table order (an absent nullable column is left NULL)."""
    names = set(rows.schema.names)
    return [column for column in columns if column in names]


def _is_lock_error(exc: BaseException) -> bool:
    return isinstance(exc, duckdb.IOException) and "lock" in str(exc).lower()


def _missing_duckdb_objects(con: duckdb.DuckDBPyConnection) -> int:
    """Return how many of the warehouse's tables and views the DuckDB file lacks."""
    names = object_names("duckdb")
    marks = ", ".join("?" for _ in names)
    row = con.execute(f"SELECT count(*) FROM information_schema.tables WHERE table_name IN ({marks})", names).fetchone()
    return len(names) - int(row[0]) if row else len(names)


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def open_warehouse(location: str, embedding_dim: int | None = None, lock_timeout_s: float | None = None) -> Warehouse:
    """Return the warehouse adapter for a location: a postgresql:// URL or a DuckDB file path.

    embedding_dim: the width of this run's embeddings, for the run that may create the tables; None to read and
    update an existing warehouse only. lock_timeout_s: how long to wait for another process's lock (None: the
    adapter's default).
    """
    if location.startswith(("postgresql://", "postgres://")):
        # psycopg is imported only when a PostgreSQL warehouse is used
        from storage.warehouse_postgres import PostgresWarehouse

        if lock_timeout_s is None:
            return PostgresWarehouse(location, embedding_dim=embedding_dim)
        return PostgresWarehouse(location, embedding_dim=embedding_dim, lock_timeout_s=lock_timeout_s)
    return DuckDBWarehouse(location, embedding_dim=embedding_dim, lock_timeout_s=lock_timeout_s)
