"""Prometheus metrics of the service (prometheus_client): requests by endpoint and status, latency histogram, fallbacks.

One worker keeps its metrics in its own registry. Several (`nightscore serve --workers N`) write theirs to the folder
run_server names (prometheus_client's multiprocess mode, chosen when a worker imports it) and /metrics answers the
sum over every worker, dead ones included: whichever worker a scrape reaches, no counter ever goes back.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from core.environment import metrics_folder

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
        self._dropped = Counter(
            "nightscore_events_dropped", "Events answered 202 but not stored, by reason.", ["reason"], registry=self.registry
        )
        self._batches = Histogram(
            "nightscore_batch_requests", "Requests scored per model call.", buckets=BATCH_BUCKETS, registry=self.registry
        )
        self._degraded = Gauge(
            "nightscore_degraded",
            "1 while the cache does not answer (fallback answers).",
            registry=self.registry,
            multiprocess_mode="livemax",  # several workers: 1 when any live one found the cache down
        )
        self._latency = Histogram(
            "nightscore_request_seconds", "Request latency.", ["endpoint"], buckets=LATENCY_BUCKETS_S, registry=self.registry
        )
        self._children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}  # bounded: endpoint_of x statuses

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        """Count one finished request and its latency."""
        children = self._children.get((endpoint, status))
        if children is None:  # labels() parses its arguments and takes a lock: once per endpoint and status
            children = (self._requests.labels(endpoint=endpoint, status=str(status)), self._latency.labels(endpoint=endpoint))
            self._children[(endpoint, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    def fallback(self, reason: str) -> None:
        """Count one popular-items fallback by its reason."""
        self._fallbacks.labels(reason=reason).inc()

    def dropped(self, reason: str) -> None:
        """Count one event dropped (answered, never stored) by its reason."""
        self._dropped.labels(reason=reason).inc()

    def batch(self, requests: int, _waited_s: float) -> None:
        """Count one model call of the batcher and how many requests it scored."""
        self._batches.observe(requests)

    def degraded(self, value: bool) -> None:
        """Set the degraded gauge (from the last readiness check)."""
        self._degraded.set(1.0 if value else 0.0)

    def render(self) -> bytes:
        """Return every metric in the Prometheus text exposition format (summed over the workers when there are several)."""
        folder = metrics_folder()
        if folder is None:
            return generate_latest(self.registry)
        workers = CollectorRegistry()
        MultiProcessCollector(workers, path=folder)
        return generate_latest(workers)
