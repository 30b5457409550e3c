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
from storage.warehouse_schema import (
    CANDIDATE_COLUMNS,
    ITEM_SCORE_COLUMNS,
    NEWEST_FIRST,
    QUARANTINE_COLUMNS,
    RUN_COLUMNS,
    ddl,
    object_names,
)

log = logging.getLogger(__name__)

# Statuses of runs that were published once: a flow hook must never overwrite them.
ONCE_PUBLISHED = ("published", "replaced", "rolled_back", "pruned")
RUN_DATA_TABLES = ("item_scores", "user_candidates", "quarantine")
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
    def publish(
        self, run: dict[str, Any], item_scores: Rows, candidates: Rows, before_commit: Callable[[], None] | None = None,
    ) -> None:
        """Make run the published one in one transaction, replacing rows of the same run_date (tables or Arrow streams)."""

    @abstractmethod
    def mark_run(self, flow_run_id: str, status: str, message: str) -> int:
        """Set status and message of the unpublished run of a Prefect flow run; return rows changed."""

    @abstractmethod
    def rollback_latest(self, before_commit: Callable[[str], None] | None = None) -> tuple[str, str | None]:
        """Mark the latest published run 'rolled_back'; return (rolled_back_run_id, new_latest_run_id)."""

    @abstractmethod
    def retract(self, run_id: str, message: str, before_commit: Callable[[str | None], None] | None = None) -> str | None:
        """Mark a published run 'failed' (a later publish step failed); return the run that is latest again."""

    @abstractmethod
    def prune(self, keep_runs: int | None, keep_days: int | None) -> int:
        """Delete the rows of old runs (never the latest published one); return how many runs were pruned."""

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
        sql = (f"SELECT run_id, CAST(run_date AS VARCHAR) FROM scoring_runs WHERE status = 'published' AND run_id <> ? "
               f"ORDER BY {NEWEST_FIRST} LIMIT 1")
        try:
            rows = self.query(sql, [excluding or ""]).rows
        except WarehouseMissing:
            return None
        return PublishedRun(rows[0][0], rows[0][1]) if rows else None


class Session(Protocol):
    """One open write transaction of a backend."""

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

    def publish(
        self, run: dict[str, Any], item_scores: Rows, candidates: Rows, before_commit: Callable[[], None] | None = None,
    ) -> None:
        """Replace run_date's rows with this run's and mark it published, all in one transaction.

        ``before_commit`` (optional callable) runs inside the transaction after the rows are in;
        if it raises, the transaction rolls back and the previous publication stays current.
        """
        with self._transaction() as session:
            _replace_run_date(session, run["run_id"], run["run_date"])
            session.insert("item_scores", item_scores, ITEM_SCORE_COLUMNS)
            session.insert("user_candidates", candidates, CANDIDATE_COLUMNS)
            _upsert_run(session, {**run, "status": "published", "published_at": _now()})
            if before_commit is not None:
                before_commit()

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
        """Take back a publication whose later steps failed: mark run_id 'failed'; return the run that is latest again.

        ``before_commit`` gets the new latest run_id (None when none is left) inside the transaction, e.g. to
        switch the cache pointer back. A run that is not published is left alone (nothing to take back).
        Rows of a same-date run that this publication replaced are gone; its scoring_runs row stays 'replaced'.
        """
        with self._transaction() as session:
            changed = session.run("UPDATE scoring_runs SET status = 'failed', message = ? WHERE run_id = ? AND status = 'published' "
                                  "RETURNING run_id", [message[:1000], run_id])
            latest = [row[0] for row in session.run(f"{_PUBLISHED} ORDER BY {NEWEST_FIRST} LIMIT 1")]
            if changed and before_commit is not None:
                before_commit(latest[0] if latest else None)
        return latest[0] if latest else None

    def prune(self, keep_runs: int | None, keep_days: int | None) -> int:
        """Delete item_scores, user_candidates and quarantine rows of old runs in one transaction.

        A run is old when it is beyond the newest ``keep_runs`` published runs (published runs of
        lower rank, and other runs that started before the oldest kept one was published), or when
        its run_date is more than ``keep_days`` days before today. The latest published run is never
        pruned. scoring_runs rows stay; pruned published runs get status 'pruned' so a rollback can
        never make an empty run latest.

        Returns:
            How many runs lost rows or changed status (0 when there was nothing left to prune).
        """
        _check_keep(keep_runs, keep_days)
        with self._transaction() as session:
            doomed = _runs_to_prune(session, keep_runs, keep_days)
            touched = _runs_with_rows(session, doomed) | _published_among(session, doomed)
            if touched:
                marks = ", ".join("?" for _ in touched)
                for table in RUN_DATA_TABLES:
                    session.run(f"DELETE FROM {table} WHERE run_id IN ({marks})", sorted(touched))
                session.run(f"UPDATE scoring_runs SET status = 'pruned' WHERE status = 'published' AND run_id IN ({marks})",
                            sorted(touched))
        log.info("pruned %d run(s)", len(touched))
        return len(touched)


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
        cutoff = published[keep_runs - 1][1]
        doomed |= {run_id for run_id, _ in published[keep_runs:]}
        if cutoff is not None:
            doomed |= {run_id for run_id, _, at in runs if run_id not in kept and at is not None and at < cutoff}
    if keep_days is not None:
        oldest_kept = date.today() - timedelta(days=keep_days)
        doomed |= {run_id for run_id, run_date, _ in runs if run_date is not None and run_date < oldest_kept}
    return doomed - {published[0][0]} if published else doomed


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


def _replace_run_date(session: Session, run_id: str, run_date: Any) -> None:
    session.run("DELETE FROM item_scores WHERE run_date = ?", [run_date])
    session.run("DELETE FROM user_candidates WHERE run_date = ?", [run_date])
    session.run(
        "UPDATE scoring_runs SET status = 'replaced' WHERE run_date = ? AND status = 'published' AND run_id <> ?",
        [run_date, run_id],
    )


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
    """A write transaction on a DuckDB connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    def run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Execute one statement; return its rows."""
        return self.con.execute(sql, list(params)).fetchall()

    def insert(self, table: str, rows: Rows, columns: list[str]) -> None:
        """Append rows from Arrow (DuckDB reads the registered table in place, or the stream batch by batch)."""
        self.con.register("_incoming", rows.select(columns) if isinstance(rows, pa.Table) else rows)
        try:
            self.con.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(columns)} FROM _incoming")
        finally:
            self.con.unregister("_incoming")


# The analysts' DuckDB connection: no file, network or extension access beyond the warehouse file itself
# (COPY, EXPORT, ATTACH, read_csv/read_text/glob and INSTALL are refused by DuckDB), settings frozen.
ANALYST_DUCKDB_CONFIG: dict[str, str | bool] = {
    "enable_external_access": False, "autoinstall_known_extensions": False, "autoload_known_extensions": False,
    "allow_unsigned_extensions": False, "lock_configuration": True,
}


class DuckDBWarehouse(SqlWarehouse):
    """A DuckDB file; a connection is held only while it is used, with a bounded wait on another process's lock.

    ``lock_timeout_s`` bounds the wait in seconds (retries with exponential backoff until then); without it,
    ``lock_retries`` attempts are made.
    """

    def __init__(self, path: str, embedding_dim: int | None = None, lock_retries: int = 8, lock_backoff_s: float = 0.25,
                 memory_limit: str = DUCKDB_MEMORY_LIMIT, lock_timeout_s: float | None = None) -> None:
        self.path = path
        self.memory_limit = memory_limit
        self.embedding_dim = embedding_dim
        self.lock_retries, self.lock_backoff_s, self.lock_timeout_s = lock_retries, lock_backoff_s, lock_timeout_s

    @contextmanager
    def _transaction(self) -> Iterator[DuckDBSession]:
        if self.embedding_dim is None and not Path(self.path).exists():
            raise WarehouseMissing(f"no warehouse at {self.path}: run `nightscore run nightly` first")
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        con = self._connect_with_retry(read_only=False)
        try:
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
        finally:
            con.close()

    def _ensure_tables(self, con: duckdb.DuckDBPyConnection) -> None:
        """Create missing tables and views (with the embedding width this adapter was opened with), or require them."""
        if self.embedding_dim is not None:
            for statement in ddl(self.embedding_dim, "duckdb"):
                con.execute(statement)
            self._check_width(con, self.embedding_dim)
        elif _missing_duckdb_objects(con):
            raise WarehouseMissing(f"no warehouse tables in {self.path}: run `nightscore run nightly` first")

    def _check_width(self, con: duckdb.DuckDBPyConnection, width: int) -> None:
        """Refuse a run whose embeddings do not fit the warehouse's item_scores.embedding column."""
        row = con.execute("SELECT data_type FROM information_schema.columns WHERE table_name = 'item_scores' "
                          "AND column_name = 'embedding'").fetchone()
        declared = re.search(r"\[(\d+)\]", row[0]) if row else None
        if declared and int(declared.group(1)) != width:
            raise PublishError(f"warehouse {self.path} holds {declared.group(1)}-wide embeddings and this run's model makes "
                               f"{width}-wide ones: publish to a new warehouse (NIGHTSCORE_WAREHOUSE_URL)")

    def _connect_with_retry(self, read_only: bool, config: dict[str, str | bool] | None = None) -> duckdb.DuckDBPyConnection:
        """Connect, retrying with exponential backoff (tenacity) while another process holds the file's lock.

        A lock still held at the end of the bounded wait raises PublishError (writes) or WarehouseBusy (reads), never
        WarehouseMissing: a locked warehouse is not "no warehouse yet".
        """
        stop = stop_after_delay(self.lock_timeout_s) if self.lock_timeout_s is not None else stop_after_attempt(self.lock_retries + 1)
        retrying = Retrying(
            retry=retry_if_exception(_is_lock_error), stop=stop,
            wait=wait_exponential(multiplier=self.lock_backoff_s, max=5.0), reraise=True,
            before_sleep=lambda state: log.warning("warehouse %s locked (attempt %d), retrying", self.path, state.attempt_number),
        )
        started = time.monotonic()
        try:
            return retrying(duckdb.connect, self.path, read_only=read_only, config=config or {})
        except duckdb.IOException as exc:
            if not _is_lock_error(exc):
                raise NightscoreError(f"warehouse {self.path} cannot be opened: {_line(exc)}") from exc
            error: type[NightscoreError] = WarehouseBusy if read_only else PublishError
            raise error(f"warehouse {self.path} is locked by another process (waited {time.monotonic() - started:.0f} s): "
                        f"{_line(exc)}") from exc

    def _read_connection(self, config: dict[str, str | bool] | None = None) -> duckdb.DuckDBPyConnection:
        """Return a read-only connection on an existing warehouse (WarehouseMissing when there is none)."""
        if not Path(self.path).exists():
            raise WarehouseMissing(f"no warehouse at {self.path}: run `nightscore run nightly` first")
        con = self._connect_with_retry(read_only=True, config=config)
        if _missing_duckdb_objects(con):
            con.close()
            raise WarehouseMissing(f"no warehouse tables in {self.path}: run `nightscore run nightly` first")
        return con

    def query(self, sql: str, params: list[Any] | None = None) -> QueryResult:
        """Run SQL on a read-only connection (waiting for a writer's lock) and return its result."""
        con = self._read_connection()
        try:
            cursor = con.execute(sql, params or [])
            columns = [d[0] for d in cursor.description or []]
            return QueryResult(columns, cursor.fetchall())
        finally:
            con.close()

    def analyst_query(self, sql: str) -> QueryResult:
        """Run one analyst SELECT on a sandboxed read-only connection (ANALYST_DUCKDB_CONFIG); QueryRefused otherwise."""
        con = self._read_connection(ANALYST_DUCKDB_CONFIG)
        try:
            _check_analyst_sql(con, sql)
            cursor = con.execute(sql)
            columns = [d[0] for d in cursor.description or []]
            return QueryResult(columns, cursor.fetchall())
        except duckdb.PermissionException as exc:  # the sandbox said no (a file, the network, an extension)
            raise QueryRefused(f"query refused: {_line(exc)}") from exc
        except duckdb.Error as exc:
            raise QueryRefused(f"query failed: {_line(exc)}") from exc
        finally:
            con.close()


def _check_analyst_sql(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Raise QueryRefused unless sql is one SELECT whose tables are the warehouse's (or DuckDB's catalog) own."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryRefused(f"query failed: {_line(exc)}") from exc
    if len(statements) != 1:
        raise QueryRefused(f"query refused: give exactly one statement, got {len(statements)}")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise QueryRefused(f"query refused: only a read-only SELECT (or WITH ... SELECT) is allowed, got {statements[0].type.name}")
    known = {str(row[0]) for row in con.execute(
        "SELECT table_name FROM duckdb_tables() UNION SELECT view_name FROM duckdb_views()").fetchall()}
    foreign = sorted(name for name in con.get_table_names(sql) if name not in known)
    if foreign:
        raise QueryRefused(f"query refused: {', '.join(foreign)} is not a warehouse table or view")


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
