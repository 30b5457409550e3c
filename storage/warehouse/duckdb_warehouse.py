"""The DuckDB warehouse (the embedded default): one file, a connection held only while used.

Analysts' SQL reads a snapshot of the file (storage/warehouse/duckdb_analyst.py), never the file a run writes.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential

from core.errors import NightscoreError, PublishError, QueryRefused, WarehouseBusy, WarehouseMissing
from storage.warehouse.analyst import RowStream
from storage.warehouse.base import QueryResult, Rows, _line, present_columns
from storage.warehouse.duckdb_analyst import (
    check_analyst_sql,
    copy_snapshot,
    is_current,
    sandbox_message,
    sandboxed,
    snapshot_path,
    watched,
)
from storage.warehouse.duckdb_gate import GATE, config_key
from storage.warehouse.duckdb_host import HOST
from storage.warehouse.schema import (
    ddl,
    ddl_version,
    object_names,
)
from storage.warehouse.sql import SqlWarehouse

log = logging.getLogger(__name__)

DDL_TABLE = "nightscore_ddl"  # one row: the DDL version a writer last brought the file to


DUCKDB_MEMORY_LIMIT = "512MB"  # buffer pool of a write transaction; more spills to disk
SNAPSHOT_WAIT_S = 2.0  # how long a query waits for a writer to let go of the file before it reads the last snapshot


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
    def _connection(self, read_only: bool, wait_s: float | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """Yield a connection to the file (attached to the process's DuckDB while used); this process's connections
        in the other mode are waited for.

        wait_s: how long to wait for the file in all (None: lock_timeout_s, or the retries' backoff).
        """
        bound = self._wait_bound_s() if wait_s is None else wait_s
        with GATE.holding(self.path, config_key(read_only, {}), bound), self._connect_with_retry(read_only, wait_s) as con:
            yield con

    def _wait_bound_s(self) -> float:
        """Return how long a connection waits for the file in all (lock_timeout_s, or the retries' backoff)."""
        if self.lock_timeout_s is not None:
            return self.lock_timeout_s
        return sum(min(5.0, self.lock_backoff_s * 2**attempt) for attempt in range(self.lock_retries))

    def _ensure_tables(self, con: duckdb.DuckDBPyConnection) -> None:
        """Create missing tables and views (with the embedding width this adapter was opened with), or require them.

        A writer runs the DDL (84 statements, 14 ms, every one its own commit) only where an object is missing or
        the recorded DDL version differs, as on PostgreSQL: a run opens some ten write transactions.
        """
        if self.embedding_dim is not None:
            with GATE.schema_lock(self.path):  # two threads replacing one view at once conflict
                if _missing_duckdb_objects(con) or _recorded_ddl_version(con) != ddl_version("duckdb"):
                    for statement in ddl(self.embedding_dim, "duckdb"):
                        con.execute(statement)
                    _record_ddl_version(con)
            self._check_width(con, self.embedding_dim)
        elif _missing_duckdb_objects(con):
            raise WarehouseMissing(f"no warehouse tables in {self.path}: run `nightscore run nightly` first")

    def _check_width(self, con: duckdb.DuckDBPyConnection, width: int) -> None:
        """Refuse a run whose embeddings do not fit the warehouse's item_scores.embedding column."""
        row = con.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_catalog = current_database() "
            "AND table_name = 'item_scores' AND column_name = 'embedding'"
        ).fetchone()
        declared = re.search(r"\[(\d+)\]", row[0]) if row else None
        if declared and int(declared.group(1)) != width:
            raise PublishError(
                f"warehouse {self.path} holds {declared.group(1)}-wide embeddings and this run's model makes "
                f"{width}-wide ones: publish to a new warehouse (NIGHTSCORE_WAREHOUSE_URL)"
            )

    @contextmanager
    def _connect_with_retry(self, read_only: bool, wait_s: float | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """Yield a connection, retrying with exponential backoff (tenacity) while another process holds the file's lock.

        A lock still held at the end of the bounded wait raises WarehouseBusy (a PublishError), never
        WarehouseMissing: a locked warehouse is not "no warehouse yet".
        """
        wait_s = self.lock_timeout_s if wait_s is None else wait_s
        stop = stop_after_delay(wait_s) if wait_s is not None else stop_after_attempt(self.lock_retries + 1)
        retrying = Retrying(
            retry=retry_if_exception(_is_lock_error),
            stop=stop,
            wait=wait_exponential(multiplier=self.lock_backoff_s, max=5.0),
            reraise=True,
            before_sleep=lambda state: log.warning("warehouse %s locked (attempt %d), retrying", self.path, state.attempt_number),
        )
        started = time.monotonic()
        try:
            alias = retrying(HOST.attach, self.path, read_only)
        except duckdb.IOException as exc:
            if not _is_lock_error(exc):
                raise NightscoreError(f"warehouse {self.path} cannot be opened: {_line(exc)}") from exc
            raise WarehouseBusy(
                f"warehouse {self.path} is locked by another process (waited {time.monotonic() - started:.0f} s): {_line(exc)}"
            ) from exc
        try:
            with HOST.using(alias) as con:
                yield con
        finally:
            HOST.release(self.path)

    @contextmanager
    def _reading(self, wait_s: float | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """Yield a read-only connection on an existing warehouse (WarehouseMissing when there is none)."""
        if not Path(self.path).exists():
            raise WarehouseMissing(f"no warehouse at {self.path}: run `nightscore run nightly` first")
        with self._connection(read_only=True, wait_s=wait_s) as con:
            if _missing_duckdb_objects(con):
                raise WarehouseMissing(f"no warehouse tables in {self.path}: run `nightscore run nightly` first")
            yield con

    def query(self, sql: str, params: list[Any] | None = None) -> QueryResult:
        """Run SQL on a read-only connection (waiting for a writer's lock) and return its result."""
        with self._reading() as con:
            cursor = con.execute(sql, params or [])
            columns = [d[0] for d in cursor.description or []]
            return QueryResult(columns, cursor.fetchall())

    @contextmanager
    def analyst_rows(self, sql: str, limit: int = 0, timeout_s: float | None = None) -> Iterator[RowStream]:
        """Run one analyst SELECT on a sandboxed read-only connection to the warehouse's snapshot; QueryRefused otherwise."""
        con = sandboxed(self._fresh_snapshot())
        try:
            check_analyst_sql(con, sql)
            with watched(con, sql, limit, timeout_s) as (columns, batches):
                yield RowStream(columns, batches, limit)
        except duckdb.PermissionException as exc:  # the sandbox said no (a file, the network, an extension)
            raise QueryRefused(f"query refused: {sandbox_message(exc)}") from exc
        except duckdb.Error as exc:
            raise QueryRefused(f"query failed: {sandbox_message(exc)}") from exc
        finally:
            con.close()

    def _fresh_snapshot(self) -> Path:
        """Return the analysts' copy of the warehouse, copied again first when the warehouse changed since.

        While a writer holds the file (a run publishing), the last copy is read after SNAPSHOT_WAIT_S; only a
        first copy waits as long as any read does.
        """
        source, snapshot = Path(self.path), snapshot_path(self.path)
        if is_current(source, snapshot):
            return snapshot
        try:
            with self._reading(wait_s=SNAPSHOT_WAIT_S if snapshot.exists() else None):
                copy_snapshot(source, snapshot)
        except WarehouseBusy:
            if not snapshot.exists():
                raise
            as_of = datetime.fromtimestamp(snapshot.stat().st_mtime).isoformat(sep=" ", timespec="seconds")
            log.warning("warehouse %s is being written: this query reads it as it was at %s (its snapshot)", self.path, as_of)
        return snapshot


def _is_lock_error(exc: BaseException) -> bool:
    return isinstance(exc, duckdb.IOException) and "lock" in str(exc).lower()


def _recorded_ddl_version(con: duckdb.DuckDBPyConnection) -> str | None:
    """Return the DDL version recorded in the file (None before a writer recorded one)."""
    try:
        row = con.execute(f"SELECT max(ddl_version) FROM {DDL_TABLE}").fetchone()
    except duckdb.CatalogException:
        return None
    return row[0] if row else None


def _record_ddl_version(con: duckdb.DuckDBPyConnection) -> None:
    """Record the DDL version the file now has (after every statement of it ran)."""
    con.execute(f"CREATE TABLE IF NOT EXISTS {DDL_TABLE} (ddl_version text)")
    con.execute("BEGIN")
    con.execute(f"DELETE FROM {DDL_TABLE}")
    con.execute(f"INSERT INTO {DDL_TABLE} VALUES (?)", [ddl_version("duckdb")])
    con.execute("COMMIT")


def _missing_duckdb_objects(con: duckdb.DuckDBPyConnection) -> int:
    """Return how many of the warehouse's tables and views the DuckDB file lacks."""
    names = object_names("duckdb")
    marks = ", ".join("?" for _ in names)
    row = con.execute(
        f"SELECT count(*) FROM information_schema.tables WHERE table_catalog = current_database() AND table_name IN ({marks})",
        names,
    ).fetchone()
    return len(names) - int(row[0]) if row else len(names)
