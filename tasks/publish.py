"""Tasks that end a run: publish to warehouse + cache, record the run."""

from __future__ import annotations

import json
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from nightscore.stages import publish as stage
from nightscore.stages import ranking
from storage.resources import cache_for, lake_for, warehouse_for
from tasks.common import IO_RETRIES, IO_RETRY_DELAYS, context, is_transient, settings


@task(name="publish", cache_policy=NO_CACHE, retries=IO_RETRIES, retry_delay_seconds=IO_RETRY_DELAYS, retry_condition_fn=is_transient)
def publish(run: dict[str, str], stages: dict[str, dict[str, Any]], checked: dict[str, object]) -> dict[str, Any]:
    """Publish the run's item_scores and user_candidates (warehouse transaction + cache pointer); return its summary."""
    cfg, ctx = settings(), context(run)
    lake, warehouse, cache = lake_for(cfg), warehouse_for(cfg), cache_for(cfg)
    try:
        stage.record_quarantine(lake, warehouse, ctx)
        summary = stage.run_summary(ctx, stages)
        published = stage.publish(lake, warehouse, cache, ctx, summary, cfg.fault_pause_at, cfg.home / "faults")
        ranking.publish_serving_features(lake, ctx, cfg)
    finally:
        cache.close()
    return {**summary, "status": "published", "shards": stages["encode"]["shards"], **published,
            "data_docs": json.loads(summary["data_docs"])}
