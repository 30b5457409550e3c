"""The `validate-outputs` node: item_scores and user_candidates against their row contracts and dataset suites.

Each output is read once: item_scores streams batch by batch into the pandera tally (row rules, embeddings
finite and unit-norm) and the dataset view the suites read; user_candidates is small and read whole.
"""

from __future__ import annotations

import time

import polars as pl
from prefect import task
from prefect.cache_policies import NO_CACHE

from core.records import Candidates, Checked, Plan, RunRef, Scored, Validated
from data_contracts.dataset_view import ViewBuilder, view_of
from data_contracts.outputs import ItemScoreTally, candidate_failures, enforce, owed_candidates
from storage.resources import lake_for, warehouse_for
from tasks.suites import gate

BATCH_ROWS = 32_768  # item_scores rows per batch (x 384 floats: ~50 MB)


@task(name="validate-outputs", cache_policy=NO_CACHE)
def validate_outputs(run: RunRef, plan: Plan, validated: Validated, scored: Scored, candidates: Candidates) -> Checked:
    """Check item_scores and user_candidates (row contracts, then dataset suites); raise ContractViolation if not."""
    started, lake, cfg = time.perf_counter(), lake_for(run.settings), run.settings
    tally, scores_view = ItemScoreTally(), ViewBuilder()
    for batch in lake.iter_frames(scored.uri, "item_scores", batch_size=BATCH_ROWS):  # embeddings never all at once
        tally.add(scores_view.add(batch), list(cfg.topics.labels))
    enforce(tally.failures(plan.items), "item_scores")
    frame = lake.read_parquet(candidates.uri, "user_candidates")
    interactions = lake.read_parquet(validated.interactions_uri, "interactions", columns=["user_id", "item_id"])
    catalogue, k = tally.item_ids(), cfg.candidates.top_k
    enforce(candidate_failures(frame, interactions, tally.rows, k, catalogue), "user_candidates")
    owed = owed_candidates(interactions, tally.rows, k, catalogue).filter(pl.col("want") > 0).height  # who can have any
    suites = gate(lake, warehouse_for(cfg), run, {"item_scores": scores_view.view(), "user_candidates": view_of(frame)}, owed)
    return Checked(tally.rows + frame.height, suites.data_docs, suites.suite_versions, time.perf_counter() - started)
