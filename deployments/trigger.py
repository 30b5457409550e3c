"""Trigger a deployment and read a flow run's state through the Prefect API (what `nightscore trigger/status` do)."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime, timezone
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from deployments.definitions import deployment_ref
from nightscore.errors import RunFailed, UsageError
from storage.warehouse import Warehouse

FINAL_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def default_idempotency_key(deployment: str, params: BaseModel, today: datetime | None = None) -> str:
    """Return a key made of the deployment, the parameters and the UTC date: the same request retried today is one run."""
    day = (today or datetime.now(timezone.utc)).date().isoformat()
    body = json.dumps(params.model_dump(mode="json", exclude_none=True), sort_keys=True)
    return hashlib.sha256(f"{deployment}|{body}|{day}".encode()).hexdigest()[:32]


def trigger(deployment: str, params: BaseModel, idempotency_key: str) -> dict[str, Any]:
    """Create a flow run of the deployment (or return the one made with the same key); return its id, name and state."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.deployments import run_deployment

    flow_run = run_deployment(deployment_ref(deployment), parameters={"params": params.model_dump(mode="json")},
                              idempotency_key=idempotency_key, timeout=0)
    assert isinstance(flow_run, FlowRun)  # a sync call returns the run, never a coroutine
    return {"flow_run_id": str(flow_run.id), "name": flow_run.name, "state": flow_run.state_type.value if flow_run.state_type else None,
            "idempotency_key": idempotency_key}


def flow_run_state(flow_run_id: str) -> dict[str, Any]:
    """Return a flow run's state type, state name, message and timestamps from the API."""
    from prefect.client.orchestration import get_client

    try:
        run_uuid = UUID(flow_run_id)
    except ValueError as exc:
        raise UsageError(f"{flow_run_id!r} is not a flow run id (a UUID)") from exc
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(run_uuid)
    state = flow_run.state
    return {"flow_run_id": flow_run_id, "name": flow_run.name, "state": state.type.value if state else None,
            "state_name": state.name if state else None, "message": state.message if state else None,
            "start_time": flow_run.start_time, "end_time": flow_run.end_time}


def wait_for_run(flow_run_id: str, timeout_s: float, poll_s: float = 2.0) -> dict[str, Any]:
    """Poll a flow run until it reaches a final state; return it. RunFailed if it ends otherwise than Completed."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = flow_run_state(flow_run_id)
        if state["state"] in FINAL_STATES:
            if state["state"] != "COMPLETED":
                raise RunFailed(f"flow run {flow_run_id} ended {state['state_name']}: {state['message']}")
            return state
        if time.monotonic() > deadline:
            raise RunFailed(f"flow run {flow_run_id} still {state['state_name']} after {timeout_s:.0f} s")
        time.sleep(poll_s)


def run_counts(warehouse: Warehouse, flow_run_id: str) -> dict[str, Any] | None:
    """Return the scoring_runs row (status and counts) a flow run wrote, or None if it wrote none yet."""
    result = warehouse.query(
        "SELECT run_id, status, rows_in, rows_quarantined, rows_scored, rows_computed, rows_reused, "
        "users_with_candidates, round(wall_seconds, 1) AS wall_s FROM scoring_runs WHERE flow_run_id = ? "
        "ORDER BY started_at DESC LIMIT 1", [flow_run_id])
    records = result.records()
    return records[0] if records else None
