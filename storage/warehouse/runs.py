"""What tasks, the CLI and deployments ask of ``scoring_runs`` and ``quarantine``: one named method each, one SQL each.

The same SQL on both backends (``?`` placeholders); nothing outside storage/ writes SQL on these tables.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from core.errors import WarehouseMissing
from storage.warehouse.schema import NEWEST_FIRST


class QueryResult:
    """Columns and rows of a read-only query (truncated: an analyst query had more rows than its limit)."""

    def __init__(self, columns: list[str], rows: list[tuple[Any, ...]], truncated: bool = False) -> None:
        self.columns, self.rows, self.truncated = columns, rows, truncated

    def records(self) -> list[dict[str, Any]]:
        """Return the rows as column-name -> value dicts."""
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


@dataclass(frozen=True)
class PublishedRun:
    """The identity of a published run: what "the latest published run" resolves to."""

    run_id: str
    run_date: str  # YYYY-MM-DD


@dataclass(frozen=True)
class RunAttempt:
    """One attempt of a run: its id, run date and status (running, published, failed, ...)."""

    run_id: str
    run_date: str  # YYYY-MM-DD
    status: str


QuarantineRule = tuple[str, str, int, str]  # dataset, rule, rows, an example row key

RECENT_RUN_COLUMNS = (
    "run_id, run_date, status, rows_in, rows_quarantined, rows_scored, rows_reused, rows_computed, "
    "users_with_candidates, round(wall_seconds, 1) AS wall_s, message"
)
RUN_COUNT_COLUMNS = (
    "run_id, status, rows_in, rows_quarantined, rows_scored, rows_computed, rows_reused, "
    "users_with_candidates, round(wall_seconds, 1) AS wall_s"
)


class RunLookups(ABC):
    """The named questions about runs; a backend answers them through its read-only `query`."""

    @abstractmethod
    def query(self, sql: str, params: list[Any] | None = None) -> QueryResult:
        """Run SQL on a read-only connection (waiting for a writer's lock) and return its result."""

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

    def published_run(self, run_id: str) -> PublishedRun | None:
        """Return run_id as a published run, or None when it is not one (never run, failed, replaced)."""
        sql = "SELECT run_id, CAST(run_date AS VARCHAR) FROM scoring_runs WHERE status = 'published' AND run_id = ?"
        rows = self.query(sql, [run_id]).rows
        return PublishedRun(rows[0][0], rows[0][1]) if rows else None

    def published_on(self, run_date: str) -> str | None:
        """Return the run published for a run date now (the latest publication of that date), or None."""
        sql = (
            "SELECT run_id FROM scoring_runs WHERE CAST(run_date AS VARCHAR) = ? AND status = 'published' "
            "ORDER BY published_at DESC LIMIT 1"
        )
        rows = self.query(sql, [run_date]).rows
        return str(rows[0][0]) if rows else None

    def run_attempt(self, run_id: str) -> RunAttempt | None:
        """Return a run's date and status, or None when the warehouse holds no such run."""
        sql = "SELECT run_id, CAST(run_date AS VARCHAR), status FROM scoring_runs WHERE run_id = ?"
        rows = self.query(sql, [run_id]).rows
        return RunAttempt(*rows[0]) if rows else None

    def latest_attempt(self, flow_name: str, run_date: str) -> RunAttempt | None:
        """Return the newest attempt of a flow for a run date, or None (also when no warehouse exists yet)."""
        sql = (
            "SELECT run_id, CAST(run_date AS VARCHAR), status FROM scoring_runs "
            "WHERE flow_name = ? AND CAST(run_date AS VARCHAR) = ? ORDER BY started_at DESC LIMIT 1"
        )
        try:
            rows = self.query(sql, [flow_name, run_date]).rows
        except WarehouseMissing:
            return None
        return RunAttempt(*rows[0]) if rows else None

    def run_of_flow_run(self, flow_run_id: str) -> str | None:
        """Return the run id a Prefect flow run recorded, or None when it recorded none."""
        rows = self.query("SELECT run_id FROM scoring_runs WHERE flow_run_id = ? LIMIT 1", [flow_run_id]).rows
        return str(rows[0][0]) if rows else None

    def flow_run_counts(self, flow_run_id: str) -> dict[str, Any] | None:
        """Return the scoring_runs row (status and counts) a flow run wrote, or None if it wrote none yet."""
        sql = f"SELECT {RUN_COUNT_COLUMNS} FROM scoring_runs WHERE flow_run_id = ? ORDER BY started_at DESC LIMIT 1"
        records = self.query(sql, [flow_run_id]).records()
        return records[0] if records else None

    def recent_runs(self, limit: int) -> QueryResult:
        """Return the newest runs (started last first) with their status and counts."""
        return self.query(f"SELECT {RECENT_RUN_COLUMNS} FROM scoring_runs ORDER BY started_at DESC LIMIT ?", [limit])

    def quarantine_by_rule(self, run_id: str) -> list[QuarantineRule]:
        """Return a run's quarantined rows per (dataset, rule): count and an example row key, most rows first."""
        sql = (
            "SELECT dataset, rule, count(*), min(row_key) FROM quarantine WHERE run_id = ? "
            "GROUP BY dataset, rule ORDER BY 3 DESC, 1, 2"
        )
        return [(str(d), str(r), int(n), str(k)) for d, r, n, k in self.query(sql, [run_id]).rows]
