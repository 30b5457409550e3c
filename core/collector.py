"""Python's cyclic garbage collector kept off the objects a process builds once: its imports and start-up state.

A run's libraries (torch, Prefect, Great Expectations, pandera, matplotlib) leave 650,000-800,000 objects that the
cyclic collector tracks. Each full collection walks all of them (about 0.3 s on a 2-core host) and a tiny
`nightscore run nightly` triggered nine: 3 of its 11.7 CPU-seconds (benchmarks/run_start.py). Holding the collector
off while those libraries import, then freezing what they built (gc.freeze, as CPython's documentation advises for
long-lived start-up state), leaves each later full collection the objects made since. Reference counting frees
objects as before; only reference cycles alive at the freeze are never reclaimed, and right after imports there are few.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def imports_held() -> Iterator[None]:
    """Hold the cyclic collector off while the block imports; if it loaded new modules, freeze what is alive then."""
    loaded, enabled = len(sys.modules), gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if len(sys.modules) > loaded:
            gc.freeze()
        if enabled:
            gc.enable()


def freeze_startup_objects() -> None:
    """Move every object alive now (modules, a loaded run) out of the collector's sight, start-up garbage collected first.

    A ranking worker holds some 200,000 objects after start-up (numpy, LightGBM, pydantic, FastAPI); every full
    collection walked them all, 60+ ms on a slow core, and that pause was the service's p99. Frozen, a full
    collection sees only what was made since: a few thousand objects, well under a millisecond.
    """
    gc.collect()  # garbage of start-up goes now, not frozen forever
    gc.freeze()
