"""A circuit breaker around the cache: after a failure, requests skip the cache for open_s, then one tries it again.

A hung or down cache then costs one timeout per open_s, not one per request (issue 18 item 10): while open, the
service answers its fallback at once and reports itself degraded.
"""

from __future__ import annotations

import time


class Breaker:
    """Closed (use the cache), open (skip it until open_s after the last failure), then half-open (one trial)."""

    def __init__(self, open_s: float) -> None:
        self.open_s = open_s
        self._failed_at: float | None = None
        self._trial = False

    def allow(self) -> bool:
        """Return True when a request may use the cache now (closed, or the one trial once open_s passed)."""
        if self._failed_at is None:
            return True
        if self._trial or time.monotonic() - self._failed_at < self.open_s:
            return False
        self._trial = True  # one request tries; the others keep skipping until it reports
        return True

    def failed(self) -> None:
        """Record a failure: (re)open the circuit."""
        self._failed_at, self._trial = time.monotonic(), False

    def succeeded(self) -> None:
        """Record a success: close the circuit."""
        self._failed_at, self._trial = None, False

    @property
    def degraded(self) -> bool:
        """Return True while the circuit is not closed."""
        return self._failed_at is not None
