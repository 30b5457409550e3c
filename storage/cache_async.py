"""The service's read path of the candidate cache: one user's pointer, entry and recent events in one round trip.

`CacheReader.read` returns what one request needs: the current run id, the user's entry in that run, and the
items the user interacted with recently (storage/events.py writes them). Redis: one Lua script over a
``redis.asyncio`` connection pool (the keys it builds from the pointer are not declared, so it needs a single
Redis, not a cluster). SQLite: one joined statement for pointer and entry plus an indexed events read, run on
the event loop itself: each takes microseconds in WAL mode (readers never wait on a writer), far less than a
hop to a thread would cost, so a request never leaves the loop.

On ``redis://`` the per-request script goes over one pipelined connection per worker (storage/pipelined.py: a
packed command out, a future resolved by the reply, a third of redis-py's CPU per call), bounded by one deadline;
the other commands (events, the pointer, ping), and every command over TLS (``rediss://``), go through redis-py's
pool with its socket timeout.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from core.errors import CacheUnavailable
from storage.cache import REDIS_SCHEMES, SqliteCache, redact_url
from storage.events import RECENT_PER_USER, EventStore, SqliteEvents, user_events_key
from storage.events_redis import RedisEvents
from storage.pipelined import PipelinedScript

log = logging.getLogger(__name__)

_REDIS_DOWN = (aioredis.ConnectionError, aioredis.TimeoutError, OSError)

# KEYS: current pointer, the user's recent-events set; ARGV: entry key prefix, user id, how many events.
_READ_SCRIPT = """
local run = redis.call('GET', KEYS[1])
local recent = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[3]) - 1, 'REV', 'WITHSCORES')
if not run then return {false, false, recent} end
return {run, redis.call('GET', ARGV[1] .. run .. ':' .. ARGV[2]), recent}
"""


@dataclass(frozen=True)
class Found:
    """One read: the current run (None before the first publication), the user's entry in it, recent events."""

    run_id: str | None
    entry: bytes | None
    recent: dict[str, float] = field(default_factory=dict)  # item id -> latest event time (epoch s)


class CacheReader(ABC):
    """Reads the cache for the service; every failure to reach it is CacheUnavailable."""

    @abstractmethod
    async def read(self, user_id: str) -> Found:
        """Return the current run id, the user's entry in it and their recent events, in one round trip."""

    @abstractmethod
    async def ping(self) -> bool:
        """Return True when the store answers."""

    @abstractmethod
    async def current(self) -> str | None:
        """Return the current candidates version (None: nothing published, e.g. a store restarted empty).

        Raises:
            CacheUnavailable: the store does not answer.
        """

    @abstractmethod
    async def close(self) -> None:
        """Release the connections."""


class RedisReader(CacheReader):
    """The read path on Redis: one script call per request over one pipelined connection (redis://), or redis-py's pool
    (rediss://); the event store, the pointer and pings use `client`, a pool of at most pool_size connections."""

    def __init__(self, url: str, prefix: str, timeout_s: float, pool_size: int) -> None:
        self.prefix, self._where, self._timeout_s = prefix, redact_url(url), timeout_s
        pool = aioredis.ConnectionPool.from_url(
            url, max_connections=pool_size, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        # one immediate retry on a fresh connection: a pooled one may be stale after a server restart
        self.client = aioredis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 1), retry_on_error=[aioredis.ConnectionError])
        self._script = self.client.register_script(_READ_SCRIPT)
        self._pipe = PipelinedScript(url, _READ_SCRIPT, timeout_s) if url.startswith("redis://") else None
        self._current_key, self._entry_prefix = f"{prefix}:cand:current", f"{prefix}:cand:"

    async def read(self, user_id: str) -> Found:
        """Return pointer, entry and recent events of a user from one script call (within the timeout, all told)."""
        keys = [self._current_key, user_events_key(self.prefix, user_id)]
        args: list[str | int] = [self._entry_prefix, user_id, RECENT_PER_USER]
        try:
            if self._pipe is not None:
                run, entry, recent = await self._pipe.call(keys, args, self._timeout_s)
            else:
                run, entry, recent = await self._script(keys=keys, args=args)
        except _REDIS_DOWN as exc:  # the pipe's TimeoutError and ConnectionError are OSErrors too
            raise CacheUnavailable(f"candidate cache unavailable at {self._where}: {exc or type(exc).__name__}") from exc
        events = {bytes(recent[i]).decode(): float(recent[i + 1]) for i in range(0, len(recent), 2)}
        return Found(None if run is None else bytes(run).decode(), None if entry is None else bytes(entry), events)

    async def current(self) -> str | None:
        """Return the current candidates version, read with GET."""
        try:
            value = await self.client.get(f"{self.prefix}:cand:current")
        except _REDIS_DOWN as exc:
            raise CacheUnavailable(f"candidate cache unavailable at {self._where}: {exc or type(exc).__name__}") from exc
        return None if value is None else (value.decode() if isinstance(value, bytes) else str(value))

    async def ping(self) -> bool:
        """Return True when Redis answers PING."""
        try:
            return bool(await self.client.ping())
        except _REDIS_DOWN:
            return False

    async def close(self) -> None:
        """Close the pipelined connection and the pool's."""
        if self._pipe is not None:
            await self._pipe.close()
        await self.client.aclose()


_READ_SQL = (
    "SELECT CAST(c.value AS TEXT), e.value FROM kv AS c LEFT JOIN kv AS e ON e.key = ? || CAST(c.value AS TEXT) || ':' || ?"
    " AND (e.expires_at IS NULL OR e.expires_at > ?) WHERE c.key = ?"
)


class SqliteReader(CacheReader):
    """The read path on the embedded SQLite file, inline on the event loop (microseconds per read, see above)."""

    def __init__(self, cache: SqliteCache, events: SqliteEvents | None) -> None:
        self._cache, self._events = cache, events

    async def read(self, user_id: str) -> Found:
        """Return pointer and entry of a user from one statement, and their recent events."""
        prefix = self._cache.prefix  # query_one raises CacheUnavailable for any SQLite error
        row = self._cache.query_one(_READ_SQL, (f"{prefix}:cand:", user_id, time.time(), f"{prefix}:cand:current"))
        recent = self._events.recent(user_id) if self._events is not None else {}
        if row is None:
            return Found(None, None, recent)
        return Found(str(row[0]), None if row[1] is None else bytes(row[1]), recent)  # type: ignore[call-overload]  # a BLOB

    async def current(self) -> str | None:
        """Return the current candidates version from the file."""
        return self._cache.current()

    async def ping(self) -> bool:
        """Return True when the file answers a query."""
        return self._cache.ping()

    async def close(self) -> None:
        """Close the file."""
        self._cache.close()


def open_stores(
    location: str, prefix: str, timeout_s: float, pool_size: int, retention_s: float, max_events: int
) -> tuple[CacheReader, EventStore]:
    """Return the read path and the event store of a redis:// URL (one shared pool) or of the SQLite file."""
    if location.startswith(REDIS_SCHEMES):
        reader = RedisReader(location, prefix, timeout_s, pool_size)
        return reader, RedisEvents(reader.client, prefix, retention_s, max_events)
    events = SqliteEvents(location, retention_s, max_events)
    return SqliteReader(SqliteCache(location, prefix), events), events
