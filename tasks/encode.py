"""Tasks around the model: plan the shards, encode one shard (holding a slot of the gpu concurrency limit)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from functools import lru_cache
from typing import Iterator

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency

from nightscore.stages import encode as stage
from storage.resources import lake_for, warehouse_for
from tasks.common import context, settings
from tasks.report import report_progress, start_progress


@task(name="plan-shards", cache_policy=NO_CACHE)
def plan_shards(run: dict[str, str], validated: dict[str, object]) -> dict[str, object]:
    """Produce plan.parquet and reused.parquet (vectors of unchanged items); return the shard numbers and the progress artifact."""
    cfg = settings()
    lake = lake_for(cfg)
    planned = stage.plan_shards(lake, context(run), cfg, stage.previous_vectors(lake, warehouse_for(cfg)))
    progress = {"artifact_id": start_progress(len(planned["shards"])), "shards": planned["shards"]}
    return {**planned, "progress": progress}


@lru_cache(maxsize=8)
def limit_exists(name: str) -> bool:
    """Return whether the Prefect server has the global concurrency limit (read once per process)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            return False
    return True


@contextmanager
def gpu_slot(limit: str | None) -> Iterator[None]:
    """Hold one slot of the global concurrency limit while the block runs (nothing when limit is empty).

    Waiting is logged (visible on the run's page), so a run queued behind another one's shards says why.
    A limit that does not exist on the server is skipped (asked once per process: asking Prefect to
    acquire a missing limit costs seconds per shard): `nightscore up` / `nightscore deploy` create it.
    """
    if not limit or not limit_exists(limit):
        yield
        return
    logger = get_run_logger()
    logger.info("waiting for a slot of global concurrency limit %r", limit)
    asked = time.monotonic()
    with concurrency(limit, occupy=1, strict=False):
        logger.info("holding a slot of %r after %.1f s", limit, time.monotonic() - asked)
        yield


@task(name="encode-shard", cache_policy=NO_CACHE, task_run_name="encode-shard-{shard}")
def encode_shard(run: dict[str, str], shard: int, progress: dict[str, object] | None = None) -> dict[str, object]:
    """Produce shards/shard-NNNNN.parquet with the shard's embeddings; return its encode stats."""
    cfg = settings()
    with gpu_slot(cfg.gpu_limit):
        result = stage.encode_shard(lake_for(cfg), context(run), cfg, shard)
    if progress:
        order: list[int] = list(progress["shards"])  # type: ignore[arg-type]
        report_progress(progress.get("artifact_id"), order.index(shard) + 1, len(order))  # type: ignore[arg-type]
    return result


@task(name="merge-encode-stats", cache_policy=NO_CACHE)
def merge_encode_stats(shards: list[dict[str, object]], planned: dict[str, object]) -> dict[str, object]:
    """Return the run's encode stats: shards computed now summed, reused rows and shards counted."""
    return stage.merge_shard_stats(shards, planned)
