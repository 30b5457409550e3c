"""What every task shares: settings, adapters, and the retry rule for I/O tasks."""

from __future__ import annotations

from typing import Any

from nightscore.errors import CacheUnavailable, ContractViolation
from nightscore.run_context import RunContext
from nightscore.settings import Settings, load_settings

IO_RETRIES = 2
IO_RETRY_DELAYS = [1, 4]


def settings() -> Settings:
    """Return the settings of this process (NIGHTSCORE_* variables)."""
    return load_settings()


def context(run: dict[str, str]) -> RunContext:
    """Return the RunContext a task received as a plain dict."""
    return RunContext(**run)


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
