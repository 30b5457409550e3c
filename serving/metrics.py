"""Prometheus metrics of the service (prometheus_client): requests by endpoint and status, latency histogram, fallbacks."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS_S: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """The service's metrics in a registry of their own (one per app, so apps in one process never mix counts)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "nightscore_requests", "HTTP requests by endpoint and status.", ["endpoint", "status"], registry=self.registry
        )
        self._fallbacks = Counter("nightscore_fallbacks", "Popular-items answers by reason.", ["reason"], registry=self.registry)
        self._batches = Histogram(
            "nightscore_batch_requests", "Requests scored per model call.", buckets=BATCH_BUCKETS, registry=self.registry
        )
        self._degraded = Gauge(
            "nightscore_degraded", "1 while the cache does not answer (fallback answers).", registry=self.registry
        )
        self._latency = Histogram(
            "nightscore_request_seconds", "Request latency.", ["endpoint"], buckets=LATENCY_BUCKETS_S, registry=self.registry
        )

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        """Count one finished request and its latency."""
        self._requests.labels(endpoint=endpoint, status=str(status)).inc()
        self._latency.labels(endpoint=endpoint).observe(seconds)

    def fallback(self, reason: str) -> None:
        """Count one popular-items fallback by its reason."""
        self._fallbacks.labels(reason=reason).inc()

    def batch(self, requests: int, _waited_s: float) -> None:
        """Count one model call of the batcher and how many requests it scored."""
        self._batches.observe(requests)

    def degraded(self, value: bool) -> None:
        """Set the degraded gauge (from the last readiness check)."""
        self._degraded.set(1.0 if value else 0.0)

    def render(self) -> bytes:
        """Return every metric in the Prometheus text exposition format."""
        return generate_latest(self.registry)
