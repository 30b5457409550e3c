"""Stages after the model: topic scores per item, user vectors and top-K candidates per user."""

from __future__ import annotations

import logging
import time

import numpy as np
import polars as pl
import torch

from models.encoder import get_encoder
from models.engine import encode_texts
from models.retrieval import Interactions, candidates_table, interaction_weight_expr, top_k_items, user_vectors
from models.retrieval_quality import evaluate_retrieval, run_weights
from models.topics import topic_scores
from nightscore.run_context import RunContext
from nightscore.settings import Settings
from nightscore.stages.encode import encoder_spec
from storage.lake import Lake

log = logging.getLogger(__name__)


def score_items(lake: Lake, run: RunContext, settings: Settings, shard_uris: list[str]) -> dict[str, object]:
    """Join shard embeddings with the plan and add zero-shot topics; produces ``item_scores.parquet``."""
    started = time.perf_counter()
    encoder = get_encoder(encoder_spec(settings))
    parts = [lake.read_parquet(uri, "shard") for uri in sorted(shard_uris)]
    vectors = pl.concat([*parts, lake.read_parquet(run.path("reused.parquet"), "reused")])
    plan = lake.read_parquet(run.path("plan.parquet"), "plan", columns=["item_id", "content_hash", "token_count"])
    scored = plan.join(vectors, on="item_id", how="inner", validate="1:1").sort("item_id")
    names = list(settings.topic_labels)
    labels, _ = encode_texts(encoder, [settings.topic_labels[n] for n in names])
    best, prob = topic_scores(scored.get_column("embedding").to_numpy(), labels, settings.topic_temperature)
    frame = scored.select(
        pl.lit(run.run_id).alias("run_id"), pl.lit(run.date).alias("run_date"), "item_id",
        pl.lit(encoder.version).alias("model_version"),
        pl.Series("topic", np.asarray(names)[best], dtype=pl.String), pl.Series("topic_score", prob),
        "token_count", "content_hash", "embedding",
    )
    lake.write_parquet(frame, run.path("item_scores.parquet"))
    return {"rows_scored": frame.height, "missing": plan.height - frame.height, "seconds": time.perf_counter() - started}


def build_candidates(lake: Lake, run: RunContext, settings: Settings) -> dict[str, object]:
    """Compute user vectors and exact top-K unseen items per user; produces ``user_candidates.parquet``."""
    started = time.perf_counter()
    items = lake.read_parquet(run.path("item_scores.parquet"), "item_scores", columns=["item_id", "embedding"])
    interactions = lake.read_parquet(run.path("valid/interactions.parquet"), "interactions")
    index = items.select("item_id").with_row_index("item_row")
    users = interactions.select("user_id").unique().sort("user_id").with_row_index("user_row")
    joined = (interactions.join(index, on="item_id").join(users, on="user_id")
              .with_columns(interaction_weight_expr(run.reference_time, settings.event_weights, settings.recency_half_life_days)))
    inter = Interactions(joined["user_row"].to_numpy(), joined["item_row"].to_numpy(), joined["weight"].to_numpy(), users.height)
    device = torch.device("cuda" if settings.device != "cpu" and torch.cuda.is_available() else "cpu")
    item_vecs = torch.from_numpy(np.array(items.get_column("embedding").to_numpy(), dtype=np.float32, copy=True)).to(device)
    rows, scores = top_k_items(user_vectors(item_vecs, inter), item_vecs, inter, settings.top_k, settings.user_chunk)
    frame = candidates_frame(run, users.get_column("user_id"), index.get_column("item_id"), rows, scores)
    lake.write_parquet(frame, run.path("user_candidates.parquet"))
    quality = retrieval_quality(items, interactions, settings, run)
    return {"users_with_candidates": frame.get_column("user_id").n_unique(), "candidates": frame.height,
            **quality, "seconds": time.perf_counter() - started}


def retrieval_quality(items: pl.DataFrame, interactions: pl.DataFrame, settings: Settings, run: RunContext) -> dict[str, float]:
    """Return recall@K and NDCG@10 of retrieval on each user's last 2 interactions held out, vs popularity."""
    vectors = np.array(items.get_column("embedding").to_numpy(), dtype=np.float32, copy=True)
    weights = run_weights(run.reference_time, settings.event_weights, settings.recency_half_life_days)
    q = evaluate_retrieval(items.get_column("item_id").to_list(), vectors, interactions, weights,
                           k=settings.top_k, holdout=2, chunk=settings.user_chunk)
    log.info("retrieval on held-out interactions (%d users): recall@%d %.3f vs popularity %.3f; NDCG@10 %.3f vs %.3f",
             q.users_evaluated, q.k, q.recall_at_k, q.popularity_recall_at_k, q.ndcg_at_10, q.popularity_ndcg_at_10)
    return {"recall_at_k": q.recall_at_k, "ndcg_at_10": q.ndcg_at_10, "popularity_recall_at_k": q.popularity_recall_at_k,
            "popularity_ndcg_at_10": q.popularity_ndcg_at_10, "quality_users": q.users_evaluated}


def candidates_frame(run: RunContext, user_ids: pl.Series, item_ids: pl.Series, rows: np.ndarray, scores: np.ndarray) -> pl.DataFrame:
    """Return the long candidates table (run_id, run_date, user_id, rank, item_id, score), rank from 1."""
    table = candidates_table(user_ids.to_numpy(), item_ids.to_numpy(), rows, scores)
    return table.select(pl.lit(run.run_id).alias("run_id"), pl.lit(run.date).alias("run_date"), pl.all())
