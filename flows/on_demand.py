"""The on-demand flow: score given inputs (or some item ids) now; services trigger it through the Prefect API."""

from __future__ import annotations

from prefect import flow

from core.records import Published
from flows.params import OnDemandParams
from flows.pipeline import score_and_publish
from tasks.hooks import call_back, mark_failed, mark_interrupted
from tasks.on_demand import resolve_on_demand_inputs
from tasks.runner import SettingsTaskRunner
from tasks.start import start_run


@flow(
    name="on-demand",
    task_runner=SettingsTaskRunner(),
    on_completion=[call_back],
    on_failure=[mark_failed, call_back],
    on_crashed=[mark_interrupted, call_back],
    on_cancellation=[mark_interrupted, call_back],
)
def on_demand(params: OnDemandParams = OnDemandParams()) -> Published:
    """Score the requested items and publish them to the same tables and cache as a nightly run."""
    inputs = resolve_on_demand_inputs(params.items_uri, params.interactions_uri, params.item_ids)
    run = start_run("on-demand", params.run_date, inputs.items_uri, inputs.interactions_uri, None)
    return score_and_publish(run)
