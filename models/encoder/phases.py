"""Where an encode call's time goes: named phases on its critical path, each ended by a device sync when profiling.

Off by default (`NO_TIMER`: every phase is a shared no-op context). A profiled pass passes a `PhaseTimer(device)`;
its syncs cost throughput, so a profiled pass is never a timed one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

# In the order of a batch's way through the engine. "collate" runs in the collating thread beside the others (it is
# on the critical path only through "idle": the main thread waiting for a collated batch).
PHASES = ("tokenize", "plan", "collate", "idle", "host_to_device", "forward", "pooling", "device_to_host")
_OFF: AbstractContextManager[None] = nullcontext()


class PhaseTimer:
    """Seconds per phase of encode calls; `enabled=False` times nothing and costs nothing."""

    def __init__(self, device: torch.device | None = None, enabled: bool = True) -> None:
        self.device, self.enabled = device, enabled
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._lock = threading.Lock()

    def phase(self, name: str) -> AbstractContextManager[None]:
        """Return a context that adds its duration to `name` (after a device sync on CUDA), or a no-op when off."""
        return self._timed(name) if self.enabled else _OFF

    @contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            if self.device is not None and self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.add(name, time.perf_counter() - started)

    def add(self, name: str, seconds: float) -> None:
        """Add seconds to a phase (thread-safe: the collating thread adds its own)."""
        if self.enabled:
            with self._lock:
                self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def breakdown(self, wall: float) -> dict[str, float]:
        """Return seconds per phase plus "other": the wall time no critical-path phase accounts for."""
        critical = sum(s for name, s in self.seconds.items() if name != "collate")
        return {**self.seconds, "other": max(wall - critical, 0.0)}


NO_TIMER = PhaseTimer(enabled=False)
