"""Trigger a deployment and read a flow run's state through the Prefect API (what `nightscore trigger/status` do)."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from core.errors import NightscoreError, RunFailed, UsageError
from core.settings import Settings
from deployments.definitions import deployment_ref
from storage.lake import Lake
from storage.resources import lake_for, warehouse_for

log = logging.getLogger(__name__)

FINAL_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
DEAD_STATES = {"FAILED", "CRASHED", "CANCELLED", "CANCELLING"}  # a run of these states never answers a retry


def inputs_identity(lake: Lake, uris: list[str | None], latest_run: str | None) -> dict[str, Any]:
    """Return what the request's inputs are now: each given file's size and ETag/mtime (via the lake adapter), or,
    when the run takes the latest published run's inputs, that run's id."""
    given = [uri for uri in uris if uri]
    if not given:
        return {"latest_published_run": latest_run}
    return {uri: lake.identity(uri) or "not visible from here" for uri in given}


def request_key(settings: Settings, deployment: str, params: BaseModel) -> str:
    """Return a request's default idempotency key: its parameters and its inputs' identity now (size, ETag/mtime).

    A request without inputs takes the latest published run's: that run's id stands for them (a warehouse this
    machine cannot read leaves the key to the parameters alone).
    """
    uris = [getattr(params, "items_uri", None), getattr(params, "interactions_uri", None)]
    latest = None
    if not any(uris):
        try:
            found = warehouse_for(settings).latest_published()
            latest = found.run_id if found else None
        except NightscoreError as exc:
            log.info("idempotency key without the latest run: %s", exc)
    return default_idempotency_key(deployment, params, inputs_identity(lake_for(settings), uris, latest))


def default_idempotency_key(deployment: str, params: BaseModel, inputs: dict[str, Any]) -> str:
    """Return a key made of the deployment, the parameters and the inputs' identity: the same request on the same
    files is one run (a retry), while new files under the same names or a new publication make a new run."""
    body = json.dumps({"params": params.model_dump(mode="json", exclude_none=True), "inputs": inputs}, sort_keys=True)
    return hashlib.sha256(f"{deployment}|{body}".encode()).hexdigest()[:32]


def existing_run(deployment: str, idempotency_key: str) -> dict[str, Any] | None:
    """Return the flow run of the deployment already made with this key (id, state, created), or None."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterName,
        FlowRunFilter,
        FlowRunFilterIdempotencyKey,
    )

    with get_client(sync_client=True) as client:
        same_key = FlowRunFilter(idempotency_key=FlowRunFilterIdempotencyKey(any_=[idempotency_key]))
        runs = client.read_flow_runs(
            flow_run_filter=same_key, limit=1, deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment]))
        )
    if not runs:
        return None
    state_type = runs[0].state_type.value if runs[0].state_type else None
    return {"flow_run_id": str(runs[0].id), "state": runs[0].state_name, "state_type": state_type, "created": runs[0].created}


@dataclass(frozen=True)
class Submission:
    """What a trigger did: the flow run it returns, the live run of the same request it returned instead of a new
    one (a retry), or the dead run (cancelled, failed, crashed) of the same request it replaced with a new one."""

    run: dict[str, Any]
    reused: dict[str, Any] | None = None
    replaced: dict[str, Any] | None = None


def submit(deployment: str, params: BaseModel, idempotency_key: str) -> Submission:
    """Return the deployment's run for the request: the live one made with the same key, else a new one.

    A run of the same key that ended cancelled, failed or crashed does not absorb the retry: a new run starts under
    a key derived from the dead run's id (so retrying that one again is idempotent too).
    """
    existing = existing_run(deployment, idempotency_key)
    if existing is not None and existing["state_type"] in DEAD_STATES:
        fresh = f"{idempotency_key}:after-{existing['flow_run_id'][:8]}"
        return Submission(trigger(deployment, params, fresh), replaced=existing)
    return Submission(trigger(deployment, params, idempotency_key), reused=existing)


def trigger(deployment: str, params: BaseModel, idempotency_key: str) -> dict[str, Any]:
    """Create a flow run of the deployment (or return the one made with the same key); return its id, name and state."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError

    try:
        flow_run = run_deployment(
            deployment_ref(deployment),
            parameters={"params": params.model_dump(mode="json")},
            idempotency_key=idempotency_key,
            timeout=0,
        )
    except ObjectNotFound as exc:
        raise UsageError(f"no deployment {deployment_ref(deployment)} on this Prefect server: run `nightscore deploy`") from exc
    except PrefectHTTPStatusError as exc:
        if exc.response.status_code not in (409, 422):
            raise
        raise UsageError(f"the Prefect server refused the run's parameters: {refusal(exc.response)}") from exc
    assert isinstance(flow_run, FlowRun)  # a sync call returns the run, never a coroutine
    state = flow_run.state_type.value if flow_run.state_type else None
    return {"flow_run_id": str(flow_run.id), "name": flow_run.name, "state": state, "idempotency_key": idempotency_key}


def refusal(response: Any) -> str:
    """Return the server's reason for refusing parameters in one short line: the field it named, never its regex."""
    try:
        detail = str(response.json().get("detail", response.text))
    except ValueError:
        detail = response.text
    field = re.search(r"field '([^']+)'", detail)
    if field:
        return f"{field.group(1).removeprefix('params.')} does not pass the deployment's schema"
    return " ".join(detail.split())[:160]


def flow_run_state(flow_run_id: str) -> dict[str, Any]:
    """Return a flow run's state type, state name, message and timestamps from the API."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    try:
        run_uuid = UUID(flow_run_id)
    except ValueError as exc:
        raise UsageError(f"{flow_run_id!r} is not a flow run id (a UUID)") from exc
    with get_client(sync_client=True) as client:
        try:
            flow_run = client.read_flow_run(run_uuid)
        except ObjectNotFound as exc:
            raise UsageError(f"no flow run {flow_run_id} on this Prefect server") from exc
    state = flow_run.state
    return {
        "flow_run_id": flow_run_id,
        "name": flow_run.name,
        "state": state.type.value if state else None,
        "state_name": state.name if state else None,
        "message": state.message if state else None,
        "start_time": flow_run.start_time,
        "end_time": flow_run.end_time,
    }


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
