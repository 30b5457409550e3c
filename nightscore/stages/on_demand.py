"""Inputs of an on-demand run: given URIs, or the latest published run's, optionally narrowed to some item ids."""

from __future__ import annotations

import hashlib
import logging
from datetime import date, timedelta

import polars as pl

from nightscore.errors import NightscoreError, UsageError
from nightscore.run_context import RunContext, run_folder
from storage.lake import Lake
from storage.warehouse import Warehouse

log = logging.getLogger(__name__)


def latest_inputs(lake: Lake, warehouse: Warehouse) -> tuple[str, str]:
    """Return (items URI, interactions URI) the latest published run read; UsageError before any publication."""
    rows = warehouse.query("SELECT run_id, CAST(run_date AS VARCHAR) FROM latest_run").rows
    if not rows:
        raise UsageError("no published run to take inputs from: give items_uri and interactions_uri")
    saved = lake.read_json(f"{run_folder(lake.uri, rows[0][1], rows[0][0])}/run.json")
    if saved is None:
        raise UsageError(f"published run {rows[0][0]} has no saved context in the lake: give items_uri and interactions_uri")
    run = RunContext(**saved)
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


def _latest_or_none(lake: Lake, warehouse: Warehouse) -> tuple[str, str] | None:
    try:
        return latest_inputs(lake, warehouse)
    except NightscoreError:  # no warehouse or no published run yet
        return None


def resolve_inputs(lake: Lake, warehouse: Warehouse, items_uri: str | None, interactions_uri: str | None,
                   item_ids: list[str] | None) -> dict[str, object]:
    """Return the on-demand run's input URIs: given ones, else the latest published run's; item_ids merged into the catalog."""
    latest = _latest_or_none(lake, warehouse)
    if (not items_uri or not interactions_uri) and latest is None:
        raise UsageError("no published run to take inputs from: give items_uri and interactions_uri")
    source_items = items_uri or latest[0]  # type: ignore[index]
    interactions = interactions_uri or latest[1]  # type: ignore[index]
    if not item_ids:
        return {"items_uri": source_items, "interactions_uri": interactions, "items_requested": None}
    merged, matched = merge_items(lake, latest[0] if latest else None, source_items, item_ids)
    return {"items_uri": merged, "interactions_uri": interactions, "items_requested": len(item_ids), "items_matched": matched}


def dates_between(start: date, end: date) -> list[str]:
    """Return every YYYY-MM-DD from start to end, inclusive, oldest first."""
    return [(start + timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]
