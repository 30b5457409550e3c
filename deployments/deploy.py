"""Register nightscore with a Prefect server: process work pool with two queues, the gpu limit, four deployments.

Run as `python -m deployments.deploy` (PREFECT_API_URL set), or through `nightscore up`. Idempotent.

The work pool runs at most ``work_pool_concurrency`` flow runs at once; more wait in their queue (Scheduled,
then Late in the UI) and start in queue priority order. Each deployment's parameter schema is made strict
after it is registered (`strict_parameter_schema`): the server then refuses unknown or unwrapped parameters
(HTTP 409) besides what the models' own schema states.
"""

from __future__ import annotations

import copy
import importlib
import logging
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import (
    DeploymentUpdate,
    GlobalConcurrencyLimitCreate,
    GlobalConcurrencyLimitUpdate,
    WorkPoolCreate,
    WorkPoolUpdate,
)
from prefect.deployments.runner import EntrypointType
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.schedules import Cron
from prefect.utilities.callables import parameter_schema

from core.errors import UsageError
from core.settings import Settings, load_settings
from deployments.definitions import QUEUE_PRIORITIES, DeploymentSpec, deployment_specs

log = logging.getLogger(__name__)

NO_SCHEDULED_INPUTS = (
    "the nightly schedule has no inputs: set NIGHTSCORE_ITEMS_URI and NIGHTSCORE_INTERACTIONS_URI "
    "(or give --demo to schedule the demo data)"
)


def ensure_work_pool(pool: str, concurrency: int | None = None) -> None:
    """Create the process work pool and its queues (on-demand before scheduled) if missing; set its concurrency limit."""
    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(
                WorkPoolCreate(name=pool, type="process", description="nightscore runs", concurrency_limit=concurrency)
            )
        except ObjectAlreadyExists:
            # None is "leave unchanged" to the API; clearing a limit is `prefect work-pool clear-concurrency-limit`
            client.update_work_pool(pool, WorkPoolUpdate(concurrency_limit=concurrency))
        existing = {q.name: q for q in client.read_work_queues(work_pool_name=pool)}
        for queue, priority in QUEUE_PRIORITIES.items():
            if queue not in existing:
                client.create_work_queue(name=queue, work_pool_name=pool, priority=priority)
            elif existing[queue].priority != priority:
                client.update_work_queue(existing[queue].id, priority=priority)


def ensure_gpu_limit(name: str | None, slots: int) -> None:
    """Create (or resize) the global concurrency limit every encode shard takes a slot of."""
    if not name:
        return
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
            client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=slots, active=True))
        except ObjectNotFound:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=slots, active=True))


def strict_parameter_schema(schema: dict[str, Any], allow_private_callbacks: bool) -> dict[str, Any]:
    """Return a deployment's parameter schema that refuses parameters the flow does not take (unwrapped ones too).

    With allow_private_callbacks, callback_url may name internal addresses (the models' schema refuses them).
    """
    strict = copy.deepcopy(schema)
    strict["additionalProperties"] = False
    if allow_private_callbacks:
        for definition in strict.get("definitions", {}).values():
            definition.get("properties", {}).get("callback_url", {}).pop("not", None)
    return strict


def apply_deployment(spec: DeploymentSpec, settings: Settings) -> UUID:
    """Register one deployment (schedule, queue, enforced strict parameter schema) and return its id."""
    module, _, attr = spec.entrypoint.rpartition(".")
    flow = getattr(importlib.import_module(module), attr)
    schedules = [Cron(spec.cron, timezone=settings.ops.schedule_timezone)] if spec.cron else []
    deployment = flow.to_deployment(
        name=spec.name,
        parameters=default_parameters(spec, settings),
        schedules=schedules,
        description=spec.description,
        tags=["nightscore"],
        work_pool_name=settings.ops.work_pool,
        work_queue_name=spec.queue,
        enforce_parameter_schema=True,
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    deployment_id = deployment.apply(work_pool_name=settings.ops.work_pool)
    # Prefect's own schema model drops additionalProperties; the server keeps the whole JSON schema it is given.
    schema = strict_parameter_schema(parameter_schema(flow).model_dump_for_openapi(), settings.ops.callback_allow_private)
    with get_client(sync_client=True) as client:
        client.update_deployment(deployment_id, DeploymentUpdate(parameter_openapi_schema=schema))
    return deployment_id


def default_parameters(spec: DeploymentSpec, settings: Settings) -> dict[str, Any]:
    """Return a deployment's default parameters: the configured inputs for one whose runs read them, else none."""
    if not spec.reads_inputs:
        return {}
    return {"params": {"items_uri": settings.lake.items_uri, "interactions_uri": settings.lake.interactions_uri}}


def require_inputs(settings: Settings) -> None:
    """Refuse (UsageError, exit 2) to schedule runs when no inputs are configured: never demo data by accident."""
    if not (settings.lake.items_uri and settings.lake.interactions_uri):
        raise UsageError(NO_SCHEDULED_INPUTS)


def deploy_all(settings: Settings) -> dict[str, UUID]:
    """Create the pool (with its concurrency limit), queues and gpu limit, then every deployment; return their ids."""
    require_inputs(settings)
    ensure_work_pool(settings.ops.work_pool, settings.ops.work_pool_concurrency)
    ensure_gpu_limit(settings.ops.gpu_limit, settings.ops.gpu_slots)
    ids = {spec.name: apply_deployment(spec, settings) for spec in deployment_specs(settings)}
    log.info("deployed %s to work pool %s", ", ".join(ids), settings.ops.work_pool)
    return ids


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    for name, deployment_id in deploy_all(load_settings()).items():
        logging.getLogger(__name__).info("%s: %s", name, deployment_id)
