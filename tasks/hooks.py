"""Flow state hooks: a run that fails or is cancelled is recorded as such in scoring_runs."""

from __future__ import annotations

import logging
from typing import Any

from nightscore.errors import RunInterrupted
from storage.resources import warehouse_for
from tasks.common import settings

log = logging.getLogger(__name__)


def _mark(flow_run: Any, state: Any, status: str) -> None:
    message = " ".join(str(state.message or state.name).split())
    try:
        warehouse_for(settings()).mark_run(str(flow_run.id), status, message)
    except Exception as exc:  # noqa: BLE001 - a hook must never mask the run's own failure
        log.warning("could not record run %s as %s: %s", flow_run.id, status, exc)


def mark_failed(flow: Any, flow_run: Any, state: Any) -> None:
    """Record the run as failed with the state's message (interrupted when it stopped on request)."""
    try:
        state.result()
    except RunInterrupted:
        return _mark(flow_run, state, "interrupted")
    except BaseException:  # noqa: BLE001 - any other failure is a plain failure
        pass
    _mark(flow_run, state, "failed")


def mark_interrupted(flow: Any, flow_run: Any, state: Any) -> None:
    """Record the run as interrupted (cancelled or crashed)."""
    _mark(flow_run, state, "interrupted")
