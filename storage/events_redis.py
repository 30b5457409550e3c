"""Interaction events in a Redis stream, with each user's recent items in a sorted set (storage/events.py holds the
contract and the SQLite table). Its own module so that a run on the embedded store never imports redis-py.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import date

import redis.asyncio as aioredis

from core.errors import CacheUnavailable
from storage.events import RECENT_PER_USER, Event, EventsFull, EventStore, day_bounds, user_events_key

# KEYS: stream, user set, the event's fingerprint; ARGV: max events, retention ms, now ms, user, item, event, ts,
# recent kept. Returns 1 stored, 0 full, 2 an exact duplicate of an event held (its fingerprint lives as long).
_APPEND_SCRIPT = """
redis.call('XTRIM', KEYS[1], 'MINID', '~', tonumber(ARGV[3]) - tonumber(ARGV[2]))
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
if not redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[2]) then return 2 end
redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[1], '*', 'user_id', ARGV[4], 'item_id', ARGV[5], 'event', ARGV[6], 'ts', ARGV[7])
redis.call('ZADD', KEYS[2], ARGV[7], ARGV[5])
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -1 - tonumber(ARGV[8]))
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"""

_REDIS_DOWN = (aioredis.ConnectionError, aioredis.TimeoutError, OSError)


class RedisEvents(EventStore):
    """Events in a Redis stream (XADD, trimmed to retention by MINID) plus each user's recent-items set."""

    def __init__(self, client: aioredis.Redis, prefix: str, retention_s: float, max_events: int) -> None:
        self._client, self.prefix = client, prefix
        self.retention_ms, self.max_events = int(retention_s * 1000), max_events
        self._append = client.register_script(_APPEND_SCRIPT)

    @property
    def stream_key(self) -> str:
        """Return the key of the event stream."""
        return f"{self.prefix}:ev:stream"

    def fingerprint_key(self, event: Event) -> str:
        """Return the key marking an event as held (a digest of user, item, kind and ts)."""
        digest = hashlib.sha1(json.dumps([event.user_id, event.item_id, event.event, repr(event.ts)]).encode()).hexdigest()
        return f"{self.prefix}:ev:seen:{digest}"

    async def append(self, event: Event) -> bool:
        """Append one event in one script call (trim, bound check, duplicate check, XADD, the user's set)."""
        keys = [self.stream_key, user_events_key(self.prefix, event.user_id), self.fingerprint_key(event)]
        args: list[str | int | float] = [
            self.max_events,
            self.retention_ms,
            int(time.time() * 1000),
            event.user_id,
            event.item_id,
            event.event,
            repr(event.ts),
            RECENT_PER_USER,
        ]
        try:
            added = await self._append(keys=keys, args=args)
        except _REDIS_DOWN as exc:
            raise CacheUnavailable(f"event stream unavailable: {exc or type(exc).__name__}") from exc
        if not added:
            raise EventsFull(f"event stream holds {self.max_events} events (max); export or raise the limit")
        return int(added) == 1

    async def day(self, day: date) -> list[Event]:
        """Return the stream's events whose ts falls on the UTC day, oldest first."""
        start, end = day_bounds(day)
        events = []
        for _id, fields in await self._client.xrange(self.stream_key) or []:
            values = {_text(k): _text(v) for k, v in (fields or {}).items()}
            if start <= float(values["ts"]) < end:
                events.append(Event(values["user_id"], values["item_id"], values["event"], float(values["ts"])))
        return sorted(events, key=lambda e: e.ts)

    async def close(self) -> None:
        """Leave the shared client to its owner."""


def _text(value: bytes | str) -> str:
    """Return a Redis reply value as text."""
    return value.decode() if isinstance(value, bytes) else value
