"""Stages around the model: plan shards over the whole run (reusing published vectors), encode one shard.

Checkpoints: a shard is done when ``shards/shard-NNNNN-<key>.done`` exists. Its Parquet file is
written first (temporary name, then rename), the marker last, so a run killed at any moment never
leaves a half-written shard that looks done. The key hashes the vectors' version, the encode
settings and the shard's (item_id, content_hash) rows: a re-run of the same run reuses every done
shard; anything that changes the shard's vectors changes its key.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
from tokenizers import Tokenizer

from models.encoder import EncoderSpec, get_encoder, load_tokenizer, spec_version
from models.engine import encode_texts
from models.planning import assign_shards
from nightscore.run_context import RunContext
from nightscore.stages.runs import latest_published_folder
from nightscore.settings import Settings
from nightscore.stop import fault_point, raise_if_stopped
from storage.lake import Lake
from storage.warehouse import Warehouse

log = logging.getLogger(__name__)


def encoder_spec(settings: Settings) -> EncoderSpec:
    """Return the encoder spec the settings ask for."""
    return EncoderSpec(settings.encoder, settings.device, settings.precision, settings.max_seq_length, settings.num_threads)


def content_hash(texts: pl.Series) -> pl.Series:
    """Return the sha256 hex digest of each text (the identity of what gets encoded)."""
    return pl.Series("content_hash", [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts], dtype=pl.String)


def previous_vectors(lake: Lake, warehouse: Warehouse) -> str | None:
    """Return the URI of the latest published run's item_scores (its vectors are read in batches), or None if there is none."""
    latest = latest_published_folder(lake, warehouse)
    if latest is None:
        return None
    uri = f"{latest[1]}/item_scores.parquet"
    if not lake.exists(uri):
        log.warning("published run %s has no item_scores in the lake (%s): nothing is reused", latest[0], uri)
        return None
    return uri


def reusable_vectors(lake: Lake, previous: str | None, version: str, keys: pl.DataFrame) -> Iterator[pl.DataFrame]:
    """Yield (item_id, embedding) of items whose content has a published vector of the same version, batch by batch.

    The previous item_scores stream in batches; the first vector of each content hash is taken, as before.
    """
    if previous is None:
        return
    taken = pl.Series("content_hash", [], dtype=pl.String)
    wanted = keys.get_column("content_hash").implode()
    for batch in lake.iter_frames(previous, "item_scores", columns=["model_version", "content_hash", "embedding"],
                                  batch_size=PLAN_BATCH):
        match = (batch.filter((pl.col("model_version") == version) & pl.col("content_hash").is_in(wanted)
                              & ~pl.col("content_hash").is_in(taken.implode()))
                 .select("content_hash", "embedding").unique("content_hash", keep="first", maintain_order=True))
        taken = pl.concat([taken, match.get_column("content_hash")])
        yield keys.join(match, on="content_hash", how="inner").select("item_id", "embedding")


PLAN_BATCH = 65_536  # valid items per batch: tokenized, hashed and written a batch at a time
PLAN_SCHEMA = pl.Schema({"item_id": pl.String, "text": pl.String, "content_hash": pl.String,
                         "token_count": pl.Int32, "shard": pl.Int32})
REUSED_SCHEMA = pl.Schema({"item_id": pl.String, "embedding": pl.Array(pl.Float32, 384)})


def plan_shards(lake: Lake, run: RunContext, settings: Settings, previous: str | None) -> dict[str, object]:
    """Tokenize, reuse published vectors of unchanged items, bucket the rest by length and cut shards.

    Produces ``plan.parquet`` (every valid item; shard -1 when its vector is reused) and
    ``reused.parquet`` (item_id, embedding of the reused items). Texts and vectors stream in batches of
    PLAN_BATCH: only ids, hashes and lengths are held for the whole run (the shard cut needs every length).
    ``previous`` is `previous_vectors`' URI.
    """
    started, uri = time.perf_counter(), run.path("valid/items.parquet")
    tokenizer = load_tokenizer(settings.max_seq_length)
    keys = pl.concat([_plan_keys(batch, tokenizer) for batch in _item_batches(lake, uri)]
                     or [pl.DataFrame(schema={"item_id": pl.String, "content_hash": pl.String, "full_length": pl.Int64})])
    version = spec_version(encoder_spec(settings))
    reused_ids: list[pl.Series] = []
    lake.write_parquet_frames(_keeping_ids(reusable_vectors(lake, previous, version, keys), reused_ids),
                              run.path("reused.parquet"), REUSED_SCHEMA)
    reused = pl.DataFrame({"item_id": pl.concat(reused_ids) if reused_ids else pl.Series([], dtype=pl.String)})
    full = keys.get_column("full_length").to_numpy()
    lengths = np.minimum(full, settings.max_seq_length)
    columns = keys.select("content_hash").with_columns(
        pl.Series("token_count", lengths, dtype=pl.Int32), _shards(keys, reused, lengths, settings))
    lake.write_parquet_frames(_plan_frames(lake, uri, columns), run.path("plan.parquet"), PLAN_SCHEMA)
    shards = sorted(int(s) for s in columns.get_column("shard").unique() if s >= 0)
    log.info("plan: %d items, %d reused from published vectors, %d to encode in %d shards",
             keys.height, reused.height, keys.height - reused.height, len(shards))
    return {"shards": shards, "items": keys.height, "rows_reused": reused.height, "model_version": version,
            "rows_computed": keys.height - reused.height, "truncated": int((full > settings.max_seq_length).sum()),
            "real_tokens": int(lengths.sum()), "seconds": time.perf_counter() - started}


def _keeping_ids(frames: Iterator[pl.DataFrame], ids: list[pl.Series]) -> Iterator[pl.DataFrame]:
    """Yield frames unchanged, keeping each one's item_id column in ids."""
    for frame in frames:
        ids.append(frame.get_column("item_id"))
        yield frame


def _item_batches(lake: Lake, uri: str) -> Iterator[pl.DataFrame]:
    return lake.iter_frames(uri, "items", columns=["item_id", "text"], batch_size=PLAN_BATCH)


def _plan_keys(batch: pl.DataFrame, tokenizer: Tokenizer) -> pl.DataFrame:
    """Return a batch's (item_id, content_hash, untruncated token count): what planning keeps of every row."""
    texts = batch.get_column("text")
    lengths = np.fromiter((len(e.ids) for e in tokenizer.encode_batch(texts.to_list())), dtype=np.int64, count=len(texts))
    return batch.select("item_id").with_columns(content_hash(texts), pl.Series("full_length", lengths, dtype=pl.Int64))


def _plan_frames(lake: Lake, uri: str, columns: pl.DataFrame) -> Iterator[pl.DataFrame]:
    """Yield plan rows batch by batch: the items' (item_id, text) read again, beside their planned columns."""
    offset = 0
    for batch in _item_batches(lake, uri):
        yield batch.hstack(columns.slice(offset, batch.height))
        offset += batch.height


def _shards(items: pl.DataFrame, reused: pl.DataFrame, lengths: np.ndarray, settings: Settings) -> pl.Series:
    """Return each item's shard: -1 when reused, else length-bucketed shards of the items to encode."""
    todo = ~items.get_column("item_id").is_in(reused.get_column("item_id").implode()).to_numpy()
    shards = np.full(items.height, -1, dtype=np.int32)
    if todo.any():
        _, shards[todo] = assign_shards(lengths[todo], settings.bucket_boundaries, settings.shard_size)
    return pl.Series("shard", shards, dtype=pl.Int32)


def shard_key(rows: pl.DataFrame, version: str, settings: Settings) -> str:
    """Return the checkpoint key of a shard: its vectors' version, encode settings and (item, content) rows."""
    digest = hashlib.sha256(f"{version}|{settings.max_seq_length}|{settings.token_budget}".encode())
    for item_id, chash in rows.select("item_id", "content_hash").sort("item_id").iter_rows():
        digest.update(f"\n{item_id}:{chash}".encode())
    return digest.hexdigest()[:16]


def encode_shard(lake: Lake, run: RunContext, settings: Settings, shard: int) -> dict[str, object]:
    """Encode one shard unless its checkpoint is done; produces ``shards/shard-NNNNN-<key>.parquet``."""
    rows = lake.read_parquet(run.path("plan.parquet"), "plan", columns=["item_id", "text", "content_hash", "shard"],
                             where=pl.col("shard") == shard)  # only this shard's rows: the plan holds the whole run
    spec = encoder_spec(settings)
    base = run.path(f"shards/shard-{shard:05d}-{shard_key(rows, spec_version(spec), settings)}")
    done = lake.read_json(f"{base}.done")
    if done is not None:
        log.info("shard %d: reused checkpoint %s.parquet (%d texts)", shard, base, done["texts"])
        return {**done, "reused": True, "seconds": 0.0}
    encoder = get_encoder(spec)
    vectors, stats = encode_texts(encoder, rows.get_column("text").to_list(), settings.token_budget,
                                  before_batch=lambda: raise_if_stopped(f"shard {shard}"))
    frame = rows.select("item_id").with_columns(pl.Series("embedding", vectors).cast(pl.Array(pl.Float32, encoder.dim)))
    lake.write_parquet(frame, f"{base}.parquet")
    result = {"shard": shard, "uri": f"{base}.parquet", "device": str(encoder.device), "model_version": encoder.version,
              "load_seconds": encoder.load_seconds, **stats.as_dict()}
    lake.write_json(result, f"{base}.done")  # the commit: only now is the shard done
    log.info("shard %d: %d texts, %.0f texts/s, padding efficiency %.3f", shard, stats.texts,
             stats.texts / max(stats.seconds, 1e-9), stats.padding_efficiency)
    fault_point(f"shard:{shard}", settings.fault_pause_at, Path(str(settings.home)) / "faults")
    return {**result, "reused": False}


SUMMED = ("texts", "real_tokens", "padded_tokens", "truncated", "batches", "oom_splits", "seconds")


def merge_shard_stats(shards: list[dict[str, object]], planned: dict[str, object]) -> dict[str, object]:
    """Return the run's encode stats: counters of the shards computed now summed, reuse counted apart."""
    computed = [s for s in shards if not s.get("reused")]
    merged: dict[str, object] = {key: sum(s[key] for s in computed) for key in SUMMED}  # type: ignore[misc]
    merged["padding_efficiency"] = merged["real_tokens"] / merged["padded_tokens"] if merged["padded_tokens"] else 1.0
    first = computed[0] if computed else {}
    merged.update(shards=len(shards), shards_reused=len(shards) - len(computed), device=first.get("device", "none"),
                  model_version=planned["model_version"], rows_reused=planned["rows_reused"],
                  rows_computed=planned["rows_computed"], truncated=planned["truncated"],
                  load_seconds=max((float(s.get("load_seconds", 0.0)) for s in computed), default=0.0))
    return merged
