"""Tasks that end a run: stage the cache version, publish (warehouse + cache pointer + partitions), serving features.

The three run inside one Prefect transaction (flows/pipeline.py) with on_rollback hooks, so a failing
step undoes the ones before it: the staged cache version is dropped, and a committed publication is
retracted (the warehouse's latest run and the cache pointer go back to the run before). A step undoes
its own partial work itself (Prefect runs a task's rollback hook only once the task has succeeded).

No Prefect retries here: in Prefect 3.9 a failed attempt inside a transaction rolls back the steps
before it even when a retry then succeeds. Lock contention is retried inside the warehouse adapter.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.transactions import Transaction, get_transaction

from nightscore.stages import publish as stage
from nightscore.stages import ranking
from storage.resources import cache_for, lake_for, warehouse_for
from tasks.common import context, settings

log = logging.getLogger(__name__)


def _remember(**values: object) -> None:
    """Keep values on this task's transaction for its rollback hook."""
    txn = get_transaction()
    if txn is not None:
        for key, value in values.items():
            txn.set(key, value)


@task(name="stage-cache", cache_policy=NO_CACHE)
def stage_cache(run: dict[str, str], checked: dict[str, object]) -> dict[str, object]:
    """Produce the run's cache version (not yet visible to readers); return its size and the pointer before it."""
    cfg, ctx = settings(), context(run)
    with cache_for(cfg) as cache:
        staged = stage.stage_cache(lake_for(cfg), cache, ctx)
    _remember(run_id=ctx.run_id, old_pointer=staged["old_pointer"])
    return staged


@stage_cache.on_rollback
def _drop_staged_version(txn: Transaction) -> None:
    with cache_for(settings()) as cache:
        stage.unstage_cache(cache, txn.get("run_id"), txn.get("old_pointer"))
    log.warning("rolled back the staged cache version of %s", txn.get("run_id"))


@task(name="publish", cache_policy=NO_CACHE)
def publish(run: dict[str, str], stages: dict[str, dict[str, Any]], staged: dict[str, object]) -> dict[str, Any]:
    """Publish the run's item_scores and user_candidates (warehouse transaction + cache pointer + partitions); return its summary."""
    cfg, ctx = settings(), context(run)
    lake, warehouse = lake_for(cfg), warehouse_for(cfg)
    with cache_for(cfg) as cache:
        stage.record_quarantine(lake, warehouse, ctx)
        summary = stage.run_summary(ctx, stages)
        published = stage.publish(lake, warehouse, cache, ctx, summary, staged, cfg.fault_pause_at, cfg.home / "faults")
    _remember(run_id=ctx.run_id)
    return {**summary, "status": "published", "shards": stages["encode"]["shards"], **published,
            "data_docs": json.loads(summary["data_docs"])}


@publish.on_rollback
def _retract_publication(txn: Transaction) -> None:
    cfg = settings()
    with cache_for(cfg) as cache:
        stage.retract(warehouse_for(cfg), cache, txn.get("run_id"), "a later publish step failed")


@task(name="publish-serving-features", cache_policy=NO_CACHE)
def publish_serving_features(run: dict[str, str], summary: dict[str, Any]) -> dict[str, Any]:
    """Produce the ranker's item features and user-topic affinity tables for the published run; return the summary."""
    cfg = settings()
    return {**summary, "serving_features": ranking.publish_serving_features(lake_for(cfg), context(run), cfg)}
