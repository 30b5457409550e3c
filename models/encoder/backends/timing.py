"""The engine's one timing helper: several calls timed in interleaved passes, each its best of the repeats."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence


def best_seconds(calls: Sequence[Callable[[], object]], repeats: int = 3) -> list[float]:
    """Return each call's fastest of repeats timed runs, after one untimed run each; the calls alternate, so machine
    noise hits them alike."""
    for call in calls:
        call()  # first use: compilation, allocation, caches
    best = [float("inf")] * len(calls)
    for _ in range(repeats):
        for index, call in enumerate(calls):
            started = time.perf_counter()
            call()
            best[index] = min(best[index], time.perf_counter() - started)
    return best
