"""Flow state hooks: a run that fails or is cancelled is recorded as such, its lease is released, its caller called back.

`call_back` is the hook every final state runs (completed, failed, crashed, cancelled), so it is also where the
run hands back its run date's lease (storage/leases.py): the next attempt of the date need not wait for it to lapse.
"""

from __future__ import annotations

import logging
from typing import Any

from core.errors import RunInterrupted, WarehouseMissing
from core.records import Published
from core.settings import current_settings
from storage import leases
from storage.resources import warehouse_for
from tasks.callback import completion_payload, post_json

log = logging.getLogger(__name__)


def _mark(flow_run: Any, state: Any, status: str) -> None:
    message = " ".join(str(state.message or state.name).split())
    try:
        warehouse_for(current_settings()).mark_run(str(flow_run.id), status, message)
    except WarehouseMissing:
        return  # the run failed before it recorded anything
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


def _callback_url(flow_run: Any) -> str | None:
    params = (flow_run.parameters or {}).get("params") or {}
    url = params.get("callback_url") if isinstance(params, dict) else getattr(params, "callback_url", None)
    return str(url) if url else None


def _run_id(flow_run_id: str) -> str | None:
    try:
        return warehouse_for(current_settings()).run_of_flow_run(flow_run_id)
    except Exception:  # noqa: BLE001 - the callback still goes out without a run id
        return None


def call_back(flow: Any, flow_run: Any, state: Any) -> None:
    """Release the run's lease, then POST {flow_run_id, run_id, state, counts, tables} to its callback_url; never fail the run."""
    leases.release(str(flow_run.id))
    url = _callback_url(flow_run)
    if not url:
        return
    published = None
    if state.is_completed():
        try:
            published = state.result(raise_on_failure=False)
        except Exception:  # noqa: BLE001 - results are not persisted; counts are optional
            published = None
    payload = completion_payload(
        str(flow_run.id),
        state.type.value,
        published if isinstance(published, Published) else None,
        _run_id(str(flow_run.id)),
        None if state.is_completed() else state.message,
    )
    if not post_json(url, payload, allow_private=current_settings().ops.callback_allow_private):
        log.warning("callback to %s gave up; the run's own state is unaffected", url)
