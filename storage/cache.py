"""Candidate cache: versioned per-user payloads behind a current/previous pointer, in SQLite or Redis (storage/cache_redis.py).

Keys: ``<prefix>:cand:<run_id>:<user_id>`` hold one user's payload of one run; ``<prefix>:cand:current`` and
``<prefix>:cand:previous`` hold run ids. A version is written completely before the pointer switches to it,
and old versions stay until they expire or are dropped, so a reader (pointer, then entry) always gets one
run's payload whole.

Versions: the current and the previous one (what rollback returns to) never expire. At each publication
`retire_old_versions` gives every older version a time to live of ``version_grace_s`` (Redis: PEXPIRE on its
keys; SQLite: an ``expires_at`` honoured by every read and purged at the next publication or open), set once,
so later publications do not extend it. Switching to a version (a rollback) clears its expiry.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from itertools import islice
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

from core.errors import CacheUnavailable, PublishError

logger = logging.getLogger(__name__)

REDIS_SCHEMES = ("redis://", "rediss://")
SQLITE_BUSY_TIMEOUT_MS = 5000
DEFAULT_VERSION_GRACE_S = 86_400.0

Entry = tuple[str, bytes]


def check_run_id(run_id: str) -> str:
    """Return run_id, or raise ValueError when it is empty or holds ':' (the key separator)."""
    if not run_id or ":" in run_id:
        raise ValueError(f"run id must be non-empty and contain no ':': {run_id!r}")
    return run_id


def _batches(entries: Iterable[Entry], size: int) -> Iterator[list[Entry]]:
    """Yield lists of at most size entries."""
    if size < 1:
        raise ValueError(f"batch_size must be at least 1, got {size}")
    it = iter(entries)
    while batch := list(islice(it, size)):
        yield batch


@contextmanager
def unavailable_on(errors: tuple[type[BaseException], ...], where: str) -> Iterator[None]:
    """Turn the given low-level errors into CacheUnavailable with a one-line message naming where."""
    try:
        yield
    except errors as exc:
        detail = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise CacheUnavailable(f"candidate cache unavailable at {where}: {detail}") from exc


class CandidateCache(ABC):
    """Versioned candidate payloads of every user, read through the current pointer."""

    prefix: str
    version_grace_s: float

    # --- keys ----------------------------------------------------------------------------
    @property
    def current_key(self) -> str:
        """Return the key of the current-run pointer."""
        return f"{self.prefix}:cand:current"

    @property
    def previous_key(self) -> str:
        """Return the key of the previous-run pointer."""
        return f"{self.prefix}:cand:previous"

    def version_prefix(self, run_id: str) -> str:
        """Return the key prefix shared by every entry of one run (ends with ':')."""
        return f"{self.prefix}:cand:{check_run_id(run_id)}:"

    def entry_key(self, run_id: str, user_id: str) -> str:
        """Return the key of one user's entry in one run."""
        return f"{self.version_prefix(run_id)}{user_id}"

    # --- public operations -------------------------------------------------------------
    def write_version(self, run_id: str, entries: Iterable[Entry], batch_size: int = 1000) -> int:
        """Write (user_id, payload) entries of a run in batches; return how many were written.

        Raises:
            PublishError: run_id is the current run (readers must never see it change).
        """
        check_run_id(run_id)
        if run_id == self.current():
            raise PublishError(f"refusing to write into run {run_id!r}: it is the current cache version")
        written = 0
        for batch in _batches(entries, batch_size):
            self._write_batch([(self.entry_key(run_id, user_id), blob) for user_id, blob in batch])
            written += len(batch)
        logger.info("cache: wrote %d entries of run %s", written, run_id)
        return written

    def current(self) -> str | None:
        """Return the current run id, or None before the first switch."""
        return self._get_text(self.current_key)

    def previous(self) -> str | None:
        """Return the run id that was current before the last switch, or None."""
        return self._get_text(self.previous_key)

    def read(self, user_id: str) -> tuple[str, bytes] | None:
        """Return (current run id, payload) of a user; None without a pointer or an entry."""
        run_id = self.current()
        if run_id is None:
            return None
        blob = self.read_version(run_id, user_id)
        return None if blob is None else (run_id, blob)

    def read_version(self, run_id: str, user_id: str) -> bytes | None:
        """Return a user's payload in a given run, or None."""
        return self._get(self.entry_key(run_id, user_id))

    def drop_version(self, run_id: str) -> int:
        """Delete every entry of a run that is not current; return how many were deleted.

        Raises:
            PublishError: run_id is the current run.
        """
        check_run_id(run_id)
        if run_id == self.current():
            raise PublishError(f"refusing to drop run {run_id!r}: it is the current cache version")
        dropped = self._delete_prefix(self.version_prefix(run_id))
        logger.info("cache: dropped %d entries of run %s", dropped, run_id)
        return dropped

    def retire_old_versions(self) -> list[str]:
        """Give versions older than previous the grace TTL (drop them when the grace is 0); return their run ids."""
        keep = {self.current(), self.previous()}
        old = [run_id for run_id in self.versions() if run_id not in keep]
        for run_id in old:
            if self.version_grace_s > 0:
                self._expire_version(run_id, self.version_grace_s)
            else:
                self.drop_version(run_id)
        self._purge_expired()
        logger.info("cache: versions %s expire within %.0fs", ", ".join(old) or "none", self.version_grace_s)
        return old

    def __enter__(self) -> CandidateCache:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _get_text(self, key: str) -> str | None:
        """Return a pointer's value as text, or None."""
        raw = self._get(key)
        return None if raw is None else bytes(raw).decode()

    # --- backend primitives ------------------------------------------------------------
    @abstractmethod
    def switch_current(self, run_id: str) -> str | None:
        """Atomically make run_id current and the old current previous; return the old current."""

    @abstractmethod
    def set_pointers(self, current: str | None, previous: str | None) -> None:
        """Atomically set both pointers (None removes one), clearing any expiry of the versions they name.

        How a failed publication's switch is taken back exactly, first publication included (no current run).
        """

    @abstractmethod
    def versions(self) -> list[str]:
        """Return the sorted run ids that have entries."""

    @abstractmethod
    def ping(self) -> bool:
        """Return True when the store answers, False when it cannot be reached."""

    @abstractmethod
    def close(self) -> None:
        """Release the connection."""

    @abstractmethod
    def _get(self, key: str) -> bytes | None:
        """Return the value of a key, or None."""

    @abstractmethod
    def _write_batch(self, items: list[Entry]) -> None:
        """Write (key, value) pairs in one round trip."""

    @abstractmethod
    def _delete_prefix(self, key_prefix: str) -> int:
        """Delete every key starting with key_prefix; return how many were deleted."""

    @abstractmethod
    def _expire_version(self, run_id: str, ttl_s: float) -> None:
        """Let every entry of a run expire ttl_s from now, unless it already has an expiry."""

    @abstractmethod
    def _purge_expired(self) -> None:
        """Remove what expired entries leave behind (rows in SQLite, bookkeeping in Redis)."""


# --------------------------------------------------------------------------------------------
# SQLite (embedded default)
# --------------------------------------------------------------------------------------------

_UPSERT = "INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)"  # a rewritten key loses its expiry
_LIVE = "(expires_at IS NULL OR expires_at > ?)"
_RUN_IDS = (
    "SELECT DISTINCT substr(rest, 1, instr(rest, ':') - 1) FROM "
    f"(SELECT substr(key, ?) AS rest FROM kv WHERE key >= ? AND key < ? AND {_LIVE}) WHERE instr(rest, ':') > 1"
)
_EXPIRE = "UPDATE kv SET expires_at = ? WHERE key >= ? AND key < ? AND expires_at IS NULL"
_PERSIST = "UPDATE kv SET expires_at = NULL WHERE key >= ? AND key < ? AND expires_at IS NOT NULL"
_EXPIRED = "expires_at IS NOT NULL AND expires_at <= ?"


def _prefix_range(key_prefix: str) -> tuple[str, str]:
    """Return [low, high) bounds of the keys starting with key_prefix (SQLite compares text bytewise)."""
    return key_prefix, key_prefix[:-1] + chr(ord(key_prefix[-1]) + 1)


class SqliteCache(CandidateCache):
    """Candidate cache in one SQLite file in WAL mode: one writer, any number of reading processes."""

    def __init__(self, path: str | Path, prefix: str, version_grace_s: float = DEFAULT_VERSION_GRACE_S) -> None:
        self.path = Path(path)
        self.prefix = prefix
        self.version_grace_s = version_grace_s
        self._lock = threading.RLock()  # one connection shared by threads (e.g. a server's pool)
        with self._guard():
            self._conn = self._connect()
        self._purge_expired()

    def _connect(self) -> sqlite3.Connection:
        """Open the file (creating its folder and table) in WAL mode with a busy timeout."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")  # a cache can lose its last commit on power loss
        conn.execute("CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL, expires_at REAL)")
        if "expires_at" not in {row[1] for row in conn.execute("PRAGMA table_info(kv)")}:
            conn.execute("ALTER TABLE kv ADD COLUMN expires_at REAL")  # a file from before version expiry
        conn.execute("CREATE INDEX IF NOT EXISTS kv_expires ON kv (expires_at) WHERE expires_at IS NOT NULL")
        return conn

    def _guard(self) -> AbstractContextManager[None]:
        """Return a context turning SQLite errors into CacheUnavailable."""
        return unavailable_on((sqlite3.DatabaseError,), str(self.path))

    @contextmanager
    def _transaction(self, mode: str = "DEFERRED") -> Iterator[sqlite3.Connection]:
        """Run the block in one transaction (IMMEDIATE takes the write lock up front)."""
        with self._lock, self._guard():
            self._conn.execute(f"BEGIN {mode}")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            finally:
                if self._conn.in_transaction:  # the block or the COMMIT failed
                    self._conn.execute("ROLLBACK")

    def _get(self, key: str) -> bytes | None:
        with self._lock, self._guard():
            row = self._conn.execute(f"SELECT value FROM kv WHERE key = ? AND {_LIVE}", (key, time.time())).fetchone()
        return None if row is None else bytes(row[0])

    def _write_batch(self, items: list[Entry]) -> None:
        with self._transaction("IMMEDIATE") as conn:
            conn.executemany(_UPSERT, items)

    def _delete_prefix(self, key_prefix: str) -> int:
        with self._transaction("IMMEDIATE") as conn:
            return conn.execute("DELETE FROM kv WHERE key >= ? AND key < ?", _prefix_range(key_prefix)).rowcount

    def _expire_version(self, run_id: str, ttl_s: float) -> None:
        with self._transaction("IMMEDIATE") as conn:
            conn.execute(_EXPIRE, (time.time() + ttl_s, *_prefix_range(self.version_prefix(run_id))))

    def _purge_expired(self) -> None:
        """Delete expired rows; only takes the write lock when there are some (opening must not wait on a writer)."""
        now = time.time()
        with self._lock, self._guard():
            if self._conn.execute(f"SELECT 1 FROM kv WHERE {_EXPIRED} LIMIT 1", (now,)).fetchone() is None:
                return
        with self._transaction("IMMEDIATE") as conn:
            purged = conn.execute(f"DELETE FROM kv WHERE {_EXPIRED}", (now,)).rowcount
        logger.info("cache: purged %d expired entries from %s", purged, self.path)

    def query_one(self, sql: str, params: tuple[object, ...]) -> tuple[object, ...] | None:
        """Return the first row of a read-only statement on the cache file (the service's one-statement read)."""
        with self._lock, self._guard():
            row = self._conn.execute(sql, params).fetchone()
        return None if row is None else tuple(row)

    def read(self, user_id: str) -> tuple[str, bytes] | None:
        """Return (current run id, payload) of a user, pointer and entry read from one snapshot."""
        with self._transaction():
            return super().read(user_id)

    def switch_current(self, run_id: str) -> str | None:
        """Set current and previous in one write transaction; return the old current."""
        check_run_id(run_id)
        with self._transaction("IMMEDIATE") as conn:
            old = self.current()
            conn.execute(_PERSIST, _prefix_range(self.version_prefix(run_id)))  # a rolled-back-to version stays
            if old != run_id:
                conn.execute(_UPSERT, (self.current_key, run_id.encode()))
                if old is None:
                    conn.execute("DELETE FROM kv WHERE key = ?", (self.previous_key,))
                else:
                    conn.execute(_UPSERT, (self.previous_key, old.encode()))
        logger.info("cache: current run %s (was %s)", run_id, old)
        return old

    def set_pointers(self, current: str | None, previous: str | None) -> None:
        """Set current and previous in one write transaction (None deletes), their versions' expiries cleared."""
        with self._transaction("IMMEDIATE") as conn:
            for key, run_id in ((self.current_key, current), (self.previous_key, previous)):
                if run_id is None:
                    conn.execute("DELETE FROM kv WHERE key = ?", (key,))
                else:
                    conn.execute(_PERSIST, _prefix_range(self.version_prefix(run_id)))
                    conn.execute(_UPSERT, (key, run_id.encode()))
        logger.info("cache: pointers set to current %s, previous %s", current, previous)

    def versions(self) -> list[str]:
        base = f"{self.prefix}:cand:"
        with self._lock, self._guard():
            rows = self._conn.execute(_RUN_IDS, (len(base) + 1, *_prefix_range(base), time.time())).fetchall()
        return sorted(row[0] for row in rows)

    def ping(self) -> bool:
        try:
            with self._lock:
                self._conn.execute("SELECT 1").fetchone()
        except sqlite3.Error:
            return False
        return True

    def close(self) -> None:
        with self._lock:
            self._conn.close()


# --------------------------------------------------------------------------------------------
# Redis (server, by configuration)
# --------------------------------------------------------------------------------------------


def redact_url(url: str) -> str:
    """Return url with its password replaced by ***, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
