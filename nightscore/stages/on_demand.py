"""Inputs of an on-demand run: given URIs, or the latest published run's, optionally narrowed to some item ids."""

from __future__ import annotations

import hashlib
import logging
from datetime import date, timedelta

import polars as pl

from nightscore.errors import UsageError
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


def narrow_to_items(lake: Lake, items_uri: str, interactions_uri: str, item_ids: list[str]) -> tuple[str, str, int]:
    """Write the items (and their interactions) of item_ids to the lake; return both URIs and how many ids matched."""
    wanted = sorted({i.strip() for i in item_ids if i.strip()})
    items = lake.read_parquet(items_uri, "items").filter(pl.col("item_id").cast(pl.String).is_in(wanted))
    if items.height == 0:
        raise UsageError(f"none of the {len(wanted)} item ids is in {items_uri}")
    if items.height < len(wanted):
        log.warning("%d of %d requested item ids are not in %s", len(wanted) - items.height, len(wanted), items_uri)
    interactions = lake.read_parquet(interactions_uri, "interactions").filter(
        pl.col("item_id").cast(pl.String).is_in(wanted))
    key = hashlib.sha256("\n".join([items_uri, interactions_uri, *wanted]).encode()).hexdigest()[:16]
    folder = lake.uri("inputs", "on-demand", key)
    return (lake.write_parquet(items, f"{folder}/items.parquet"),
            lake.write_parquet(interactions, f"{folder}/interactions.parquet"), items.height)


def resolve_inputs(lake: Lake, warehouse: Warehouse, items_uri: str | None, interactions_uri: str | None,
                   item_ids: list[str] | None) -> dict[str, object]:
    """Return the on-demand run's input URIs: given ones, else the latest published run's; narrowed to item_ids."""
    if not items_uri or not interactions_uri:
        latest_items, latest_interactions = latest_inputs(lake, warehouse)
        items_uri, interactions_uri = items_uri or latest_items, interactions_uri or latest_interactions
    if not item_ids:
        return {"items_uri": items_uri, "interactions_uri": interactions_uri, "items_requested": None}
    items_uri, interactions_uri, matched = narrow_to_items(lake, items_uri, interactions_uri, item_ids)
    return {"items_uri": items_uri, "interactions_uri": interactions_uri, "items_requested": len(item_ids),
            "items_matched": matched}


def dates_between(start: date, end: date) -> list[str]:
    """Return every YYYY-MM-DD from start to end, inclusive, oldest first."""
    return [(start + timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]
