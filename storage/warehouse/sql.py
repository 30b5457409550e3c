"""The SQL both warehouse backends run for every write: publication, rollback, leases, pruning, run records."""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa

from core.errors import PublishError, UsageError
from storage.warehouse.base import LeaseFence, LeaseRow, Pruned, Rows, Session, Warehouse
from storage.warehouse.schema import (
    CANDIDATE_COLUMNS,
    ITEM_SCORE_COLUMNS,
    METRIC_COLUMNS,
    NEWEST_FIRST,
    QUARANTINE_COLUMNS,
    RUN_COLUMNS,
)

log = logging.getLogger(__name__)


# Statuses of runs that were published once: a flow hook must never overwrite them.
ONCE_PUBLISHED = ("published", "replaced", "rolled_back", "pruned")
RUN_DATA_TABLES = ("item_scores", "user_candidates", "quarantine", "retrieval_metrics")
REPLACEABLE_TABLES = ("item_scores", "user_candidates")  # a replaced run keeps its rows here until its replacement is final


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
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'run_leases' "
        "AND table_catalog = current_database() AND table_schema = current_schema()"
    )
    if not exists or not exists[0][0]:
        return set()
    return {row[0] for row in session.run("SELECT run_id FROM run_leases WHERE expires_at > ? AND run_id IS NOT NULL", [_now()])}


def _superseded_attempts(session: Session) -> set[str]:
    """Return the runs a later publication of their run_date superseded: failed, interrupted or abandoned attempts,
    and replaced runs whose rows are gone (a replaced run with rows left is a retraction's way back)."""
    rows = session.run(
        "SELECT a.run_id FROM scoring_runs a WHERE a.status IN ('failed', 'interrupted', 'running') AND EXISTS ("
        "SELECT 1 FROM scoring_runs p WHERE p.run_date = a.run_date AND p.run_id <> a.run_id "
        "AND p.published_at IS NOT NULL AND p.published_at > a.started_at)"
    )
    replaced = {row[0] for row in session.run("SELECT run_id FROM scoring_runs WHERE status = 'replaced'")}
    return {row[0] for row in rows} | (replaced - _runs_with_rows(session, replaced, REPLACEABLE_TABLES))


def _runs_with_rows(session: Session, run_ids: set[str], tables: tuple[str, ...] = RUN_DATA_TABLES) -> set[str]:
    """Return the run_ids among run_ids that still have rows in one of tables (by default every run data table)."""
    if not run_ids:
        return set()
    marks = ", ".join("?" for _ in run_ids)
    union = " UNION ".join(f"SELECT DISTINCT run_id FROM {table} WHERE run_id IN ({marks})" for table in tables)
    return {row[0] for row in session.run(union, sorted(run_ids) * len(tables))}


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
