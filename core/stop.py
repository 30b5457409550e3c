"""Graceful stop: a process-wide flag set by SIGTERM/SIGINT and checked between batches.

The flag lives here (not in Prefect) so the engine and stages can check it without importing Prefect.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

from core.errors import RunInterrupted

log = logging.getLogger(__name__)

_STOP = threading.Event()


def request_stop(signum: int | None = None, frame: FrameType | None = None) -> None:
    """Ask the run to stop after its current batch (signal handler)."""
    if not _STOP.is_set():
        log.warning("stop requested (signal %s): finishing the current batch, keeping finished shards", signum)
    _STOP.set()


def stop_requested() -> bool:
    """Return whether a stop was requested."""
    return _STOP.is_set()


def raise_if_stopped(where: str) -> None:
    """Raise RunInterrupted when a stop was requested."""
    if _STOP.is_set():
        raise RunInterrupted(f"run interrupted by a stop request during {where}; finished shards are kept, resume to complete it")


def install_signal_handlers() -> None:
    """Route SIGTERM (spot notice, Prefect cancellation) and SIGINT to a graceful stop (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)


def reset() -> None:
    """Clear the stop flag (tests, or a new run in the same process)."""
    _STOP.clear()


def chain_stop_handler() -> None:
    """Make the SIGTERM handler in force (Prefect's, inside a flow) request a graceful stop first.

    Prefect replaces SIGTERM's handler while a flow runs and aborts the flow's thread; worker
    threads would run on. Chaining sets the stop flag too, so they finish their current batch and stop.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if getattr(current, "nightscore_chained", False):
        return

    def chained(signum: int, frame: FrameType | None) -> None:
        request_stop(signum, frame)
        if callable(current):
            current(signum, frame)

    chained.nightscore_chained = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGTERM, chained)
