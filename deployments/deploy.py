"""Register nightscore with a Prefect server: process work pool with two queues, the gpu limit, four deployments.

Run as `python -m deployments.deploy` (PREFECT_API_URL set), or through `nightscore up`. Idempotent.
"""

from __future__ import annotations

import importlib
import logging
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate, WorkPoolCreate
from prefect.deployments.runner import EntrypointType
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.schedules import Cron

from deployments.definitions import QUEUE_PRIORITIES, DeploymentSpec, deployment_specs
from nightscore.settings import Settings, load_settings

log = logging.getLogger(__name__)


def ensure_work_pool(pool: str) -> None:
    """Create the process work pool and its queues (on-demand before scheduled) if they are missing."""
    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process", description="nightscore runs"))
        except ObjectAlreadyExists:
            pass
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


def apply_deployment(spec: DeploymentSpec, settings: Settings) -> UUID:
    """Register one deployment (schedule, queue, enforced parameter schema) and return its id."""
    module, _, attr = spec.entrypoint.rpartition(".")
    flow = getattr(importlib.import_module(module), attr)
    schedules = [Cron(spec.cron, timezone=settings.schedule_timezone)] if spec.cron else []
    deployment = flow.to_deployment(
        name=spec.name, schedules=schedules, description=spec.description, tags=["nightscore"],
        work_pool_name=settings.work_pool, work_queue_name=spec.queue, enforce_parameter_schema=True,
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    return deployment.apply(work_pool_name=settings.work_pool)


def deploy_all(settings: Settings) -> dict[str, UUID]:
    """Create the pool, queues and gpu limit, then register every deployment; return their ids by name."""
    ensure_work_pool(settings.work_pool)
    ensure_gpu_limit(settings.gpu_limit, settings.gpu_slots)
    ids = {spec.name: apply_deployment(spec, settings) for spec in deployment_specs(settings)}
    log.info("deployed %s to work pool %s", ", ".join(ids), settings.work_pool)
    return ids


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    for name, deployment_id in deploy_all(load_settings()).items():
        logging.getLogger(__name__).info("%s: %s", name, deployment_id)
