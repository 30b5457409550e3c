"""The nightly scoring flow: inputs -> contracts -> shards -> encoder -> topics -> candidates -> publish."""

from __future__ import annotations

from typing import Any

from prefect import flow, unmapped

from tasks.encode import encode_shard, merge_encode_stats, plan_shards
from tasks.hooks import mark_failed, mark_interrupted
from tasks.inputs import ingest, start_run, validate_inputs
from tasks.publish import publish
from tasks.runner import SettingsTaskRunner
from tasks.scoring import build_candidates, score_items, validate_outputs


# The task runner follows NIGHTSCORE_TASK_RUNNER when a run starts (tasks/runner.py): local runs one shard at
# a time in this process (the encoder already uses every core or the GPU); ray sends the encode shards to Ray.
@flow(name="nightly", task_runner=SettingsTaskRunner(), on_failure=[mark_failed], on_crashed=[mark_interrupted], on_cancellation=[mark_interrupted])
def nightly(
    run_date: str | None = None, items_uri: str | None = None, interactions_uri: str | None = None, resume: str | None = None
) -> dict[str, Any]:
    """Score one night's inputs and publish item_scores, user_candidates and the candidate cache."""
    run = start_run("nightly", run_date, items_uri, interactions_uri, resume)
    ingested = ingest(run)
    validated = validate_inputs(run, ingested)
    planned = plan_shards(run, validated)
    shards = encode_shard.map(unmapped(run), planned["shards"]).result()
    encoded = merge_encode_stats(shards, planned)
    scored = score_items(run, encoded, shards)
    candidates = build_candidates(run, scored)
    checked = validate_outputs(run, planned, candidates, validated)
    stages = {"ingest": ingested, "validate": validated, "plan": planned, "encode": encoded,
              "score": scored, "candidates": candidates, "validate_outputs": checked}
    return publish(run, stages, checked)
