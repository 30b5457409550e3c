"""Tasks of the online ranker: train it on a published run."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from nightscore.errors import UsageError
from nightscore.run_context import RunContext, run_folder
from nightscore.stages import ranking as stage
from storage.resources import lake_for, warehouse_for
from tasks.common import settings


@task(name="published-run", cache_policy=NO_CACHE)
def published_run(run_id: str | None) -> dict[str, str]:
    """Return the context of a published run (the latest one when run_id is None)."""
    cfg = settings()
    lake, warehouse = lake_for(cfg), warehouse_for(cfg)
    sql = "SELECT run_id, CAST(run_date AS VARCHAR) FROM scoring_runs WHERE status = 'published'"
    rows = warehouse.query(sql + " AND run_id = ?", [run_id]).rows if run_id else warehouse.query(
        "SELECT run_id, CAST(run_date AS VARCHAR) FROM latest_run").rows
    if not rows:
        raise UsageError(f"no published run {run_id or ''} to train the ranker on: run the nightly flow first")
    saved = lake.read_json(f"{run_folder(lake.uri, rows[0][1], rows[0][0])}/run.json")
    if saved is None:
        raise UsageError(f"run {rows[0][0]} has no saved context in the lake")
    return RunContext(**saved).as_dict()


@task(name="train-ranker", cache_policy=NO_CACHE)
def train(run: dict[str, str]) -> dict[str, object]:
    """Produce a versioned ranker model (serving folder + lake record) with its offline metrics."""
    cfg = settings()
    return stage.train(lake_for(cfg), RunContext(**run), cfg)
