"""The `plan-shards` node: tokenize, reuse the published vectors of unchanged items, cut length-bucketed shards.

Produces ``plan.parquet`` (every valid item; shard -1 when its vector is reused) and ``reused.parquet``
(item_id, embedding of the reused items). Texts and vectors stream in batches of PLAN_BATCH: only ids, hashes
and lengths are held for the whole run (the shard cut needs every length).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator

import numpy as np
import polars as pl
from prefect import task
from prefect.cache_policies import NO_CACHE
from tokenizers import Tokenizer

from core.records import EngineMode, Plan, RunRef, Validated
from core.run_context import run_folder
from core.settings import Settings
from models.encoder.batching import assign_shards
from models.encoder.files import model_info, tokenizer_for
from models.encoder.loader import ModeChoice, calibration_summary, choose_mode, get_encoder, spec_version
from models.encoder.spec import EncoderSpec
from storage.lake import Lake
from storage.resources import lake_for, warehouse_for
from storage.warehouse.base import Warehouse
from tasks.report import start_progress

log = logging.getLogger(__name__)

PLAN_BATCH = 65_536  # valid items per batch: tokenized, hashed and written a batch at a time
PLAN_SCHEMA = pl.Schema(
    {"item_id": pl.String, "text": pl.String, "content_hash": pl.String, "token_count": pl.Int32, "shard": pl.Int32}
)


@task(name="plan-shards", cache_policy=NO_CACHE)
def plan_shards(run: RunRef, validated: Validated) -> Plan:
    """Produce plan.parquet and reused.parquet; return the shards to encode and the encode progress artifact."""
    started, cfg, lake = time.perf_counter(), run.settings, lake_for(run.settings)
    requested = EncoderSpec.from_settings(cfg)
    max_length, tokenizer = model_info(requested).max_seq_length, tokenizer_for(requested)
    keys = pl.concat(
        [plan_keys(batch, tokenizer) for batch in _item_batches(lake, validated.items_uri)]
        or [pl.DataFrame(schema={"item_id": pl.String, "content_hash": pl.String, "full_length": pl.Int64})]
    )
    full = keys.get_column("full_length").to_numpy()
    lengths = np.minimum(full, max_length)
    # auto reads this machine kind's calibration, or calibrates when the run's encoding pays for it (else the default)
    choice = choose_mode(requested, int(lengths.sum()))
    spec = requested.pinned(choice.mode)
    version = spec_version(spec)
    reused = write_reused(lake, run, previous_vectors(lake, warehouse_for(cfg)), version, keys)
    columns = keys.select("content_hash").with_columns(
        pl.Series("token_count", lengths, dtype=pl.Int32), shard_column(keys, reused, lengths, cfg)
    )
    lake.write_parquet_frames(_plan_frames(lake, validated.items_uri, columns), run.path("plan.parquet"), PLAN_SCHEMA)
    shards = tuple(sorted(int(s) for s in columns.get_column("shard").unique() if s >= 0))
    log.info(
        "plan: %d items, %d reused from published vectors, %d to encode in %d shards",
        keys.height,
        reused.len(),
        keys.height - reused.len(),
        len(shards),
    )
    engine = engine_mode(requested, spec, choice)
    log.info(
        "encode mode %s (%s), min cosine to torch fp32 %.5f",
        engine.label,
        engine.choice,
        engine.fidelity_min,
    )
    return Plan(
        engine,
        run.path("plan.parquet"),
        run.path("reused.parquet"),
        shards,
        keys.height,
        reused.len(),
        keys.height - reused.len(),
        version,
        int((full > max_length).sum()),
        int(lengths.sum()),
        time.perf_counter() - started,
        start_progress(len(shards)),
    )


def engine_mode(requested: EncoderSpec, resolved: EncoderSpec, choice: ModeChoice) -> EngineMode:
    """Return the run's inference mode: the resolved spec's, with its measured fidelity, how it was chosen, and auto's
    calibration."""
    record = get_encoder(resolved).mode_record()  # loaded once per process: the shards and topic scores reuse it
    calibration = (calibration_summary(requested) or {}) if choice.how in ("calibrated", "persisted") else {}
    return EngineMode(
        backend=str(record["backend"]),
        precision=str(record["precision"]),
        token_budget=int(str(record["token_budget"])),
        streams=int(str(record["streams"])),
        length_multiple=int(str(record["length_multiple"])),
        runtime=str(record["runtime"]),
        fidelity_min=float(str(record["fidelity_min"])),
        fidelity_p1=float(str(record["fidelity_p1"])),
        fidelity_mean=float(str(record["fidelity_mean"])),
        calibrated=bool(calibration),
        device_kind=_text(calibration.get("calibration_device_kind")),
        calibrated_tokens_per_s=_number(calibration.get("calibration_tokens_per_s")),
        calibration_from_cache=bool(calibration["calibration_from_cache"]) if calibration else None,
        calibration_file=_text(calibration.get("calibration_file")),
        choice=choice.how,
        choice_note=choice.note or None,
    )


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _number(value: object) -> float | None:
    return None if value is None else float(str(value))


def content_hash(texts: pl.Series) -> pl.Series:
    """Return the sha256 hex digest of each text (the identity of what gets encoded)."""
    return pl.Series("content_hash", [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts], dtype=pl.String)


def plan_keys(batch: pl.DataFrame, tokenizer: Tokenizer) -> pl.DataFrame:
    """Return a batch's (item_id, content_hash, untruncated token count): what planning keeps of every row."""
    texts = batch.get_column("text")
    lengths = np.fromiter((len(e.ids) for e in tokenizer.encode_batch(texts.to_list())), dtype=np.int64, count=len(texts))
    return batch.select("item_id").with_columns(content_hash(texts), pl.Series("full_length", lengths, dtype=pl.Int64))


def previous_vectors(lake: Lake, warehouse: Warehouse) -> str | None:
    """Return the URI of the latest published run's item_scores (its vectors are read in batches), or None."""
    latest = warehouse.latest_published()
    if latest is None:
        return None
    uri = f"{run_folder(lake.uri, latest.run_date, latest.run_id)}/item_scores.parquet"
    if not lake.exists(uri):
        log.warning("published run %s has no item_scores in the lake (%s): nothing is reused", latest.run_id, uri)
        return None
    return uri


def write_reused(lake: Lake, run: RunRef, previous: str | None, version: str, keys: pl.DataFrame) -> pl.Series:
    """Write reused.parquet (vectors of items whose content has a published vector of this version); return their ids."""
    ids: list[pl.Series] = []
    schema = pl.Schema([("item_id", pl.String()), ("embedding", pl.Array(pl.Float32, run.embedding_dim))])
    lake.write_parquet_frames(
        _keeping_ids(reusable_vectors(lake, previous, version, keys), ids), run.path("reused.parquet"), schema
    )
    return pl.concat(ids) if ids else pl.Series("item_id", [], dtype=pl.String)


def reusable_vectors(lake: Lake, previous: str | None, version: str, keys: pl.DataFrame) -> Iterator[pl.DataFrame]:
    """Yield (item_id, embedding) of items whose content has a published vector of the same version, batch by batch.

    The previous item_scores stream in batches; the first vector of each content hash is taken.
    """
    if previous is None:
        return
    taken = pl.Series("content_hash", [], dtype=pl.String)
    wanted = keys.get_column("content_hash").implode()
    for batch in lake.iter_frames(
        previous, "item_scores", columns=["model_version", "content_hash", "embedding"], batch_size=PLAN_BATCH
    ):
        match = (
            batch.filter(
                (pl.col("model_version") == version)
                & pl.col("content_hash").is_in(wanted)
                & ~pl.col("content_hash").is_in(taken.implode())
            )
            .select("content_hash", "embedding")
            .unique("content_hash", keep="first", maintain_order=True)
        )
        taken = pl.concat([taken, match.get_column("content_hash")])
        yield keys.join(match, on="content_hash", how="inner").select("item_id", "embedding")


def _keeping_ids(frames: Iterator[pl.DataFrame], ids: list[pl.Series]) -> Iterator[pl.DataFrame]:
    """Yield frames unchanged, keeping each one's item_id column in ids."""
    for frame in frames:
        ids.append(frame.get_column("item_id"))
        yield frame


def _item_batches(lake: Lake, uri: str) -> Iterator[pl.DataFrame]:
    return lake.iter_frames(uri, "items", columns=["item_id", "text"], batch_size=PLAN_BATCH)


def _plan_frames(lake: Lake, uri: str, columns: pl.DataFrame) -> Iterator[pl.DataFrame]:
    """Yield plan rows batch by batch: the items' (item_id, text) read again, beside their planned columns."""
    offset = 0
    for batch in _item_batches(lake, uri):
        yield batch.hstack(columns.slice(offset, batch.height))
        offset += batch.height


def shard_column(items: pl.DataFrame, reused: pl.Series, lengths: np.ndarray, settings: Settings) -> pl.Series:
    """Return each item's shard: -1 when reused, else length-bucketed shards of the items to encode."""
    todo = ~items.get_column("item_id").is_in(reused.implode()).to_numpy()
    shards = np.full(items.height, -1, dtype=np.int32)
    if todo.any():
        _, shards[todo] = assign_shards(lengths[todo], settings.encoder.bucket_boundaries, settings.encoder.shard_size)
    return pl.Series("shard", shards, dtype=pl.Int32)
