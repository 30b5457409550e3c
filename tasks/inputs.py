"""Tasks that open a run and bring its inputs in: run record, ingest snapshot, row contracts."""

from __future__ import annotations

from datetime import datetime, timezone

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from nightscore.errors import ContractViolation, UsageError
from nightscore.run_context import RunContext, make_run_id, parse_run_date
from nightscore.stages import inputs as stage
from nightscore.stages.publish import record_quarantine
from storage.resources import lake_for, warehouse_for
from tasks.common import IO_RETRIES, IO_RETRY_DELAYS, context, is_transient, settings


@task(name="start-run", cache_policy=NO_CACHE)
def start_run(flow_name: str, run_date: str | None, items_uri: str | None, interactions_uri: str | None) -> dict[str, str]:
    """Return the run's context (generating demo inputs when none are given) and record it as running."""
    cfg = settings()
    lake = lake_for(cfg)
    date = parse_run_date(run_date, datetime.now(timezone.utc).date())
    if not items_uri and not interactions_uri:
        items_uri, interactions_uri = stage.ensure_demo_inputs(lake)
    elif not (items_uri and interactions_uri):
        raise UsageError("give both --items and --interactions, or neither for the demo inputs")
    run_id = make_run_id(flow_name, date, str(flow_run.get_id() or ""))
    started_at = datetime.now(timezone.utc)
    run = RunContext(run_id, flow_name, date, items_uri, interactions_uri, lake.uri("runs", date, run_id), started_at.isoformat())
    warehouse_for(cfg).record_run({
        "run_id": run_id, "flow_run_id": str(flow_run.get_id()), "flow_name": flow_name, "run_date": run.date,
        "status": "running", "started_at": started_at,
    })
    return run.as_dict()


@task(name="ingest", cache_policy=NO_CACHE, retries=IO_RETRIES, retry_delay_seconds=IO_RETRY_DELAYS, retry_condition_fn=is_transient)
def ingest(run: dict[str, str]) -> dict[str, object]:
    """Produce the run's input snapshot (ingest/items.parquet, ingest/interactions.parquet)."""
    return stage.ingest(lake_for(settings()), context(run))


@task(name="validate-inputs", cache_policy=NO_CACHE)
def validate_inputs(run: dict[str, str], ingested: dict[str, object]) -> dict[str, object]:
    """Produce valid/items, valid/interactions and quarantine; record quarantine rows even when the run fails."""
    cfg, ctx = settings(), context(run)
    lake = lake_for(cfg)
    try:
        return stage.validate_inputs(lake, ctx, cfg)
    except ContractViolation:
        record_quarantine(lake, warehouse_for(cfg), ctx)
        raise
