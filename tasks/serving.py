"""The `publish-serving` node: what the online ranker serves a published run with (serving/<run_id>/serving.json).

Inside the publication's transaction, after the warehouse commit: the run's ranker version, the feature set of its
cache entries, its trending items for users it has not seen, and its catalogue (``serving/<run_id>/items.parquet``,
the item ids of item_scores: the service drops events of any other item). ``serving/latest.json`` moves only when the run is
the newest published one (a backfilled older date never moves what a restarted service starts from).
"""

from __future__ import annotations

from dataclasses import replace

from prefect import task
from prefect.cache_policies import NO_CACHE

from core.errors import PublishError
from core.records import Published, RunRef, Stages
from storage.artifacts import publish_items, publish_serving
from storage.resources import lake_for, warehouse_for


@task(name="publish-serving", cache_policy=NO_CACHE)
def publish_serving_node(run: RunRef, stages: Stages, published: Published) -> Published:
    """Produce serving/<run_id>/serving.json from the candidates' serving.json; name the run latest when it is."""
    lake = lake_for(run.settings)
    serving = lake.read_json(run.path("serving.json"))
    if serving is None:
        raise PublishError(f"run {run.run_id} has no serving.json in its folder: its candidates were not built")
    item_ids = lake.read_parquet(stages.scored.uri, "item_scores", columns=["item_id"]).get_column("item_id")
    serving = {**serving, "items": publish_items(lake, run.run_id, item_ids)}
    latest = warehouse_for(run.settings).latest_published()
    publish_serving(lake, run.run_id, serving, latest is not None and latest.run_id == run.run_id)
    return replace(published, serving_features=len(serving.get("feature_names") or []))
