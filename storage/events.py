"""Fresh interaction events between batch runs: a Redis stream (server, storage/events_redis.py) or a table in the
cache's SQLite file (embedded).

Each event is kept twice: in the stream/table, for `nightscore events export` (the next nightly run reads it as
interactions), and in a per-user set of recent items the service reads with the user's candidates (one round trip,
storage/cache_async.py). Both are bounded: events older than ``retention_s`` are trimmed, and when ``max_events``
are held a new event is refused with EventsFull (HTTP 429), never dropped silently. An exact duplicate (same user,
item, kind and ts) of an event held is not stored again (``append`` says so): a client's retry is counted once.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import polars as pl

from core.errors import CacheUnavailable, NightscoreError
from storage.lake import Lake

RECENT_PER_USER = 100  # recent items kept per user (what a request reads)


class EventsFull(NightscoreError):
    """The event store holds max_events: the event is refused (HTTP 429), never dropped."""


@dataclass(frozen=True)
class Event:
    """One interaction: who, what, which kind, when (epoch seconds, UTC)."""

    user_id: str
    item_id: str
    event: str
    ts: float


def user_events_key(prefix: str, user_id: str) -> str:
    """Return the Redis key of a user's recent items (a sorted set scored by event time)."""
    return f"{prefix}:ev:u:{user_id}"


def day_bounds(day: date) -> tuple[float, float]:
    """Return [start, end) of a UTC day in epoch seconds."""
    start = datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp()  # noqa: UP017 - explicit
    return start, start + timedelta(days=1).total_seconds()


class EventStore(ABC):
    """Where the service appends events and the export reads a day of them."""

    @abstractmethod
    async def append(self, event: Event) -> bool:
        """Store one event; return False for an exact duplicate of one held (not stored again).

        Raises:
            EventsFull: max_events are held.
            CacheUnavailable: the store does not answer.
        """

    @abstractmethod
    async def day(self, day: date) -> list[Event]:
        """Return the events of a UTC day, oldest first."""

    @abstractmethod
    async def close(self) -> None:
        """Release the connection."""


_SQLITE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS events (user_id TEXT NOT NULL, item_id TEXT NOT NULL, event TEXT NOT NULL, "
    "ts REAL NOT NULL, received_at REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS events_user ON events (user_id, ts)",
    "CREATE INDEX IF NOT EXISTS events_received ON events (received_at)",
)
_UNIQUE_EVENTS = "CREATE UNIQUE INDEX IF NOT EXISTS events_exact ON events (user_id, item_id, event, ts)"
# a file written before duplicates were refused may hold some: keep each event's first copy, then index
_DROP_DUPLICATES = "DELETE FROM events WHERE rowid NOT IN (SELECT min(rowid) FROM events GROUP BY user_id, item_id, event, ts)"


class SqliteEvents(EventStore):
    """Events in a table of the cache's SQLite file, written and read inline (microseconds, like the cache reads)."""

    def __init__(self, path: str | Path, retention_s: float, max_events: int) -> None:
        self.path, self.retention_s, self.max_events = Path(path), retention_s, max_events
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode = WAL")
        for statement in _SQLITE_SCHEMA:
            self._conn.execute(statement)
        try:
            self._conn.execute(_UNIQUE_EVENTS)
        except sqlite3.IntegrityError:
            self._conn.execute(_DROP_DUPLICATES)
            self._conn.execute(_UNIQUE_EVENTS)

    def _run(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        """Return the rows of one statement; SQLite errors become CacheUnavailable."""
        try:
            with self._lock:
                return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise CacheUnavailable(f"event store unavailable at {self.path}: {exc}") from exc

    def held(self) -> int:
        """Return about how many events are held (rowid span: constant time)."""
        low, high = self._run("SELECT min(rowid), max(rowid) FROM events")[0]
        return 0 if low is None else int(high) - int(low) + 1  # type: ignore[call-overload]

    async def append(self, event: Event) -> bool:
        """Insert one event after trimming those past retention; refuse it when max_events are held; False: a duplicate."""
        now = time.time()
        if self.held() >= self.max_events:
            self._run("DELETE FROM events WHERE received_at < ?", (now - self.retention_s,))
            if self.held() >= self.max_events:
                raise EventsFull(f"event store holds {self.max_events} events (max); export or raise the limit")
        values = (event.user_id, event.item_id, event.event, event.ts, now)
        return bool(self._run("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?) RETURNING 1", values))

    def recent(self, user_id: str) -> dict[str, float]:
        """Return item id -> latest event time of the user's events within retention."""
        rows = self._run(
            "SELECT item_id, max(ts) FROM events WHERE user_id = ? AND received_at >= ? GROUP BY item_id ORDER BY 2 DESC LIMIT ?",
            (user_id, time.time() - self.retention_s, RECENT_PER_USER),
        )
        return {str(item): float(ts) for item, ts in rows}  # type: ignore[arg-type]

    async def day(self, day: date) -> list[Event]:
        """Return the events whose ts falls on the UTC day, oldest first."""
        rows = self._run(
            "SELECT user_id, item_id, event, ts FROM events WHERE ts >= ? AND ts < ? ORDER BY ts, rowid", day_bounds(day)
        )
        return [Event(str(u), str(i), str(e), float(t)) for u, i, e, t in rows]  # type: ignore[arg-type]

    async def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._conn.close()


def events_frame(events: list[Event]) -> pl.DataFrame:
    """Return events as interactions rows (user_id, item_id, event, ts as UTC microseconds): the nightly input's columns."""
    return pl.DataFrame(
        {
            "user_id": [e.user_id for e in events],
            "item_id": [e.item_id for e in events],
            "event": [e.event for e in events],
            "ts": [int(e.ts * 1_000_000) for e in events],
        },
        schema={"user_id": pl.String(), "item_id": pl.String(), "event": pl.String(), "ts": pl.Int64()},
    ).with_columns(pl.col("ts").cast(pl.Datetime("us", "UTC")))


def partition_uri(lake: Lake, day: date) -> str:
    """Return where one day's exported events live in the lake: events/date=YYYY-MM-DD/interactions.parquet."""
    return lake.uri("events", f"date={day.isoformat()}", "interactions.parquet")


def ingested_partitions(lake: Lake, run_date: date) -> list[str]:
    """Return the event partitions a nightly run of run_date reads with its interactions: the day before and its own."""
    days = (run_date - timedelta(days=1), run_date)
    return [uri for uri in (partition_uri(lake, day) for day in days) if lake.exists(uri)]


async def export_day(store: EventStore, lake: Lake, day: date) -> tuple[str | None, int]:
    """Write a UTC day's events to the lake as interactions Parquet (partition_uri); return (uri or None if none, rows)."""
    events = await store.day(day)
    if not events:
        return None, 0
    return lake.write_parquet(events_frame(events), partition_uri(lake, day)), len(events)
