"""Opening a run: a new run id, or the unfinished run of the same date and inputs to resume.

Resume rule (documented in the README): without --resume, a nightly run for a run_date resumes the
most recent attempt of that flow and date if it did not publish (running, interrupted or failed)
and read the same input URIs; otherwise it starts a new run. ``--resume RUN_ID`` resumes that run.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from nightscore.errors import NightscoreError, UsageError
from nightscore.run_context import RunContext, make_run_id, run_folder
from storage.cache import CandidateCache
from storage.lake import Lake
from storage.warehouse import Warehouse

log = logging.getLogger(__name__)

RESUMABLE = ("running", "interrupted", "failed")


def _latest_attempt(warehouse: Warehouse, flow_name: str, run_date: str) -> tuple[str, str] | None:
    try:
        rows = warehouse.query(
            "SELECT run_id, status FROM scoring_runs WHERE flow_name = ? AND CAST(run_date AS VARCHAR) = ? "
            "ORDER BY started_at DESC LIMIT 1", [flow_name, run_date]).rows
    except NightscoreError:
        return None  # no warehouse yet
    return (rows[0][0], rows[0][1]) if rows else None


def find_resumable(lake: Lake, warehouse: Warehouse, flow_name: str, run_date: str, items_uri: str, interactions_uri: str) -> RunContext | None:
    """Return the unfinished run of this flow, date and inputs, or None."""
    latest = _latest_attempt(warehouse, flow_name, run_date)
    if latest is None or latest[1] not in RESUMABLE:
        return None
    saved = lake.read_json(f"{run_folder(lake.uri, run_date, latest[0])}/run.json")
    if saved is None or (saved["items_uri"], saved["interactions_uri"]) != (items_uri, interactions_uri):
        return None
    return RunContext(**saved)


def load_run(lake: Lake, warehouse: Warehouse, run_id: str) -> RunContext:
    """Return the saved context of run_id for --resume; UsageError if it does not exist or already published."""
    rows = warehouse.query("SELECT CAST(run_date AS VARCHAR), status FROM scoring_runs WHERE run_id = ?", [run_id]).rows
    if not rows:
        raise UsageError(f"no run {run_id} to resume")
    if rows[0][1] not in RESUMABLE:
        raise UsageError(f"run {run_id} is {rows[0][1]}: only running, interrupted or failed runs resume")
    saved = lake.read_json(f"{run_folder(lake.uri, rows[0][0], run_id)}/run.json")
    if saved is None:
        raise UsageError(f"run {run_id} has no saved context in the lake: it cannot resume")
    return RunContext(**saved)


def new_run(lake: Lake, flow_name: str, run_date: str, items_uri: str, interactions_uri: str, unique: str) -> RunContext:
    """Return a fresh run context and save it as run.json in its folder."""
    run_id = make_run_id(flow_name, run_date, unique)
    run = RunContext(run_id, flow_name, run_date, items_uri, interactions_uri, run_folder(lake.uri, run_date, run_id),
                     datetime.now(timezone.utc).isoformat())
    lake.write_json(run.as_dict(), run.path("run.json"))
    return run


def latest_published_folder(lake: Lake, warehouse: Warehouse) -> tuple[str, str] | None:
    """Return (run_id, lake folder) of the latest published run, or None before the first publication."""
    try:
        latest = warehouse.query("SELECT run_id, CAST(run_date AS VARCHAR) FROM latest_run").rows
    except NightscoreError:
        return None  # no warehouse yet
    return (latest[0][0], run_folder(lake.uri, latest[0][1], latest[0][0])) if latest else None


def reconcile_cache(warehouse: Warehouse, cache: CandidateCache) -> str | None:
    """Point the cache at the warehouse's latest published run when a crash left them apart; return the fix."""
    try:
        latest = warehouse.query("SELECT run_id FROM latest_run").rows
    except NightscoreError:
        return None
    if not latest or cache.current() == latest[0][0] or latest[0][0] not in cache.versions():
        return None
    log.warning("cache pointer %s differs from the warehouse's latest run %s: switching back", cache.current(), latest[0][0])
    cache.switch_current(latest[0][0])
    return latest[0][0]
