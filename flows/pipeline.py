"""The scoring pipeline every scoring flow shares: inputs -> contracts -> shards -> encoder -> topics -> candidates -> publish."""

from __future__ import annotations

from typing import Any

from prefect import unmapped
from prefect.transactions import transaction

from tasks.encode import encode_shard, merge_encode_stats, plan_shards
from tasks.inputs import ingest, validate_inputs
from tasks.publish import publish, publish_serving_features, stage_cache
from tasks.report import report_run
from tasks.scoring import build_candidates, score_items, validate_outputs


def score_and_publish(run: dict[str, str]) -> dict[str, Any]:
    """Wire the run's tasks from ingest to publish and the run report; return the published summary."""
    ingested = ingest(run)
    validated = validate_inputs(run, ingested)
    planned = plan_shards(run, validated)
    shards = encode_shard.map(unmapped(run), planned["shards"], unmapped(planned["progress"])).result()
    encoded = merge_encode_stats(shards, planned)
    scored = score_items(run, encoded, shards)
    candidates = build_candidates(run, scored)
    checked = validate_outputs(run, planned, candidates, validated)
    stages = {"ingest": ingested, "validate": validated, "plan": planned, "encode": encoded,
              "score": scored, "candidates": candidates, "validate_outputs": checked}
    with transaction():  # cache and warehouse publish together: a failing step rolls the other back (on_rollback hooks)
        staged = stage_cache(run, checked)
        published = publish(run, stages, staged)
        summary = publish_serving_features(run, published)
    report_run(run, summary)
    return summary
