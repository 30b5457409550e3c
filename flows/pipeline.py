"""The scoring pipeline every scoring flow shares: inputs -> contracts -> shards -> encoder -> cascade -> topics -> candidates."""

from __future__ import annotations

from prefect import unmapped
from prefect.transactions import transaction

from core.records import Published, RunRef, Stages
from tasks.candidates import build_candidates
from tasks.encode import encode_shard, merge_encode_stats
from tasks.ingest import ingest
from tasks.plan import plan_shards
from tasks.publish import publish, stage_cache
from tasks.report import report_run
from tasks.route import route_topics
from tasks.score import score_items
from tasks.serving import publish_serving_node
from tasks.validate import validate_inputs
from tasks.validate_outputs import validate_outputs


def score_and_publish(run: RunRef) -> Published:
    """Wire the run's tasks from ingest to publish and the run report; return the publication."""
    ingested = ingest(run)
    validated = validate_inputs(run, ingested)
    plan = plan_shards(run, validated)
    shards = encode_shard.map(unmapped(run), unmapped(plan), list(plan.shards)).result()
    encoded = merge_encode_stats(shards, plan)
    routed = route_topics(run, plan, shards)
    scored = score_items(run, plan, shards, routed)
    candidates = build_candidates(run, validated, scored)
    checked = validate_outputs(run, plan, validated, scored, candidates)
    stages = Stages(ingested, validated, plan, encoded, scored, candidates, checked, routed)
    with transaction():  # cache and warehouse publish together: a failing step rolls the other back (on_rollback hooks)
        staged = stage_cache(run, candidates, checked)
        published = publish(run, stages, staged)
        published = publish_serving_node(run, stages, published)
    report_run(run, stages, published)
    return published
