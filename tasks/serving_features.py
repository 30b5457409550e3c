"""The `publish-serving-features` node: the ranker's feature tables of a published run, in the lake under its run id."""

from __future__ import annotations

from dataclasses import replace

from prefect import task
from prefect.cache_policies import NO_CACHE

from models.ranker import item_features, user_topic_affinity
from storage.artifacts import write_features
from storage.resources import lake_for
from tasks.results import Published, RunRef, Stages


@task(name="publish-serving-features", cache_policy=NO_CACHE)
def publish_serving_features(run: RunRef, stages: Stages, published: Published) -> Published:
    """Produce serving/<run_id>/item_features.parquet and user_features.parquet as of the run's reference time."""
    lake = lake_for(run.settings)
    items = lake.read_parquet(stages.validated.items_uri, "items", columns=["item_id", "created_at"])
    interactions = lake.read_parquet(stages.validated.interactions_uri, "interactions")
    scores = lake.read_parquet(stages.scored.uri, "item_scores", columns=["item_id", "topic", "topic_score"])
    table = item_features(items, interactions, scores, run.reference_time)  # no texts, no embeddings
    affinity = user_topic_affinity(interactions, table.select("item_id", "topic"), run.reference_time)
    write_features(lake, run.run_id, table, affinity)
    return replace(published, serving_features=table.height)
