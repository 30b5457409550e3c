"""The `encode-shard` node (mapped over the plan's shards): embed one shard, holding a slot of the gpu limit.

Checkpoints: a shard is done when ``shards/shard-NNNNN-<key>.done`` exists. Its Parquet file is written first
(temporary name, then rename), the marker last, so a run killed at any moment never leaves a half-written
shard that looks done. The key hashes the vectors' version, the encode settings and the shard's
(item_id, content_hash) rows: a re-run of the same run reuses every done shard; anything that changes the
shard's vectors changes its key.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from uuid import UUID

import polars as pl
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency

from core import failpoints
from core import progress as local_progress
from core.records import EncodeTotals, EngineMode, Plan, RunRef, ShardResult
from core.settings import Settings
from core.stop import raise_if_stopped
from models.encoder.engine import encode_texts
from models.encoder.loader import get_encoder
from models.encoder.spec import EncoderSpec, Mode
from storage.resources import lake_for

log = logging.getLogger(__name__)


def planned_spec(settings: Settings, engine: EngineMode) -> EncoderSpec:
    """Return the spec every shard encodes with: the settings' encoder with the plan's mode pinned."""
    mode = Mode(engine.backend, engine.precision, engine.token_budget, engine.length_multiple, engine.streams)
    return EncoderSpec.from_settings(settings).pinned(mode)


@task(name="encode-shard", cache_policy=NO_CACHE, task_run_name="encode-shard-{shard}")
def encode_shard(run: RunRef, plan: Plan, shard: int) -> ShardResult:
    """Produce shards/shard-NNNNN-<key>.parquet with the shard's embeddings unless its checkpoint is done."""
    with gpu_slot(run.settings.ops.gpu_limit, run.settings.ops.gpu_slot_lease_s):
        result = encode_one(run, plan, shard)
    report_progress(plan, shard)
    return result


def encode_one(run: RunRef, plan: Plan, shard: int) -> ShardResult:
    """Return the shard's checkpoint when done, else encode it, write it and commit its marker."""
    lake, cfg = lake_for(run.settings), run.settings
    rows = lake.read_parquet(
        plan.plan_uri, "plan", columns=["item_id", "text", "content_hash", "shard"], where=pl.col("shard") == shard
    )  # only this shard's rows: the plan holds the whole run
    spec = planned_spec(cfg, plan.engine)  # auto's choice, pinned at planning: every shard encodes in the same mode
    base = run.path(f"shards/shard-{shard:05d}-{shard_key(rows, plan.model_version, spec)}")
    done = lake.read_json(f"{base}.done")
    if done is not None:
        log.info("shard %d: reused checkpoint %s.parquet (%d texts)", shard, base, done["texts"])
        return ShardResult.from_marker(done)
    encoder = get_encoder(spec)
    vectors, stats = encode_texts(
        encoder, rows.get_column("text").to_list(), spec.token_budget, before_batch=lambda: raise_if_stopped(f"shard {shard}")
    )
    frame = rows.select("item_id").with_columns(pl.Series("embedding", vectors).cast(pl.Array(pl.Float32, encoder.dim)))
    lake.write_parquet(frame, f"{base}.parquet")
    result = ShardResult(
        shard,
        f"{base}.parquet",
        str(encoder.device),
        encoder.version,
        stats.texts,
        stats.real_tokens,
        stats.padded_tokens,
        stats.truncated,
        stats.batches,
        stats.oom_splits,
        stats.seconds,
        encoder.load_seconds,
    )
    lake.write_json(result.as_json(), f"{base}.done")  # the commit: only now is the shard done
    log.info(
        "shard %d: %d texts, %.0f texts/s, padding efficiency %.3f",
        shard,
        stats.texts,
        stats.texts / max(stats.seconds, 1e-9),
        stats.padding_efficiency,
    )
    failpoints.hit(f"shard:{shard}", cfg)
    return result


def shard_key(rows: pl.DataFrame, version: str, spec: EncoderSpec) -> str:
    """Return the checkpoint key of a shard: its vectors' version, the resolved encode mode and (item, content) rows."""
    digest = hashlib.sha256(f"{version}|{spec.max_seq_length}|{spec.token_budget}|{spec.length_multiple}".encode())
    for item_id, chash in rows.select("item_id", "content_hash").sort("item_id").iter_rows():
        digest.update(f"\n{item_id}:{chash}".encode())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=8)
def limit_exists(name: str) -> bool:
    """Return whether the Prefect server has the global concurrency limit (read once per process)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            return False
    return True


@contextmanager
def gpu_slot(limit: str | None, lease_s: float) -> Iterator[None]:
    """Hold one slot of the global concurrency limit while the block runs (nothing when limit is empty), on a lease of
    lease_s seconds that Prefect renews meanwhile: a process killed while it holds the slot frees it lease_s later.

    Waiting is logged (visible on the run's page), so a run queued behind another one's shards says why.
    A limit that does not exist on the server is skipped (asked once per process: asking Prefect to
    acquire a missing limit costs seconds per shard): `nightscore up` / `nightscore deploy` create it.
    """
    if not limit or not limit_exists(limit):
        yield
        return
    logger = get_run_logger()
    logger.info("waiting for a slot of global concurrency limit %r", limit)
    asked = time.monotonic()
    with concurrency(limit, occupy=1, strict=False, lease_duration=lease_s):
        logger.info("holding a slot of %r after %.1f s", limit, time.monotonic() - asked)
        yield


def report_progress(plan: Plan, shard: int) -> None:
    """Move the encode progress artifact (and a local progress bar, if one listens) past this shard."""
    from prefect.artifacts import update_progress_artifact

    done, total = plan.shards.index(shard) + 1, len(plan.shards)
    local_progress.report("encode", done, total)
    if plan.progress_artifact:
        update_progress_artifact(
            UUID(plan.progress_artifact), 100.0 * done / max(total, 1), description=f"Encode: {done} of {total} shard(s) done"
        )


@task(name="merge-encode-stats", cache_policy=NO_CACHE)
def merge_encode_stats(shards: Sequence[ShardResult], plan: Plan) -> EncodeTotals:
    """Return the run's encode totals: counters of the shards computed now summed, reuse counted apart."""
    computed = [s for s in shards if not s.reused]
    return EncodeTotals(
        texts=sum(s.texts for s in computed),
        real_tokens=sum(s.real_tokens for s in computed),
        padded_tokens=sum(s.padded_tokens for s in computed),
        truncated=plan.truncated,
        batches=sum(s.batches for s in computed),
        oom_splits=sum(s.oom_splits for s in computed),
        seconds=sum(s.seconds for s in computed),
        shards=len(shards),
        shards_reused=len(shards) - len(computed),
        device=computed[0].device if computed else "none",
        model_version=plan.model_version,
        rows_reused=plan.rows_reused,
        rows_computed=plan.rows_computed,
        load_seconds=max((s.load_seconds for s in computed), default=0.0),
        engine=plan.engine,
    )
