"""Tasks around the model: plan the shards, encode one shard."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from nightscore.stages import encode as stage
from storage.resources import lake_for, warehouse_for
from tasks.common import context, settings


@task(name="plan-shards", cache_policy=NO_CACHE)
def plan_shards(run: dict[str, str], validated: dict[str, object]) -> dict[str, object]:
    """Produce plan.parquet and reused.parquet (vectors of unchanged items); return the shard numbers."""
    cfg = settings()
    lake = lake_for(cfg)
    return stage.plan_shards(lake, context(run), cfg, stage.previous_vectors(lake, warehouse_for(cfg)))


@task(name="encode-shard", cache_policy=NO_CACHE, task_run_name="encode-shard-{shard}")
def encode_shard(run: dict[str, str], shard: int) -> dict[str, object]:
    """Produce shards/shard-NNNNN.parquet with the shard's embeddings; return its encode stats."""
    cfg = settings()
    return stage.encode_shard(lake_for(cfg), context(run), cfg, shard)


@task(name="merge-encode-stats", cache_policy=NO_CACHE)
def merge_encode_stats(shards: list[dict[str, object]], planned: dict[str, object]) -> dict[str, object]:
    """Return the run's encode stats: shards computed now summed, reused rows and shards counted."""
    return stage.merge_shard_stats(shards, planned)
