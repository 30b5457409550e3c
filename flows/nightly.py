"""The nightly scoring flow: one night's inputs scored and published (the `nightly` deployment runs it on a cron)."""

from __future__ import annotations

from prefect import flow

from core.records import Published
from flows.params import NightlyParams
from flows.pipeline import score_and_publish
from tasks.hooks import call_back, mark_failed, mark_interrupted
from tasks.runner import SettingsTaskRunner
from tasks.start import start_run


# The task runner follows NIGHTSCORE_TASK_RUNNER when a run starts (tasks/runner.py): local runs one shard at
# a time in this process (the encoder already uses every core or the GPU); ray sends the encode shards to Ray.
@flow(
    name="nightly",
    task_runner=SettingsTaskRunner(),
    on_completion=[call_back],
    on_failure=[mark_failed, call_back],
    on_crashed=[mark_interrupted, call_back],
    on_cancellation=[mark_interrupted, call_back],
)
def nightly(params: NightlyParams = NightlyParams()) -> Published:
    """Score one night's inputs and publish item_scores, user_candidates and the candidate cache."""
    run = start_run("nightly", params.run_date, params.items_uri, params.interactions_uri, params.resume)
    return score_and_publish(run)
