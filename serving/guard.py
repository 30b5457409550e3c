"""Who may call the service and how often: API keys (401, 403) and a token bucket per client (429), one ASGI middleware.

Keys are the settings' ``serving.api_keys``; a client sends one as ``Authorization: Bearer <key>`` or ``X-API-Key``.
``/healthz`` and ``/readyz`` are always open (probes carry no key); recommendations need a key unless ``open_reads``;
``POST /v1/events`` and ``/metrics`` always do. A key that is sent must be one of them (403), even where none is
needed. Without keys the service starts only with ``allow_no_keys`` (`check_access`), and then nothing is gated.

Rate limits: a token bucket per client (its key when it sends a valid one, else its address), refilled at
``rate_limit_per_s`` up to ``rate_limit_burst`` tokens, one per request. The buckets live in each worker's memory:
with N workers a client may make up to N times the rate (the workers share no state). A wrong key counts against
its address's bucket, so guessing keys is rate-limited too.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from core.errors import UsageError
from core.settings import ServingSettings
from serving.errors import Forbidden, RateLimited, ServingError, Unauthenticated, error_response

OPEN_PATHS = ("/healthz", "/readyz")  # probes: never gated, never limited
READ_PREFIX = "/v1/users/"
MAX_CLIENTS = 100_000  # buckets kept per worker; the least recently seen client's goes first (it was full anyway)
NO_KEYS = (
    "the service has no API keys: set NIGHTSCORE_SERVING_API_KEYS='[\"<a key of 16+ characters>\"]', "
    "or NIGHTSCORE_SERVING_ALLOW_NO_KEYS=true to serve every endpoint without one (a single host)"
)


def check_access(options: ServingSettings) -> None:
    """Raise UsageError when the service has no keys and may not run without them (the safe default)."""
    if not options.api_keys and not options.allow_no_keys:
        raise UsageError(NO_KEYS)


@dataclass
class Bucket:
    """One client's tokens and when they were last counted."""

    tokens: float
    at: float


class TokenBuckets:
    """Token buckets by client: `rate` tokens a second up to `burst`; a request takes one."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, float(burst), clock
        self._buckets: OrderedDict[str, Bucket] = OrderedDict()

    def take(self, client: str) -> float:
        """Return 0.0 when the client had a token (taken now), else the seconds until it has one."""
        now = self._clock()
        bucket = self._buckets.pop(client, None) or Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        self._buckets[client] = bucket  # most recently seen last
        if len(self._buckets) > MAX_CLIENTS:
            self._buckets.popitem(last=False)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate


class Keys:
    """The service's keys, compared in constant time (as SHA-256 digests, so lengths never leak)."""

    def __init__(self, keys: list[str]) -> None:
        self._digests = [hashlib.sha256(k.encode()).digest() for k in keys]

    def __bool__(self) -> bool:
        return bool(self._digests)

    def match(self, presented: str) -> int | None:
        """Return the index of the key presented, or None when it is none of them (every key compared)."""
        digest = hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest()
        found = None
        for index, known in enumerate(self._digests):
            if hmac.compare_digest(digest, known):
                found = index
        return found


def presented_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Return the key a request carries (Authorization: Bearer, else X-API-Key), or None."""
    values = {name.lower(): value.decode("latin-1").strip() for name, value in headers}
    scheme, _, token = values.get(b"authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return values.get(b"x-api-key") or None


class Guard:
    """ASGI middleware: the rate limit, then the key check, of every request but the probes."""

    def __init__(self, app: ASGIApp, options: ServingSettings) -> None:
        self.app, self.keys, self.open_reads = app, Keys(options.api_keys), options.open_reads
        self.buckets = TokenBuckets(options.rate_limit_per_s, options.rate_limit_burst) if options.rate_limit_per_s else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        refused = self.refusal(scope)
        if refused is not None:
            await error_response(refused)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> ServingError | None:
        """Return why a request is refused (rate, then key), or None to serve it."""
        key = presented_key(scope["headers"])
        index = self.keys.match(key) if key is not None and self.keys else None
        if self.buckets is not None:
            client = f"key:{index}" if index is not None else f"address:{(scope.get('client') or ('unknown',))[0]}"
            wait = self.buckets.take(client)
            if wait > 0:
                return RateLimited(f"rate limit of {self.buckets.rate:g} requests/s exceeded; retry in {wait:.2f} s", wait)
        if not self.keys or index is not None:
            return None
        if key is not None:
            return Forbidden("the API key sent is not one of the service's")
        needs_key = not (self.open_reads and scope["path"].startswith(READ_PREFIX))
        return Unauthenticated("this endpoint needs an API key (Authorization: Bearer <key> or X-API-Key)") if needs_key else None
