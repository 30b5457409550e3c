"""In-process progress of a local run: tasks report (stage, done, total); the CLI's progress bar listens."""

from __future__ import annotations

import threading
from collections.abc import Callable

Listener = Callable[[str, int, int], None]

_listeners: list[Listener] = []
_lock = threading.Lock()


def listen(listener: Listener) -> Callable[[], None]:
    """Register a listener; return the function that unregisters it."""
    with _lock:
        _listeners.append(listener)

    def stop() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return stop


def report(stage: str, done: int, total: int) -> None:
    """Tell every listener that stage has done of total units."""
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(stage, done, total)
