"""Prometheus text exposition of the service: requests by endpoint and status, latency histogram, fallbacks."""

from __future__ import annotations

import threading
from collections import Counter

LATENCY_BUCKETS_S: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """Thread-safe counters of one process, rendered by render() in the Prometheus text format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[tuple[str, int]] = Counter()
        self._fallbacks: Counter[str] = Counter()
        self._buckets: dict[str, list[int]] = {}
        self._sums: Counter[str] = Counter()

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        """Count one finished request and its latency."""
        with self._lock:
            self._requests[(endpoint, status)] += 1
            buckets = self._buckets.setdefault(endpoint, [0] * (len(LATENCY_BUCKETS_S) + 1))
            buckets[next((i for i, b in enumerate(LATENCY_BUCKETS_S) if seconds <= b), len(LATENCY_BUCKETS_S))] += 1
            self._sums[endpoint] += seconds

    def fallback(self, reason: str) -> None:
        """Count one popular-items fallback by its reason."""
        with self._lock:
            self._fallbacks[reason] += 1

    def render(self) -> str:
        """Return every metric in the Prometheus text exposition format."""
        with self._lock:
            lines = ["# HELP nightscore_requests_total HTTP requests by endpoint and status.",
                     "# TYPE nightscore_requests_total counter"]
            requests = sorted(self._requests.items())
            lines += [f'nightscore_requests_total{{endpoint="{e}",status="{s}"}} {n}' for (e, s), n in requests]
            lines += ["# HELP nightscore_fallbacks_total Popular-items answers by reason.",
                      "# TYPE nightscore_fallbacks_total counter"]
            lines += [f'nightscore_fallbacks_total{{reason="{r}"}} {n}' for r, n in sorted(self._fallbacks.items())]
            lines += ["# HELP nightscore_request_seconds Request latency.", "# TYPE nightscore_request_seconds histogram"]
            for endpoint, buckets in sorted(self._buckets.items()):
                lines += self._histogram(endpoint, buckets)
        return "\n".join(lines) + "\n"

    def _histogram(self, endpoint: str, buckets: list[int]) -> list[str]:
        """Return the cumulative bucket, sum and count lines of one endpoint's histogram (lock held)."""
        bounds = [*(f"{b:g}" for b in LATENCY_BUCKETS_S), "+Inf"]
        cumulative = [sum(buckets[: i + 1]) for i in range(len(buckets))]
        name = "nightscore_request_seconds"
        lines = [f'{name}_bucket{{endpoint="{endpoint}",le="{le}"}} {n}' for le, n in zip(bounds, cumulative, strict=True)]
        return [*lines, f'{name}_sum{{endpoint="{endpoint}"}} {self._sums[endpoint]:.6f}',
                f'{name}_count{{endpoint="{endpoint}"}} {cumulative[-1]}']
