"""The candidate cache on a Redis server (storage/cache.py holds the contract and the SQLite file).

Its own module so that a process on the embedded SQLite cache never imports redis-py (and the OpenTelemetry SDK it
loads): 0.2 s of every run's start.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager
from itertools import islice

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from storage.cache import DEFAULT_VERSION_GRACE_S, CandidateCache, Entry, check_run_id, redact_url, unavailable_on

logger = logging.getLogger(__name__)

REDIS_SOCKET_TIMEOUT_S = 2.0
REDIS_RETRY_BASE_S, REDIS_RETRY_CAP_S = 0.1, 2.0  # first backoff of a retried command, and its ceiling
SCAN_COUNT = 1000

# Runs atomically on the server: current and previous change together or not at all.
_SWITCH_SCRIPT = """
local old = redis.call('GET', KEYS[1])
if old == ARGV[1] then return old end
redis.call('SET', KEYS[1], ARGV[1])
if old then redis.call('SET', KEYS[2], old) else redis.call('DEL', KEYS[2]) end
return old
"""

# Sets both pointers at once; an empty argument deletes that pointer.
_SET_POINTERS_SCRIPT = """
for i = 1, 2 do
  if ARGV[i] == '' then redis.call('DEL', KEYS[i]) else redis.call('SET', KEYS[i], ARGV[i]) end
end
return 1
"""

_REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def _glob_escape(text: str) -> str:
    """Escape the glob characters of a SCAN match pattern."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


class RedisCache(CandidateCache):
    """Candidate cache on a Redis server; unreachable servers raise CacheUnavailable (ping returns False).

    Every command (pipelines and scripts included) that fails in transport — a reset connection, a timeout — is
    retried ``retries`` times with exponential backoff on a fresh connection before CacheUnavailable; each is
    safe to repeat (SET, PEXPIRE NX, the pointer scripts).
    """

    def __init__(self, url: str, prefix: str, version_grace_s: float = DEFAULT_VERSION_GRACE_S, retries: int = 2) -> None:
        self.url = url
        self.prefix = prefix
        self.version_grace_s = version_grace_s
        self._where = redact_url(url)
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=REDIS_SOCKET_TIMEOUT_S,
            socket_connect_timeout=REDIS_SOCKET_TIMEOUT_S,
            retry=Retry(ExponentialBackoff(cap=REDIS_RETRY_CAP_S, base=REDIS_RETRY_BASE_S), retries),
            retry_on_error=list(_REDIS_DOWN),
        )
        self._switch = self._client.register_script(_SWITCH_SCRIPT)
        self._set_pointers = self._client.register_script(_SET_POINTERS_SCRIPT)

    def _guard(self) -> AbstractContextManager[None]:
        """Return a context turning connection errors into CacheUnavailable naming the URL."""
        return unavailable_on(_REDIS_DOWN, self._where)

    def _get(self, key: str) -> bytes | None:
        with self._guard():
            value = self._client.get(key)
        return None if value is None else bytes(value)  # type: ignore[arg-type]  # redis-py types it bytes | str

    def _write_batch(self, items: list[Entry]) -> None:
        with self._guard():
            pipe = self._client.pipeline(transaction=False)
            for key, value in items:
                pipe.set(key, value)
            pipe.execute()

    def _scan(self, pattern: str) -> Iterator[bytes]:
        """Yield keys matching a glob pattern with SCAN (never KEYS, which blocks the server)."""
        with self._guard():
            yield from self._client.scan_iter(match=pattern, count=SCAN_COUNT)

    def _delete_prefix(self, key_prefix: str) -> int:
        deleted = 0
        keys = self._scan(_glob_escape(key_prefix) + "*")
        while batch := list(islice(keys, SCAN_COUNT)):
            with self._guard():
                deleted += self._client.unlink(*batch)
        return deleted

    @property
    def expiring_key(self) -> str:
        """Return the key of the set of run ids whose entries may carry a TTL (outside the cand: namespace)."""
        return f"{self.prefix}:expiring"

    def _each_batch(self, run_id: str, command: str, *args: object) -> None:
        """Apply a per-key command (pexpire, persist) to every entry of a run, one pipeline per SCAN batch."""
        keys = self._scan(_glob_escape(self.version_prefix(run_id)) + "*")
        while batch := list(islice(keys, SCAN_COUNT)):
            with self._guard():
                pipe = self._client.pipeline(transaction=False)
                for key in batch:
                    getattr(pipe, command)(key, *args)
                pipe.execute()

    def _expire_version(self, run_id: str, ttl_s: float) -> None:
        with self._guard():  # recorded first: the set may name a run without TTLs, never the reverse
            self._client.sadd(self.expiring_key, run_id)
        self._each_batch(run_id, "pexpire", max(1, round(ttl_s * 1000)), True)  # NX: the first expiry stays

    def _persist_version(self, run_id: str) -> None:
        """Clear the TTLs of a run's entries if it was ever given some."""
        with self._guard():
            if not self._client.sismember(self.expiring_key, run_id):
                return
        self._each_batch(run_id, "persist")
        with self._guard():
            self._client.srem(self.expiring_key, run_id)

    def _purge_expired(self) -> None:
        """Forget expiring run ids whose entries Redis has already removed."""
        with self._guard():
            members = {bytes(m).decode() for m in self._client.smembers(self.expiring_key)}  # type: ignore[arg-type]
        gone = members - set(self.versions())
        if gone:
            with self._guard():
                self._client.srem(self.expiring_key, *gone)

    def switch_current(self, run_id: str) -> str | None:
        """Set current and previous in one server-side script (the new current's TTLs cleared first); return the old current."""
        check_run_id(run_id)
        self._persist_version(run_id)
        with self._guard():
            old = self._switch(keys=[self.current_key, self.previous_key], args=[run_id])
        old_id = None if old is None else bytes(old).decode()
        logger.info("cache: current run %s (was %s)", run_id, old_id)
        return old_id

    def set_pointers(self, current: str | None, previous: str | None) -> None:
        """Set current and previous in one server-side script (their versions' TTLs cleared first); None deletes."""
        for run_id in (current, previous):
            if run_id is not None:
                self._persist_version(check_run_id(run_id))
        with self._guard():
            self._set_pointers(keys=[self.current_key, self.previous_key], args=[current or "", previous or ""])
        logger.info("cache: pointers set to current %s, previous %s", current, previous)

    def versions(self) -> list[str]:
        base = f"{self.prefix}:cand:"
        run_ids = {key.decode()[len(base) :].split(":", 1)[0] for key in self._scan(_glob_escape(base) + "*:*")}
        return sorted(run_ids)

    def ping(self) -> bool:
        try:
            return bool(self._client.ping())
        except _REDIS_DOWN:
            return False

    def close(self) -> None:
        self._client.close()
