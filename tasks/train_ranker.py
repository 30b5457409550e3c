"""The nodes of the `train-ranker` flow: retrain a published run's stage-two ranker with the current settings and serve it."""

from __future__ import annotations

import logging
import time

import polars as pl
from prefect import task
from prefect.cache_policies import NO_CACHE

from core.errors import ContractViolation, UsageError
from core.records import RunRef, TrainedRanker, stage_two_loss
from core.settings import current_settings
from models.recommender.candidate_stage import evaluate, tune
from models.recommender.evaluation import time_split
from models.recommender.ranker_models import scorer_to_bytes
from models.recommender.sources.base import encode_run
from storage.artifacts import publish_scorer, ranker_folder, read_serving, rebind_ranker
from storage.candidate_payload import feature_set_id
from storage.resources import lake_for, warehouse_for
from tasks.candidates import candidate_config, catalogue_items, item_chunks, method_quality
from tasks.start import run_ref, saved_run

log = logging.getLogger(__name__)


@task(name="published-run", cache_policy=NO_CACHE)
def published_run(run_id: str | None) -> RunRef:
    """Return the reference of a published run (the latest one when run_id is None)."""
    cfg = current_settings()
    lake, warehouse = lake_for(cfg), warehouse_for(cfg)
    found = warehouse.published_run(run_id) if run_id else warehouse.latest_published()
    if found is None:
        raise UsageError(f"no published run{f' {run_id}' if run_id else ''} to train the ranker on: run the nightly flow first")
    return run_ref(saved_run(lake, found.run_date, found.run_id), cfg)


@task(name="train-ranker", cache_policy=NO_CACHE)
def train(run: RunRef) -> TrainedRanker:
    """Produce a new stage-two ranker for a published run (tuned and evaluated as a nightly run does) and serve it.

    The run's cache entries keep their feature rows: the new ranker must read the same feature set, else the run is
    left as it was and UsageError says to run the nightly flow instead.
    """
    started, cfg, lake = time.perf_counter(), run.settings, lake_for(run.settings)
    serving = read_serving(lake, run.run_id)
    if serving is None:
        raise UsageError(f"run {run.run_id} has no serving.json: only runs published by this release can be retrained")
    items = catalogue_items(lake, run.path("valid/items.parquet"), run.path("item_scores.parquet"))
    interactions = lake.read_parquet(
        run.path("valid/interactions.parquet"), "interactions", columns=["user_id", "item_id", "event", "ts"]
    )
    config = candidate_config(cfg)
    catalogue, encoded = encode_run(items, interactions)
    chunks = item_chunks(lake, run.path("item_scores.parquet"), items.height)
    evaluation = time_split(encoded, config.holdout_share)
    tuned = tune(catalogue, encoded, chunks, config, evaluation)
    report = evaluate(catalogue, encoded, chunks, config, evaluation, tuned)
    if report.scorer is None:
        raise _not_served(run.run_id, report.metrics)
    if feature_set_id(report.scorer.feature_names) != serving.get("feature_set"):
        raise UsageError(f"the settings now give run {run.run_id}'s candidates another feature set: run the nightly flow")
    version = publish_scorer(lake, *scorer_to_bytes(report.scorer, {"trained_on": run.run_id}))
    rebind_ranker(lake, run.run_id, version, report.chosen)
    metrics = {
        f"{row['method']}.{row['metric']}": float(row["value"])
        for row in report.metrics.iter_rows(named=True)
        if row["method"].startswith("ranked") and row["value"] == row["value"]
    }
    log.info("ranker %s (%s) trained on %s: %s", version, report.chosen, run.run_id, metrics)
    previous = serving.get("ranker_version")
    return TrainedRanker(version, ranker_folder(lake, version), run.run_id, metrics, time.perf_counter() - started, previous)


def _not_served(run_id: str, metrics: pl.DataFrame) -> UsageError | ContractViolation:
    """Return why the evaluation kept no ranker: no labelled row to learn from, or both kinds lost to the fused order."""
    loss = stage_two_loss(method_quality(metrics))
    if loss is None:
        return UsageError(f"run {run_id}: no held-out interaction to train a ranker on")
    return ContractViolation(
        f"run {run_id}: the retrained ranker ranks held-out users worse than the fused order (NDCG@10 {loss[0]:.4f}"
        f" against {loss[1]:.4f}): the run keeps the ranker it serves"
    )
