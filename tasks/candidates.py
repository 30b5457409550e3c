"""The `build-candidates` node: per-user candidates (user_candidates.parquet) and their quality on held-out interactions."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator

import numpy as np
import polars as pl
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from models.retrieval import ITEM_BLOCK, Interactions, ItemChunks, candidates_table, interaction_weight_expr, top_k_items, user_vectors
from models.retrieval_quality import RetrievalQuality, evaluate_retrieval, run_weights
from storage.lake import Lake
from storage.resources import lake_for
from tasks.results import Candidates, RunRef, Scored, Validated

log = logging.getLogger(__name__)


@task(name="build-candidates", cache_policy=NO_CACHE)
def build_candidates(run: RunRef, validated: Validated, scored: Scored) -> Candidates:
    """Produce user_candidates.parquet: exact top-K unseen items per user by cosine to their user vector.

    Item embeddings stream in blocks (never all at once); only item ids are held whole.
    """
    started, lake, cfg = time.perf_counter(), lake_for(run.settings), run.settings
    index = lake.read_parquet(scored.uri, "item_scores", columns=["item_id"]).with_row_index("item_row")
    interactions = lake.read_parquet(validated.interactions_uri, "interactions")
    users = interactions.select("user_id").unique().sort("user_id").with_row_index("user_row")
    joined = (interactions.join(index, on="item_id").join(users, on="user_id")
              .with_columns(interaction_weight_expr(run.reference_time, cfg.event_weights, cfg.recency_half_life_days)))
    inter = Interactions(joined["user_row"].to_numpy(), joined["item_row"].to_numpy(), joined["weight"].to_numpy(), users.height)
    device = torch.device("cuda" if cfg.device != "cpu" and torch.cuda.is_available() else "cpu")
    items = item_chunks(lake, scored.uri, index.height)
    rows, scores = top_k_items(user_vectors(items, inter).to(device), items, inter, cfg.top_k, cfg.user_chunk)
    frame = candidates_frame(run, users.get_column("user_id"), index.get_column("item_id"), rows, scores)
    lake.write_parquet(frame, run.path("user_candidates.parquet"))
    quality = retrieval_quality(index.get_column("item_id"), items, interactions, run)
    return Candidates(run.path("user_candidates.parquet"), frame.get_column("user_id").n_unique(), frame.height,
                      _finite(quality.recall_at_k), _finite(quality.ndcg_at_10), _finite(quality.popularity_recall_at_k),
                      _finite(quality.popularity_ndcg_at_10), quality.users_evaluated, time.perf_counter() - started)


def item_chunks(lake: Lake, uri: str, n_items: int) -> ItemChunks:
    """Return item_scores' embeddings as blocks of ITEM_BLOCK rows, read from the lake on each pass."""
    def read() -> Iterator[np.ndarray]:
        for frame in lake.iter_frames(uri, "item_scores", columns=["embedding"], batch_size=ITEM_BLOCK):
            yield frame.get_column("embedding").to_numpy()

    return ItemChunks(n_items, read)


def retrieval_quality(item_ids: pl.Series, items: ItemChunks, interactions: pl.DataFrame, run: RunRef) -> RetrievalQuality:
    """Return recall@K and NDCG@10 of retrieval on each user's last 2 interactions held out, vs popularity."""
    cfg = run.settings
    weights = run_weights(run.reference_time, cfg.event_weights, cfg.recency_half_life_days)
    q = evaluate_retrieval(item_ids.to_list(), items, interactions, weights, k=cfg.top_k, holdout=2, chunk=cfg.user_chunk)
    log.info("retrieval on held-out interactions (%d users): recall@%d %.3f vs popularity %.3f; NDCG@10 %.3f vs %.3f",
             q.users_evaluated, q.k, q.recall_at_k, q.popularity_recall_at_k, q.ndcg_at_10, q.popularity_ndcg_at_10)
    return q


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else float(value)  # NaN (no user to evaluate) is stored as NULL


def candidates_frame(run: RunRef, user_ids: pl.Series, item_ids: pl.Series, rows: np.ndarray, scores: np.ndarray) -> pl.DataFrame:
    """Return the long candidates table (run_id, run_date, user_id, rank, item_id, score), rank from 1."""
    table = candidates_table(user_ids.to_numpy(), item_ids.to_numpy(), rows, scores)
    return table.select(pl.lit(run.run_id).alias("run_id"), pl.lit(run.date).alias("run_date"), pl.all())
