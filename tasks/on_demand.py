"""The `resolve-inputs` node of the on-demand flow: given URIs or the latest published run's, narrowed to item ids."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import polars as pl
from prefect import task
from prefect.cache_policies import NO_CACHE

from core.errors import UsageError
from core.settings import current_settings
from storage.lake import Lake
from storage.resources import lake_for, warehouse_for
from storage.warehouse.base import Warehouse
from tasks.start import saved_run

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnDemandInputs:
    """An on-demand run's input URIs, and how many requested item ids were found."""

    items_uri: str
    interactions_uri: str
    items_requested: int | None = None
    items_matched: int | None = None


@task(name="resolve-inputs", cache_policy=NO_CACHE)
def resolve_on_demand_inputs(items_uri: str | None, interactions_uri: str | None, item_ids: list[str] | None) -> OnDemandInputs:
    """Return the run's input URIs: given ones, else the latest published run's; item_ids merged into the catalog."""
    cfg = current_settings()
    lake = lake_for(cfg)
    latest = latest_inputs(lake, warehouse_for(cfg))
    if (not items_uri or not interactions_uri) and latest is None:
        raise UsageError("no published run to take inputs from: give items_uri and interactions_uri")
    source_items = items_uri or latest[0]  # type: ignore[index]
    interactions = interactions_uri or latest[1]  # type: ignore[index]
    if not item_ids:
        return OnDemandInputs(source_items, interactions)
    merged, matched = merge_items(lake, latest[0] if latest else None, source_items, item_ids)
    return OnDemandInputs(merged, interactions, len(item_ids), matched)


def latest_inputs(lake: Lake, warehouse: Warehouse) -> tuple[str, str] | None:
    """Return (items URI, interactions URI) the latest published run read, or None before any publication."""
    latest = warehouse.latest_published()
    if latest is None:
        return None
    run = saved_run(lake, latest.run_date, latest.run_id)
    return run.items_uri, run.interactions_uri


def merge_items(lake: Lake, base_uri: str | None, source_uri: str, item_ids: list[str]) -> tuple[str, int]:
    """Write the catalog with item_ids taken from source_uri over base_uri's items; return its URI and how many ids matched.

    The result is a whole catalog (the latest published run's items with the requested ones added or
    replaced), so an on-demand run for a few items publishes a complete, consistent latest run;
    unchanged items reuse their published vectors, so only the requested ones are encoded.
    """
    wanted = sorted({i.strip() for i in item_ids if i.strip()})
    requested = lake.read_parquet(source_uri, "items").filter(pl.col("item_id").cast(pl.String).is_in(wanted))
    if requested.height == 0:
        raise UsageError(f"none of the {len(wanted)} item ids is in {source_uri}")
    if requested.height < len(wanted):
        log.warning("%d of %d requested item ids are not in %s", len(wanted) - requested.height, len(wanted), source_uri)
    merged = requested
    if base_uri is not None:
        base = lake.read_parquet(base_uri, "items", columns=requested.columns)
        kept = base.filter(~pl.col("item_id").cast(pl.String).is_in(wanted))
        merged = pl.concat([kept, requested.select(kept.columns)], how="vertical_relaxed")
    key = hashlib.sha256("\n".join([base_uri or "", source_uri, *wanted]).encode()).hexdigest()[:16]
    return lake.write_parquet(merged, lake.uri("inputs", "on-demand", key, "items.parquet")), requested.height
