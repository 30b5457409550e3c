"""The `start-run` node: resolve the run's settings once, open a new run or resume an unfinished one.

Resume rule (documented in the README): without --resume, a run for a run_date resumes the most recent
attempt of that flow and date if it did not publish (running, interrupted or failed) and read the same
input URIs; otherwise it starts a new run. ``--resume RUN_ID`` resumes that run.

Before it looks for a run to resume, the attempt takes the run date's lease (storage/leases.py): a second live
attempt of the date waits for it (bounded) and then fails naming the holder, so an attempt only ever resumes a
run whose own attempt has ended or died.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import fields, replace
from datetime import UTC, date, datetime

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from core.environment import apply_runtime_defaults
from core.errors import UsageError
from core.records import RunRef
from core.run_context import RunContext, make_run_id, parse_run_date, run_folder, run_inputs
from core.settings import Settings, current_settings
from core.stop import chain_stop_handler
from models.encoder.files import embedding_dim
from models.encoder.spec import EncoderSpec
from storage import leases
from storage.lake import Lake
from storage.publication import reconcile_cache
from storage.resources import cache_for, lake_for, warehouse_for
from storage.warehouse.base import Warehouse
from tasks.route import check_large_model

log = logging.getLogger(__name__)

RESUMABLE = ("running", "interrupted", "failed")


@task(name="start-run", cache_policy=NO_CACHE)
def start_run(
    flow_name: str, run_date: str | date | None, items_uri: str | None, interactions_uri: str | None, resume: str | None = None
) -> RunRef:
    """Return the run's reference (a resumed unfinished run, or a new one) and record it as running."""
    chain_stop_handler()  # runs in the flow's main thread: SIGTERM now also stops worker threads gracefully
    cfg = current_settings()
    apply_runtime_defaults(cfg)
    inputs = None if resume else run_inputs(cfg, items_uri, interactions_uri)  # refused before any work
    lake, dim = lake_for(cfg), embedding_dim(EncoderSpec.from_settings(cfg))
    check_large_model(cfg)  # a configured large model that is not there fails the run now, not after encoding
    warehouse = warehouse_for(cfg, dim)
    with cache_for(cfg) as cache:
        reconcile_cache(warehouse, cache)
    day = target_date(warehouse, run_date, resume)
    token = str(flow_run.get_id() or uuid.uuid4())
    lease = leases.hold(
        warehouse, warehouse_for(cfg), day, token, cfg.ops.run_lease_ttl_s, cfg.ops.run_lease_wait_s, say=get_run_logger().warning
    )
    run = _open(lake, warehouse, flow_name, day, inputs, resume)
    lease.attach(run.run_id)
    STARTED[token] = run.run_id
    warehouse.record_run(
        {
            "run_id": run.run_id,
            "flow_run_id": str(flow_run.get_id()),
            "flow_name": flow_name,
            "run_date": run.date,
            "status": "running",
            "started_at": datetime.fromisoformat(run.started_at),
        }
    )
    return run_ref(run, cfg, dim)


# Flow run id -> run id of the runs this process started: how the CLI names the run to resume after SIGTERM.
STARTED: dict[str, str] = {}


def last_started() -> str | None:
    """Return the run id this process started last (None before any)."""
    return next(reversed(STARTED.values()), None)


def target_date(warehouse: Warehouse, run_date: str | date | None, resume: str | None) -> str:
    """Return the run date an attempt works on: --resume's run's, else the given date or today (UTC)."""
    if not resume:
        return parse_run_date(run_date, datetime.now(UTC).date())
    attempt = warehouse.run_attempt(resume)
    if attempt is None:
        raise UsageError(f"no run {resume} to resume")
    return attempt.run_date


def _open(
    lake: Lake,
    warehouse: Warehouse,
    flow_name: str,
    day: str,
    inputs: tuple[str, str] | None,
    resume: str | None,
) -> RunContext:
    """Return the context of the run to do: the one resumed, the unfinished one of the same inputs, or a new one."""
    if resume or inputs is None:
        return _resumed(load_run(lake, warehouse, resume or ""))
    items, interactions = inputs
    unfinished = find_resumable(lake, warehouse, flow_name, day, items, interactions)
    if unfinished is not None:
        return _resumed(unfinished)
    return new_run(lake, flow_name, day, items, interactions, str(flow_run.get_id() or uuid.uuid4()))


def _resumed(run: RunContext) -> RunContext:
    """Return a resumed run's context with this attempt's start time."""
    get_run_logger().info("resuming run %s: finished shards will be reused", run.run_id)
    return replace(run, started_at=datetime.now(UTC).isoformat())


def find_resumable(
    lake: Lake, warehouse: Warehouse, flow_name: str, run_date: str, items_uri: str, interactions_uri: str
) -> RunContext | None:
    """Return the unfinished run of this flow, date and inputs, or None."""
    latest = warehouse.latest_attempt(flow_name, run_date)
    if latest is None or latest.status not in RESUMABLE:
        return None
    saved = lake.read_json(f"{run_folder(lake.uri, run_date, latest.run_id)}/run.json")
    if saved is None or (saved["items_uri"], saved["interactions_uri"]) != (items_uri, interactions_uri):
        return None
    return RunContext(**saved)


def load_run(lake: Lake, warehouse: Warehouse, run_id: str) -> RunContext:
    """Return the saved context of run_id for --resume; UsageError if it does not exist or already published."""
    attempt = warehouse.run_attempt(run_id)
    if attempt is None:
        raise UsageError(f"no run {run_id} to resume")
    if attempt.status not in RESUMABLE:
        raise UsageError(f"run {run_id} is {attempt.status}: only running, interrupted or failed runs resume")
    return saved_run(lake, attempt.run_date, run_id)


def saved_run(lake: Lake, run_date: str, run_id: str) -> RunContext:
    """Return a run's context from its run.json in the lake; UsageError when it has none."""
    saved = lake.read_json(f"{run_folder(lake.uri, run_date, run_id)}/run.json")
    if saved is None:
        raise UsageError(f"run {run_id} has no saved context in the lake")
    return RunContext(**saved)


def new_run(lake: Lake, flow_name: str, run_date: str, items_uri: str, interactions_uri: str, unique: str) -> RunContext:
    """Return a fresh run context and save it as run.json in its folder."""
    run_id = make_run_id(flow_name, run_date, unique)
    run = RunContext(
        run_id,
        flow_name,
        run_date,
        items_uri,
        interactions_uri,
        run_folder(lake.uri, run_date, run_id),
        datetime.now(UTC).isoformat(),
    )
    lake.write_json(run.as_dict(), run.path("run.json"))
    return run


def run_ref(run: RunContext, settings: Settings, dim: int | None = None) -> RunRef:
    """Return the reference of a run (its identity, as run.json holds it) with the settings it runs under."""
    width = dim if dim is not None else embedding_dim(EncoderSpec.from_settings(settings))
    return RunRef(**{f.name: getattr(run, f.name) for f in fields(RunContext)}, settings=settings, embedding_dim=width)
