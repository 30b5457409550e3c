"""In-process order for DuckDB connections to one file: one configuration at a time, one schema change at a time.

A process attaches a file once, in one mode, and its connections share that attachment (storage/warehouse/
duckdb_host.py; DuckDB's own cached instance likewise refuses "a connection to same database file with a different
configuration"): a read-only read while a run's heartbeat thread holds a read-write connection has to wait.
Two threads replacing the same view at once fail with a catalog write-write conflict. The gate makes the first
wait (bounded, like another process's file lock) and runs the second one at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core.errors import WarehouseBusy

ConfigKey = tuple[tuple[str, str], ...]


class ConfigGate:
    """Lets connections of one configuration to a file overlap; one of another configuration waits until they close."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._open: dict[str, tuple[ConfigKey, int]] = {}
        self._schema_locks: dict[str, threading.Lock] = {}

    @contextmanager
    def holding(self, path: str, config: ConfigKey, wait_s: float) -> Iterator[None]:
        """Hold the file open in this configuration; WarehouseBusy after wait_s while another one is open."""
        name = str(Path(path).resolve())
        self._enter(name, config, wait_s)
        try:
            yield
        finally:
            self._leave(name)

    def schema_lock(self, path: str) -> threading.Lock:
        """Return the lock that this process's schema changes (CREATE OR REPLACE) of the file run under."""
        with self._changed:
            return self._schema_locks.setdefault(str(Path(path).resolve()), threading.Lock())

    def _enter(self, name: str, config: ConfigKey, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        with self._changed:
            while (current := self._open.get(name)) is not None and current[0] != config:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WarehouseBusy(
                        f"warehouse {name} is open in this process with another configuration "
                        f"(waited {wait_s:.0f} s): {_describe(current[0])}"
                    )
                self._changed.wait(remaining)
            self._open[name] = (config, (current[1] if current else 0) + 1)

    def _leave(self, name: str) -> None:
        with self._changed:
            config, count = self._open[name]
            if count > 1:
                self._open[name] = (config, count - 1)
            else:
                del self._open[name]
                self._changed.notify_all()


def config_key(read_only: bool, config: dict[str, str | bool]) -> ConfigKey:
    """Return a hashable form of a connection's configuration (read_only included)."""
    return tuple(sorted({"read_only": str(read_only), **{k: str(v) for k, v in config.items()}}.items()))


def _describe(config: ConfigKey) -> str:
    return ", ".join(f"{k}={v}" for k, v in config)


GATE = ConfigGate()
