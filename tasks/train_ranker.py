"""The nodes of the `train-ranker` flow: find the published run to train on, train and publish the ranker."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from models.ranker import embedding_retrieval, metadata_path, save_ranker, train_ranker
from nightscore.errors import UsageError
from nightscore.settings import current_settings
from storage.artifacts import publish_ranker, scratch_dir
from storage.resources import lake_for, warehouse_for
from tasks.results import RunRef
from tasks.start import run_ref, saved_run

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainedRanker:
    """A trained, versioned ranker in the lake and its offline metrics."""

    version: str
    uri: str
    trained_on: str
    metrics: dict[str, float]
    seconds: float


@task(name="published-run", cache_policy=NO_CACHE)
def published_run(run_id: str | None) -> RunRef:
    """Return the reference of a published run (the latest one when run_id is None)."""
    cfg = current_settings()
    lake, warehouse = lake_for(cfg), warehouse_for(cfg)
    if run_id:
        rows = warehouse.query("SELECT CAST(run_date AS VARCHAR) FROM scoring_runs WHERE status = 'published' AND run_id = ?",
                               [run_id]).rows
        found = (run_id, rows[0][0]) if rows else None
    else:
        latest = warehouse.latest_published()
        found = (latest.run_id, latest.run_date) if latest else None
    if found is None:
        raise UsageError(f"no published run {run_id or ''} to train the ranker on: run the nightly flow first")
    return run_ref(saved_run(lake, found[1], found[0]), cfg)


@task(name="train-ranker", cache_policy=NO_CACHE)
def train(run: RunRef) -> TrainedRanker:
    """Produce a versioned ranker in the lake (models/ranker/<version>/, made current) with its offline metrics."""
    started, cfg, lake = time.perf_counter(), run.settings, lake_for(run.settings)
    items = lake.read_parquet(run.path("valid/items.parquet"), "items")
    interactions = lake.read_parquet(run.path("valid/interactions.parquet"), "interactions")
    scores = lake.read_parquet(run.path("item_scores.parquet"), "item_scores", columns=["item_id", "topic", "topic_score", "embedding"])
    retrieval = embedding_retrieval(scores.select("item_id", "embedding"), cfg.event_weights, cfg.recency_half_life_days)
    model = train_ranker(items, interactions, scores.select("item_id", "topic", "topic_score"), retrieval)
    with scratch_dir("nightscore-ranker-") as local:
        path = save_ranker(model, Path(local) / "ranker.pt")
        uri = publish_ranker(lake, model.version, path, metadata_path(path))
    log.info("ranker %s trained on %s: %s", model.version, run.run_id, model.metrics)
    metrics = {k: float(v) for k, v in model.metrics.items() if isinstance(v, (int, float))}
    return TrainedRanker(model.version, uri, run.run_id, metrics, time.perf_counter() - started)
