"""The warehouse adapter: DuckDB (embedded default). Publication of a run is one transaction."""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import duckdb
import pyarrow as pa

from nightscore.errors import PublishError, UsageError
from storage.warehouse_schema import CANDIDATE_COLUMNS, ITEM_SCORE_COLUMNS, QUARANTINE_COLUMNS, RUN_COLUMNS, ddl

log = logging.getLogger(__name__)


class QueryResult:
    """Columns and rows of a read-only query."""

    def __init__(self, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        self.columns, self.rows = columns, rows

    def records(self) -> list[dict[str, Any]]:
        """Return the rows as column-name -> value dicts."""
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


class Warehouse(ABC):
    """Where analysts read results: run records, item scores, candidates, quarantine."""

    @abstractmethod
    def record_run(self, run: dict[str, Any]) -> None:
        """Insert or update one scoring_runs row (keys are RUN_COLUMNS)."""

    @abstractmethod
    def record_quarantine(self, run_id: str, quarantine: pa.Table) -> int:
        """Replace the quarantine rows of run_id; return how many were written."""

    @abstractmethod
    def publish(self, run: dict[str, Any], item_scores: pa.Table, candidates: pa.Table, before_commit: Any = None) -> None:
        """Make run the published one in one transaction, replacing rows of the same run_date."""

    @abstractmethod
    def mark_run(self, flow_run_id: str, status: str, message: str) -> int:
        """Set status and message of the unpublished run of a Prefect flow run; return rows changed."""

    @abstractmethod
    def query(self, sql: str, params: list[Any] | None = None) -> QueryResult:
        """Run read-only SQL and return its result."""


class DuckDBWarehouse(Warehouse):
    """A DuckDB file; the writer's connection is held only while it writes, with bounded retry on locks."""

    def __init__(self, path: str, embedding_dim: int = 384, lock_retries: int = 8, lock_backoff_s: float = 0.25) -> None:
        self.path = path
        self.embedding_dim = embedding_dim
        self.lock_retries, self.lock_backoff_s = lock_retries, lock_backoff_s

    @contextmanager
    def _writer(self) -> Iterator[duckdb.DuckDBPyConnection]:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        con = self._connect_with_retry()
        try:
            for statement in ddl(self.embedding_dim):
                con.execute(statement)
            yield con
        finally:
            con.close()

    def _connect_with_retry(self) -> duckdb.DuckDBPyConnection:
        delay = self.lock_backoff_s
        for attempt in range(self.lock_retries + 1):
            try:
                return duckdb.connect(self.path)
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower() or attempt == self.lock_retries:
                    raise PublishError(f"warehouse {self.path} is locked by another process: {_line(exc)}") from exc
                log.warning("warehouse %s locked (attempt %d), retrying in %.2fs", self.path, attempt + 1, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def record_run(self, run: dict[str, Any]) -> None:
        """Insert or update one scoring_runs row."""
        unknown = set(run) - set(RUN_COLUMNS)
        if unknown:
            raise ValueError(f"unknown scoring_runs columns: {sorted(unknown)}")
        with self._writer() as con:
            _upsert_run(con, run)

    def record_quarantine(self, run_id: str, quarantine: pa.Table) -> int:
        """Replace the quarantine rows of run_id; return how many were written."""
        with self._writer() as con:
            con.execute("BEGIN")
            con.execute("DELETE FROM quarantine WHERE run_id = ?", [run_id])
            _insert(con, "quarantine", quarantine, QUARANTINE_COLUMNS)
            con.execute("COMMIT")
        return quarantine.num_rows

    def publish(self, run: dict[str, Any], item_scores: pa.Table, candidates: pa.Table, before_commit: Any = None) -> None:
        """Replace run_date's rows with this run's and mark it published, all in one transaction.

        ``before_commit`` (optional callable) runs inside the transaction after the rows are in;
        if it raises, the transaction rolls back and the previous publication stays current.
        """
        with self._writer() as con:
            con.execute("BEGIN")
            try:
                _replace_run_date(con, run["run_id"], run["run_date"])
                _insert(con, "item_scores", item_scores, ITEM_SCORE_COLUMNS)
                _insert(con, "user_candidates", candidates, CANDIDATE_COLUMNS)
                _upsert_run(con, {**run, "status": "published"})
                con.execute("UPDATE scoring_runs SET published_at = now() WHERE run_id = ?", [run["run_id"]])
                if before_commit is not None:
                    before_commit()
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    def mark_run(self, flow_run_id: str, status: str, message: str) -> int:
        """Set status and message of the unpublished run of a Prefect flow run; return rows changed."""
        with self._writer() as con:
            changed = con.execute(
                "UPDATE scoring_runs SET status = ?, message = ?, finished_at = now() "
                "WHERE flow_run_id = ? AND status NOT IN ('published', 'replaced') RETURNING run_id",
                [status, message[:1000], flow_run_id],
            ).fetchall()
        return len(changed)

    def query(self, sql: str, params: list[Any] | None = None) -> QueryResult:
        """Run SQL on a read-only connection and return its result."""
        if not Path(self.path).exists():
            raise UsageError(f"no warehouse at {self.path}: run `nightscore run nightly` first")
        con = duckdb.connect(self.path, read_only=True)
        try:
            cursor = con.execute(sql, params or [])
            columns = [d[0] for d in cursor.description or []]
            return QueryResult(columns, cursor.fetchall())
        finally:
            con.close()


def _replace_run_date(con: duckdb.DuckDBPyConnection, run_id: str, run_date: Any) -> None:
    con.execute("DELETE FROM item_scores WHERE run_date = ?", [run_date])
    con.execute("DELETE FROM user_candidates WHERE run_date = ?", [run_date])
    con.execute(
        "UPDATE scoring_runs SET status = 'replaced' WHERE run_date = ? AND status = 'published' AND run_id <> ?",
        [run_date, run_id],
    )


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: pa.Table, columns: list[str]) -> None:
    con.register("_incoming", rows.select(columns))
    try:
        con.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(columns)} FROM _incoming")
    finally:
        con.unregister("_incoming")


def _upsert_run(con: duckdb.DuckDBPyConnection, run: dict[str, Any]) -> None:
    names = list(run)
    updates = ", ".join(f"{n} = excluded.{n}" for n in names if n != "run_id")
    con.execute(
        f"INSERT INTO scoring_runs ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)}) "
        f"ON CONFLICT (run_id) DO UPDATE SET {updates}",
        [run[n] for n in names],
    )


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def open_warehouse(location: str, embedding_dim: int = 384) -> Warehouse:
    """Return the warehouse adapter for a location (a DuckDB file path)."""
    if location.startswith(("postgresql://", "postgres://")):
        raise UsageError("PostgreSQL warehouses are not supported yet (use a DuckDB path)")
    return DuckDBWarehouse(location, embedding_dim=embedding_dim)
