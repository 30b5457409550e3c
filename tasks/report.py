"""Run report on the flow run's page: markdown summary with plots, stage timings, encode progress (artifacts)."""

from __future__ import annotations

import base64
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import deployment, flow_run

from nightscore import progress as local_progress
from nightscore.report import summary_markdown, timing_rows
from nightscore.stages import report as stage
from storage.resources import lake_for, warehouse_for
from tasks.common import context, settings


def artifact_key(kind: str) -> str:
    """Return the artifact key of this deployment (or flow) and kind, e.g. nightly-summary: versions group by it."""
    name = deployment.name or flow_run.flow_name or "nightscore"
    return "".join(c if c.isalnum() else "-" for c in f"{name}-{kind}".lower())


def start_progress(shards: int) -> str:
    """Return the id of this run's encode progress artifact, created at 0% (100% when nothing is left to encode)."""
    return str(create_progress_artifact(0.0 if shards else 100.0, key=artifact_key("encode-progress"),
                                        description=f"Encode: {shards} shard(s) to do"))


def report_progress(artifact_id: str | None, done: int, total: int) -> None:
    """Move the encode progress artifact (and a local progress bar, if one listens) to done/total."""
    local_progress.report("encode", done, total)
    if artifact_id:
        update_progress_artifact(artifact_id, 100.0 * done / max(total, 1), description=f"Encode: {done} of {total} shard(s) done")


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


@task(name="report-run", cache_policy=NO_CACHE)
def report_run(run: dict[str, str], summary: dict[str, Any]) -> dict[str, str]:
    """Produce the run's plots (report/*.png in the run folder) and its summary and timing artifacts; return the PNG URIs."""
    cfg, ctx = settings(), context(run)
    lake = lake_for(cfg)
    plots = stage.plots(lake, warehouse_for(cfg), ctx, cfg)
    uris = stage.save_plots(lake, ctx, plots)
    markdown = summary_markdown(summary, {"items_uri": ctx.items_uri, "interactions_uri": ctx.interactions_uri}, cfg,
                                {title: _data_uri(png) for title, png in plots.items()})
    create_markdown_artifact(markdown, key=artifact_key("summary"), description=f"Run {ctx.run_id}: summary and plots")
    create_table_artifact(timing_rows(summary.get("stage_seconds", {})), key=artifact_key("stage-timings"),
                          description=f"Run {ctx.run_id}: seconds per stage")
    return uris
