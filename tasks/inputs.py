"""Tasks that open a run and bring its inputs in: run record, ingest snapshot, row contracts."""

from __future__ import annotations

from datetime import date, datetime, timezone

import uuid
from dataclasses import replace

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from nightscore.errors import ContractViolation, UsageError
from nightscore.run_context import RunContext, parse_run_date
from nightscore.stages import inputs as stage
from nightscore.stages import contracts, on_demand, runs
from nightscore.stop import chain_stop_handler
from storage.lake import Lake
from nightscore.stages.publish import record_quarantine
from storage.resources import cache_for, lake_for, warehouse_for
from tasks.common import IO_RETRIES, IO_RETRY_DELAYS, context, is_transient, settings


@task(name="start-run", cache_policy=NO_CACHE)
def start_run(
    flow_name: str, run_date: str | date | None, items_uri: str | None, interactions_uri: str | None, resume: str | None = None
) -> dict[str, str]:
    """Return the run's context (a resumed unfinished run, or a new one) and record it as running."""
    chain_stop_handler()  # runs in the flow's main thread: SIGTERM now also stops worker threads gracefully
    cfg = settings()
    lake, warehouse = lake_for(cfg), warehouse_for(cfg)
    with cache_for(cfg) as cache:
        runs.reconcile_cache(warehouse, cache)
    if resume:
        run: RunContext | None = runs.load_run(lake, warehouse, resume)
    else:
        date = parse_run_date(run_date, datetime.now(timezone.utc).date())
        items_uri, interactions_uri = _inputs(lake, items_uri, interactions_uri)
        run = runs.find_resumable(lake, warehouse, flow_name, date, items_uri, interactions_uri)
    if run is not None:
        get_run_logger().info("resuming run %s: finished shards will be reused", run.run_id)
        run = replace(run, started_at=datetime.now(timezone.utc).isoformat())  # this attempt's start
    else:
        run = runs.new_run(lake, flow_name, date, items_uri, interactions_uri, str(flow_run.get_id() or uuid.uuid4()))
    warehouse.record_run({"run_id": run.run_id, "flow_run_id": str(flow_run.get_id()), "flow_name": flow_name,
                          "run_date": run.date, "status": "running", "started_at": datetime.fromisoformat(run.started_at)})
    return run.as_dict()


def _inputs(lake: Lake, items_uri: str | None, interactions_uri: str | None) -> tuple[str, str]:
    if not items_uri and not interactions_uri:
        return stage.ensure_demo_inputs(lake)
    if not (items_uri and interactions_uri):
        raise UsageError("give both --items and --interactions, or neither for the demo inputs")
    return items_uri, interactions_uri


@task(name="ingest", cache_policy=NO_CACHE, retries=IO_RETRIES, retry_delay_seconds=IO_RETRY_DELAYS, retry_condition_fn=is_transient)
def ingest(run: dict[str, str]) -> dict[str, object]:
    """Produce the run's input snapshot (ingest/items.parquet, ingest/interactions.parquet)."""
    cfg = settings()
    return stage.ingest(lake_for(cfg), context(run), cfg)


@task(name="validate-inputs", cache_policy=NO_CACHE)
def validate_inputs(run: dict[str, str], ingested: dict[str, object]) -> dict[str, object]:
    """Produce valid/items, valid/interactions and quarantine; record quarantine rows even when the run fails."""
    cfg, ctx = settings(), context(run)
    lake, warehouse = lake_for(cfg), warehouse_for(cfg)
    try:
        counts = stage.validate_inputs(lake, ctx, cfg)
    except ContractViolation:
        record_quarantine(lake, warehouse, ctx)
        raise
    return {**counts, "suites": contracts.gate(lake, warehouse, ctx, cfg, ["items", "interactions"])}


@task(name="resolve-inputs", cache_policy=NO_CACHE)
def resolve_on_demand_inputs(items_uri: str | None, interactions_uri: str | None, item_ids: list[str] | None) -> dict[str, object]:
    """Return an on-demand run's input URIs (the latest published run's by default), narrowed to item_ids if given."""
    cfg = settings()
    return on_demand.resolve_inputs(lake_for(cfg), warehouse_for(cfg), items_uri, interactions_uri, item_ids)


@task(name="plan-backfill", cache_policy=NO_CACHE)
def backfill_dates(start: date, end: date) -> list[str]:
    """Return the run dates of a backfill, oldest first."""
    return on_demand.dates_between(start, end)
