"""Stages at the end of a run: output contracts, publication to warehouse and cache, run records."""

from __future__ import annotations

import itertools
import json
import logging
import time
from pathlib import Path
from datetime import datetime, timezone
from typing import Any

import polars as pl
import pyarrow as pa

from data_contracts.inputs import INTERACTIONS_CONTRACT, ITEMS_CONTRACT
from data_contracts.outputs import (
    ITEM_SCORES_CONTRACT, USER_CANDIDATES_CONTRACT, candidate_failures, enforce, item_score_failures,
)
from nightscore.errors import PublishError
from nightscore.run_context import RunContext
from nightscore.settings import Settings
from nightscore.stop import fault_point
from storage.cache import CandidateCache
from storage.candidate_payload import encode_candidates
from storage.lake import Lake
from storage.warehouse import Warehouse

log = logging.getLogger(__name__)

BATCH_ROWS = 32_768  # item_scores rows per batch when validating and publishing (x 384 floats: ~50 MB)
CONTRACT_VERSIONS = ",".join([ITEMS_CONTRACT, INTERACTIONS_CONTRACT, ITEM_SCORES_CONTRACT, USER_CANDIDATES_CONTRACT])


def validate_outputs(lake: Lake, run: RunContext, settings: Settings, expected_rows: int) -> dict[str, object]:
    """Check item_scores and user_candidates against the output contracts; raise ContractViolation if not."""
    started, uri = time.perf_counter(), run.path("item_scores.parquet")
    batches = lake.iter_frames(uri, "item_scores", batch_size=BATCH_ROWS)  # embeddings never all at once
    enforce(item_score_failures(batches, list(settings.topic_labels), expected_rows), "item_scores")
    n_scores = lake.parquet_rows(uri)
    candidates = lake.read_parquet(run.path("user_candidates.parquet"), "user_candidates")
    interactions = lake.read_parquet(run.path("valid/interactions.parquet"), "interactions", columns=["user_id", "item_id"])
    enforce(candidate_failures(candidates, interactions, n_scores, settings.top_k), "user_candidates")
    return {"checked_rows": n_scores + candidates.height, "seconds": time.perf_counter() - started}


def arrow_stream(lake: Lake, uri: str, dataset: str) -> pa.RecordBatchReader:
    """Return the Parquet file at uri as an Arrow stream of BATCH_ROWS-row batches, read as it is consumed."""
    frames = lake.iter_frames(uri, dataset, batch_size=BATCH_ROWS)
    first = next(frames, None)
    if first is None:
        return pa.RecordBatchReader.from_batches(lake.read_parquet(uri, dataset).to_arrow().schema, [])
    head = first.to_arrow()
    rest = (batch for frame in frames for batch in frame.to_arrow().to_batches())
    return pa.RecordBatchReader.from_batches(head.schema, itertools.chain(head.to_batches(), rest))


def cache_entries(candidates: pl.DataFrame):
    """Yield (user_id, payload) for every user in the long candidates table, ranks in order."""
    grouped = candidates.sort(["user_id", "rank"]).group_by("user_id", maintain_order=True).agg("item_id", "score")
    for user_id, item_ids, scores in grouped.iter_rows():
        yield user_id, encode_candidates(item_ids, scores)


def stage_cache(lake: Lake, cache: CandidateCache, run: RunContext) -> dict[str, object]:
    """Write the run's cache version (invisible to readers until the pointer switches); return its size and the pointer before."""
    candidates = lake.read_parquet(run.path("user_candidates.parquet"), "user_candidates")
    old_pointer = cache.current()
    if old_pointer == run.run_id:  # resumed after a crash past the switch: the version was complete before it
        written = candidates.get_column("user_id").n_unique()
    else:
        written = cache.write_version(run.run_id, cache_entries(candidates))
    return {"cache_entries": written, "old_pointer": old_pointer}


def publish(
    lake: Lake, warehouse: Warehouse, cache: CandidateCache, run: RunContext, summary: dict[str, Any],
    staged: dict[str, object], fault_pause_at: str | None = None, fault_dir: Path = Path("."),
) -> dict[str, object]:
    """Publish a staged run: one warehouse transaction that switches the cache pointer before commit, then the lake partitions.

    A failure before the commit leaves everything as it was; a failure of the partitions after it retracts
    the publication (warehouse and cache pointer back to the run before) and raises.
    """
    started = time.perf_counter()
    scores_uri = run.path("item_scores.parquet")

    def switch_pointer() -> None:
        cache.switch_current(run.run_id)
        fault_point("publish", fault_pause_at, fault_dir)  # the worst moment: cache switched, warehouse not committed

    try:
        # DuckDB / COPY consume item_scores batch by batch: the warehouse never gets the whole table at once
        candidates = lake.read_parquet(run.path("user_candidates.parquet"), "user_candidates")
        warehouse.publish(summary, arrow_stream(lake, scores_uri, "item_scores"), candidates.to_arrow(), before_commit=switch_pointer)
    except BaseException:
        unstage_cache(cache, run.run_id, staged.get("old_pointer"))  # type: ignore[arg-type]
        raise
    try:
        write_partitions(lake, run, {"item_scores": scores_uri, "user_candidates": candidates})
    except BaseException as exc:
        retract(warehouse, cache, run.run_id, f"lake partitions failed: {type(exc).__name__}: {exc}")
        raise
    dropped = drop_old_versions(cache)
    seconds = time.perf_counter() - started
    stage_seconds = {**json.loads(summary["stage_seconds"]), "publish": round(seconds, 3)}
    finished = datetime.now(timezone.utc)
    wall = (finished - datetime.fromisoformat(run.started_at)).total_seconds()
    warehouse.record_run({"run_id": run.run_id, "finished_at": finished, "wall_seconds": wall, "stage_seconds": json.dumps(stage_seconds)})
    log.info("published %s: %d item scores, %d users in cache (old versions retiring: %s)", run.run_id, lake.parquet_rows(scores_uri),
             staged["cache_entries"], ", ".join(dropped) or "none")
    return {"cache_entries": staged["cache_entries"], "seconds": seconds, "wall_seconds": wall, "stage_seconds": stage_seconds}


def retract(warehouse: Warehouse, cache: CandidateCache, run_id: str, reason: str) -> str | None:
    """Take back a committed publication whose later steps failed: warehouse and cache pointer back to the run before."""
    def point_back(latest: str | None) -> None:
        if latest is not None and latest in cache.versions() and cache.current() == run_id:
            cache.switch_current(latest)

    latest = warehouse.retract(run_id, f"publication retracted: {reason}", before_commit=point_back)
    log.warning("retracted publication of %s (%s); latest is %s", run_id, reason, latest)
    return latest


def write_partitions(lake: Lake, run: RunContext, tables: dict[str, pl.DataFrame | str]) -> list[str]:
    """Write published tables as Hive partitions <lake>/outputs/<table>/run_date=YYYY-MM-DD/part-0.parquet.

    A table is a frame or the URI of its Parquet file in the lake (DuckDB then streams it from the lake, and
    no frame is held). Written by DuckDB's COPY, one file per run_date (through the lake's s3fs on S3; see
    storage/duckdb_lake.py), and moved into place, so a re-publish of the same date replaces each file whole
    and engines other than ours (Spark, Trino, DuckDB on S3) read exactly what the warehouse holds.
    """
    from storage import duckdb_lake  # imported here: only publication writes partitions

    with duckdb_lake.connect(lake) as con:
        return [uri for table, rows in tables.items()
                for uri in duckdb_lake.write_partitions(con, lake, table, rows if isinstance(rows, str) else rows.to_arrow())]


def drop_old_versions(cache: CandidateCache) -> list[str]:
    """Let cache versions older than the previous one (kept for rollback) expire after the grace; return their run ids."""
    return cache.retire_old_versions()


def rollback(warehouse: Warehouse, cache: CandidateCache) -> tuple[str, str | None]:
    """Point the warehouse's latest_* views and the cache back to the previous published run, together."""
    def switch(run_id: str) -> None:
        if run_id not in cache.versions():
            raise PublishError(f"cache has no entries of run {run_id}: cannot roll the cache back to it")
        cache.switch_current(run_id)

    return warehouse.rollback_latest(before_commit=switch)


def unstage_cache(cache: CandidateCache, run_id: str, old_pointer: str | None) -> None:
    """Undo stage_cache after a failure: the pointer back where it was, the run's entries dropped (unless current)."""
    if old_pointer is not None and cache.current() == run_id:
        cache.switch_current(old_pointer)
    if cache.current() != run_id:
        cache.drop_version(run_id)


def record_quarantine(lake: Lake, warehouse: Warehouse, run: RunContext) -> int:
    """Copy the run's quarantine rows (if any were written) into the warehouse; return how many."""
    uri = run.path("quarantine.parquet")
    if not lake.exists(uri):
        return 0
    quarantine = lake.read_parquet(uri, "quarantine").with_columns(pl.lit(run.run_id).alias("run_id"))
    return warehouse.record_quarantine(run.run_id, quarantine.to_arrow())


QUALITY = ("recall_at_k", "ndcg_at_10", "popularity_recall_at_k", "popularity_ndcg_at_10")


def _finite(value: float) -> float | None:
    return None if value != value else float(value)  # NaN (no user to evaluate) is stored as NULL


def run_summary(run: RunContext, stages: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Return the scoring_runs row of a finished run from its stages' small result dicts."""
    encoded = stages["encode"]
    started_at = datetime.fromisoformat(run.started_at)
    wall = (datetime.now(timezone.utc) - started_at).total_seconds()
    return {
        "run_id": run.run_id, "flow_name": run.flow_name, "run_date": run.date, "status": "publishing",
        "started_at": started_at, "finished_at": datetime.now(timezone.utc),
        "rows_in": stages["validate"]["rows_in"], "rows_quarantined": stages["validate"]["rows_quarantined"],
        "rows_scored": stages["score"]["rows_scored"], "interactions_in": stages["validate"]["interactions_in"],
        "rows_reused": encoded["rows_reused"], "rows_computed": encoded["rows_computed"],
        "shards_reused": encoded["shards_reused"],
        "data_docs": json.dumps({**stages["validate"]["suites"]["docs"], **stages["validate_outputs"]["suites"]["docs"]}),
        "interactions_quarantined": stages["validate"]["interactions_quarantined"],
        "users_with_candidates": stages["candidates"]["users_with_candidates"],
        **{key: _finite(stages["candidates"][key]) for key in QUALITY},
        "real_tokens": encoded["real_tokens"], "padded_tokens": encoded["padded_tokens"],
        "padding_efficiency": encoded["padding_efficiency"], "truncated_texts": encoded["truncated"],
        "texts_per_s": encoded["texts"] / max(encoded["seconds"], 1e-9), "wall_seconds": wall,
        "device": encoded["device"], "model_version": encoded["model_version"], "contract_versions": CONTRACT_VERSIONS,
        "stage_seconds": json.dumps({name: round(float(s.get("seconds", 0.0)), 3) for name, s in stages.items()}),
    }
