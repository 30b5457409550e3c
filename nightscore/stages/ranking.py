"""Stages of the online ranker's inputs: serving feature tables (each nightly run) and the ranker model (weekly)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import polars as pl

from models.ranker import embedding_retrieval, item_features, load_ranker, save_ranker, train_ranker, user_topic_affinity
from nightscore.run_context import RunContext
from nightscore.settings import Settings
from storage.lake import Lake

log = logging.getLogger(__name__)

MODEL_FILE, ITEM_FILE, USER_FILE = "ranker.pt", "item_features.parquet", "user_features.parquet"


def _write_local(frame: pl.DataFrame, path: Path) -> None:
    """Write a Parquet file atomically (temp name, then rename): the service reloads it while it runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    frame.write_parquet(tmp)
    os.replace(tmp, path)


def _run_frames(lake: Lake, run: RunContext) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    items = lake.read_parquet(run.path("valid/items.parquet"), "items")
    interactions = lake.read_parquet(run.path("valid/interactions.parquet"), "interactions")
    scores = lake.read_parquet(run.path("item_scores.parquet"), "item_scores", columns=["item_id", "topic", "topic_score", "embedding"])
    return items, interactions, scores


def publish_serving_features(lake: Lake, run: RunContext, settings: Settings) -> dict[str, object]:
    """Write the item features and user-topic affinity tables the ranker reads, as of the run's reference time."""
    items = lake.read_parquet(run.path("valid/items.parquet"), "items", columns=["item_id", "created_at"])
    interactions = lake.read_parquet(run.path("valid/interactions.parquet"), "interactions")
    scores = lake.read_parquet(run.path("item_scores.parquet"), "item_scores", columns=["item_id", "topic", "topic_score"])
    table = item_features(items, interactions, scores, run.reference_time)  # no texts, no embeddings
    affinity = user_topic_affinity(interactions, table.select("item_id", "topic"), run.reference_time)
    _write_local(table, settings.serving_root / ITEM_FILE)
    _write_local(affinity, settings.serving_root / USER_FILE)
    return {"items": table.height, "users": affinity.get_column("user_id").n_unique()}


def train(lake: Lake, run: RunContext, settings: Settings) -> dict[str, object]:
    """Train the ranker on a published run's inputs and scores (time split); save it versioned; return metrics."""
    started = time.perf_counter()
    items, interactions, scores = _run_frames(lake, run)
    retrieval = embedding_retrieval(scores.select("item_id", "embedding"), settings.event_weights, settings.recency_half_life_days)
    model = train_ranker(items, interactions, scores.select("item_id", "topic", "topic_score"), retrieval)
    path = save_ranker(model, settings.serving_root / MODEL_FILE)
    lake.write_json({"version": model.version, "metrics": model.metrics, "trained_on": run.run_id},
                    lake.uri("models", "ranker", f"{model.version}.json"))
    log.info("ranker %s trained on %s: %s", model.version, run.run_id, model.metrics)
    return {"version": model.version, "metrics": model.metrics, "path": str(path), "seconds": time.perf_counter() - started}


def current_ranker_version(settings: Settings) -> str | None:
    """Return the version of the ranker the service would load, or None if none was trained."""
    path = settings.serving_root / MODEL_FILE
    return load_ranker(path).version if path.exists() else None
