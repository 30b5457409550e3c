"""The retry rule of I/O tasks: retry what a second attempt can fix (transport, locks), never bad data."""

from __future__ import annotations

from typing import Any

from core.errors import CacheUnavailable, ContractViolation

IO_RETRIES = 2
IO_RETRY_DELAYS: list[float] = [1.0, 4.0]


def is_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Return True when a failed I/O task may succeed on retry (network or lock trouble, not bad data)."""
    try:
        state.result()
    except ContractViolation:
        return False
    except (OSError, TimeoutError, ConnectionError, CacheUnavailable):
        return True
    except Exception:  # noqa: BLE001 - anything else is not known to be transient
        return False
    return False
