"""Fail points: named places of a run where a test makes it pause or fail, off unless a test arms them.

A test arms a point through the settings (``NIGHTSCORE_FAILPOINTS='{"publish:before-commit": "enospc"}'``), so a
run in another process (the CLI, a worker) sees it too:
- ``pause``: write ``<home>/faults/<point>.reached`` and wait there until the run is stopped or killed (the kill
  tests SIGKILL or SIGTERM a real run at a known point);
- ``enospc``: raise an injected "No space left on device" error.
Every real run leaves the setting empty, and `hit` then returns at once.
"""

from __future__ import annotations

import errno
import logging
import time
from pathlib import Path

from core.settings import Settings
from core.stop import stop_requested

log = logging.getLogger(__name__)

ACTIONS = ("pause", "enospc")


def hit(point: str, settings: Settings) -> None:
    """Pause or fail at point when a test armed it; return at once otherwise."""
    action = settings.ops.failpoints.get(point)
    if action == "pause":
        _pause(point, Path(settings.home) / "faults")
    elif action == "enospc":
        raise OSError(errno.ENOSPC, f"No space left on device (injected fault at {point})")
    elif action is not None:
        raise ValueError(f"fail point {point}: unknown action {action!r} (one of {', '.join(ACTIONS)})")


def _pause(point: str, marker_dir: Path) -> None:
    """Write <marker_dir>/<point>.reached, then wait until the run is stopped (or killed)."""
    marker_dir.mkdir(parents=True, exist_ok=True)
    (marker_dir / f"{point.replace(':', '-')}.reached").write_text(str(time.time()))
    log.warning("fail point %s reached: pausing until stopped or killed", point)
    while not stop_requested():
        time.sleep(0.05)
