"""Stages around the model: plan shards over the whole run, encode one shard."""

from __future__ import annotations

import hashlib
import logging
import time

import numpy as np
import polars as pl

from models.encoder import EncoderSpec, get_encoder, load_tokenizer
from models.engine import encode_texts
from models.planning import assign_shards
from nightscore.run_context import RunContext
from nightscore.settings import Settings
from storage.lake import Lake

log = logging.getLogger(__name__)


def encoder_spec(settings: Settings) -> EncoderSpec:
    """Return the encoder spec the settings ask for."""
    return EncoderSpec(settings.encoder, settings.device, settings.precision, settings.max_seq_length, settings.num_threads)


def content_hash(texts: pl.Series) -> pl.Series:
    """Return the sha256 hex digest of each text (the identity of what gets encoded)."""
    return pl.Series("content_hash", [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts], dtype=pl.String)


def plan_shards(lake: Lake, run: RunContext, settings: Settings) -> dict[str, object]:
    """Tokenize every valid item, bucket by length and cut shards; produces ``plan.parquet``."""
    started = time.perf_counter()
    items = lake.read_parquet(run.path("valid/items.parquet"), "items", columns=["item_id", "text"])
    tokenizer = load_tokenizer(settings.max_seq_length)
    full = np.fromiter((len(e.ids) for e in tokenizer.encode_batch(items.get_column("text").to_list())), dtype=np.int64)
    lengths = np.minimum(full, settings.max_seq_length)
    buckets, shards = assign_shards(lengths, settings.bucket_boundaries, settings.shard_size)
    plan = items.with_columns(
        content_hash(items.get_column("text")),
        pl.Series("token_count", lengths, dtype=pl.Int32),
        pl.Series("bucket", buckets, dtype=pl.Int32),
        pl.Series("shard", shards, dtype=pl.Int32),
    )
    lake.write_parquet(plan, run.path("plan.parquet"))
    return {
        "shards": sorted(int(s) for s in np.unique(shards)), "items": items.height,
        "truncated": int((full > settings.max_seq_length).sum()), "real_tokens": int(lengths.sum()),
        "seconds": time.perf_counter() - started,
    }


def encode_shard(lake: Lake, run: RunContext, settings: Settings, shard: int) -> dict[str, object]:
    """Encode one shard's texts; produces ``shards/shard-NNNNN.parquet`` (item_id, embedding)."""
    encoder = get_encoder(encoder_spec(settings))
    plan = lake.read_parquet(run.path("plan.parquet"), "plan", columns=["item_id", "text", "shard"])
    rows = plan.filter(pl.col("shard") == shard)
    vectors, stats = encode_texts(encoder, rows.get_column("text").to_list(), settings.token_budget)
    frame = pl.DataFrame({"item_id": rows.get_column("item_id")}).with_columns(
        pl.Series("embedding", vectors).cast(pl.Array(pl.Float32, encoder.dim))
    )
    uri = lake.write_parquet(frame, run.path(f"shards/shard-{shard:05d}.parquet"))
    log.info("shard %d: %d texts, %.0f texts/s, padding efficiency %.3f", shard, stats.texts,
             stats.texts / max(stats.seconds, 1e-9), stats.padding_efficiency)
    return {"shard": shard, "uri": uri, "device": str(encoder.device), "model_version": encoder.version,
            "load_seconds": encoder.load_seconds, **stats.as_dict()}



SUMMED = ("texts", "real_tokens", "padded_tokens", "truncated", "batches", "oom_splits", "seconds")


def merge_shard_stats(shards: list[dict[str, object]]) -> dict[str, object]:
    """Return the run's encode stats: shard counters summed, padding efficiency recomputed."""
    merged: dict[str, object] = {key: sum(s[key] for s in shards) for key in SUMMED}  # type: ignore[misc]
    merged["padding_efficiency"] = merged["real_tokens"] / merged["padded_tokens"] if merged["padded_tokens"] else 1.0
    first = shards[0] if shards else {}
    merged.update(shards=len(shards), device=first.get("device", "none"), model_version=first.get("model_version", "none"),
                  load_seconds=max((float(s["load_seconds"]) for s in shards), default=0.0))
    return merged
