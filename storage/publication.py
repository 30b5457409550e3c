"""The whole publication protocol across the warehouse, the cache and the lake: stage, commit, take back, partitions.

A run is published in steps, each undone by the one below it when a later step fails:
1. `stage`: the run's cache version is written, not yet visible (undone by dropping it: `unstage_cache`);
2. `commit`: one warehouse transaction publishes item_scores, user_candidates and the scoring_runs record
   (`run_record`); it switches the cache pointer (`switch_in_transaction`) just before it commits, and only when the
   run becomes the latest one (an older run_date does not move the pointer backwards); then the run date's lake
   partitions are written (`write_partitions`). A failure before the commit undoes the switch (`unstage_cache`), a
   failure after it withdraws the publication (`withdraw`: warehouse, both cache pointers and partitions back to
   the run before);
3. `finalize`, once the whole publication stuck: the rows of a same-date run it replaced go, old cache versions retire.

Every function keeps one rule: after it returns (or raises), the cache's current pointer names the warehouse's latest
published run (none when nothing is published) whenever the cache holds that run's version, and the previous pointer
never names a version a failed publication left behind. `reconcile_cache` puts them back in line after a crash.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pyarrow as pa

from core import failpoints
from core.errors import PublishError
from core.records import Routed, RunRecord, RunRef, Stages
from core.settings import Settings
from storage import duckdb_lake
from storage.cache import CandidateCache
from storage.lake import Lake
from storage.resources import cache_for, lake_for, warehouse_for
from storage.warehouse.base import LeaseFence, Warehouse

ENTRY_BATCH = 4_096  # cache entries per batch (a user's entry is ~10 KB: ids and feature rows)
BATCH_ROWS = 32_768  # item_scores rows per batch when publishing (x 384 floats: ~50 MB)
PARTITIONED = {"item_scores": "item_scores.parquet", "user_candidates": "user_candidates.parquet"}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pointers:
    """The cache's current and previous pointers at one moment (what a failed publication restores)."""

    current: str | None
    previous: str | None


def pointers(cache: CandidateCache) -> Pointers:
    """Return the cache's pointers now."""
    return Pointers(cache.current(), cache.previous())


def switch_in_transaction(cache: CandidateCache, run_id: str, latest: str) -> Pointers:
    """Switch the cache to run_id when the warehouse transaction makes it the latest run; return the pointers before."""
    before = pointers(cache)
    if latest == run_id:
        cache.switch_current(run_id)
    else:
        log.info("run %s published for an older run_date than %s: the cache pointer stays on %s", run_id, latest, before.current)
    return before


def take_back(cache: CandidateCache, run_id: str, before: Pointers) -> None:
    """Take run_id out of the pointer chain: both pointers back to before when it is current, previous fixed if previous."""
    now = pointers(cache)
    if now.current == run_id:
        cache.set_pointers(before.current, before.previous)
    elif now.previous == run_id:  # another run switched after it: only the previous pointer named it
        cache.set_pointers(now.current, before.current)


def drop_unless_current(cache: CandidateCache, run_id: str) -> None:
    """Drop a failed (or not served) run's version unless the cache still points at it."""
    if cache.current() != run_id:
        cache.drop_version(run_id)


def align_pointers(cache: CandidateCache, newest: list[str]) -> str | None:
    """Point the cache at the warehouse's latest run (newest: latest first, then the one before); return the fix.

    Used when a crash left them apart: with nothing published the current pointer goes; a latest run whose version
    the cache lacks is left alone (logged), since there is nothing whole to switch to.
    """
    latest = newest[0] if newest else None
    current = cache.current()
    if current == latest:
        return None
    if latest is not None and latest not in cache.versions():
        log.warning("cache pointer %s differs from the warehouse's latest run %s, whose version the cache lacks", current, latest)
        return None
    versions = set(cache.versions())
    previous = next((run_id for run_id in newest[1:2] if run_id in versions), None)
    log.warning(
        "cache pointer %s differs from the warehouse's latest run %s: pointers set to (%s, %s)", current, latest, latest, previous
    )
    cache.set_pointers(latest, previous if latest is not None else None)
    return latest or "none"


def reconcile_cache(warehouse: Warehouse, cache: CandidateCache) -> str | None:
    """Put the cache pointers back in line with the warehouse after a crash; return the run switched to ('none': cleared).

    Runs inside a warehouse write transaction, so no publication switches the cache while it looks.
    """
    fixed: list[str | None] = []
    warehouse.with_newest(lambda newest: fixed.append(align_pointers(cache, newest)))
    return fixed[0] if fixed else None


def unstage_cache(cache: CandidateCache, run_id: str, before: Pointers | None) -> None:
    """Undo a staged (or switched, uncommitted) cache version: the pointers back to before, the run's entries dropped."""
    if before is not None:
        take_back(cache, run_id, before)
    drop_unless_current(cache, run_id)


def retract(warehouse: Warehouse, cache: CandidateCache, run_id: str, reason: str, before: Pointers | None) -> str | None:
    """Take back a committed publication whose later steps failed: warehouse, cache pointers and rows back to the run before.

    Returns the run that is latest again. The failed run's rows go with its warehouse retraction; its cache version
    goes once the warehouse has committed (a failed retraction leaves a version the warehouse still names).
    """

    def point_back(latest: str | None) -> None:
        if before is not None:
            take_back(cache, run_id, before)
        if cache.current() != latest:
            align_pointers(cache, [latest] if latest else [])

    latest = warehouse.retract(run_id, f"publication retracted: {reason}", before_commit=point_back)
    drop_unless_current(cache, run_id)
    log.warning("retracted publication of %s (%s); latest is %s", run_id, reason, latest)
    return latest


def rollback(warehouse: Warehouse, cache: CandidateCache) -> tuple[str, str | None]:
    """Point the warehouse's latest_* views and the cache back to the previous published run, together."""

    def switch(run_id: str) -> None:
        if run_id not in cache.versions():
            raise PublishError(f"cache has no entries of run {run_id}: cannot roll the cache back to it")
        cache.switch_current(run_id)

    return warehouse.rollback_latest(before_commit=switch)


def stage(lake: Lake, cache: CandidateCache, run_id: str, entries_uri: str) -> tuple[int, str | None]:
    """Write the run's cache version, not yet visible to readers; return (entries written, the pointer before it)."""
    old_pointer = cache.current()
    if old_pointer == run_id:  # resumed after a crash past the switch: the version was complete before it
        return lake.parquet_rows(entries_uri), old_pointer
    return cache.write_version(run_id, cache_entries(lake, entries_uri)), old_pointer


def cache_entries(lake: Lake, uri: str) -> Iterator[tuple[str, bytes]]:
    """Yield (user_id, payload) of every user's cache entry (candidate ids and feature rows), streamed in batches."""
    for batch in lake.iter_frames(uri, "candidate_entries", batch_size=ENTRY_BATCH):
        yield from batch.select("user_id", "entry").iter_rows()


def commit(
    lake: Lake, warehouse: Warehouse, cache: CandidateCache, run: RunRef, record: RunRecord, fence: LeaseFence | None
) -> Pointers | None:
    """One warehouse transaction that switches the cache pointer before it commits, then the lake partitions.

    Returns the cache pointers before the switch. A failure before the commit leaves everything as it was; a
    failure of the partitions after it retracts the publication (warehouse, cache pointers and partitions back to
    the run before) and raises.
    """
    switched: list[Pointers] = []

    def switch_pointer(latest: str) -> None:
        switched.append(switch_in_transaction(cache, run.run_id, latest))
        failpoints.hit("publish", run.settings)  # switched, not committed
        failpoints.hit("publish:before-commit", run.settings)

    candidates = lake.read_parquet(run.path(PARTITIONED["user_candidates"]), "user_candidates")
    try:  # DuckDB / COPY consume item_scores batch by batch: the warehouse never gets the whole table at once
        latest = warehouse.publish(
            record.row(),
            arrow_stream(lake, run.path(PARTITIONED["item_scores"]), "item_scores"),
            candidates.to_arrow(),
            before_commit=switch_pointer,
            fence=fence,
            keep_replaced=True,
        )
    except BaseException:
        _undo(lambda: unstage_cache(cache, run.run_id, switched[0] if switched else None), run)
        raise
    before = switched[0] if switched else None
    if latest != run.run_id:  # an older run_date: its rows are published for analysts, the cache serves latest
        drop_unless_current(cache, run.run_id)
    try:
        write_partitions(
            lake, {"item_scores": run.path(PARTITIONED["item_scores"]), "user_candidates": candidates.to_arrow()}, run.settings
        )
    except BaseException as exc:
        reason = f"lake partitions failed: {type(exc).__name__}: {exc}"
        _undo(lambda: withdraw(run, before, reason), run)
        raise
    return before


def withdraw(run: RunRef, before: Pointers | None, reason: str) -> None:
    """Retract a committed publication (warehouse, cache pointers, rows), then put its date's lake partitions back."""
    cfg = run.settings
    warehouse = warehouse_for(cfg)
    with cache_for(cfg) as cache:
        retract(warehouse, cache, run.run_id, reason, before)
    try:
        restore_partitions(lake_for(cfg), warehouse, run.run_date)
    except Exception as exc:  # noqa: BLE001 - the warehouse and cache are back; the lake is best effort
        log.error("lake partitions of %s may still hold the retracted run %s: %s", run.run_date, run.run_id, exc)


def finalize(warehouse: Warehouse, cache: CandidateCache, run_id: str) -> tuple[int, list[str]]:
    """Return (rows of the same-date run replaced, cache versions retiring) once a whole publication stuck."""
    deleted = warehouse.finalize_publication(run_id)
    return deleted, cache.retire_old_versions()


def _undo(action: Callable[[], None], run: RunRef) -> None:
    """Run an undo step; its own failure is logged, never raised over the failure being undone."""
    try:
        action()
    except Exception as exc:  # noqa: BLE001 - the original failure is what the run reports
        log.error("could not undo the publication of %s: %s", run.run_id, exc)


def arrow_stream(lake: Lake, uri: str, dataset: str) -> pa.RecordBatchReader:
    """Return the Parquet file at uri as an Arrow stream of BATCH_ROWS-row batches, read as it is consumed."""
    frames = lake.iter_frames(uri, dataset, batch_size=BATCH_ROWS)
    first = next(frames, None)
    if first is None:
        return pa.RecordBatchReader.from_batches(lake.read_parquet(uri, dataset).to_arrow().schema, [])
    head = first.to_arrow()
    rest = (batch for frame in frames for batch in frame.to_arrow().to_batches())
    return pa.RecordBatchReader.from_batches(head.schema, itertools.chain(head.to_batches(), rest))


def write_partitions(lake: Lake, tables: dict[str, pa.Table | str], settings: Settings | None = None) -> list[str]:
    """Write published tables as Hive partitions <lake>/outputs/<table>/run_date=YYYY-MM-DD/part-0.parquet.

    A table is an Arrow table or the URI of its Parquet file in the lake (DuckDB then streams it from the lake).
    Every table is staged first (one plain DuckDB COPY per run_date, through the lake's s3fs on S3;
    storage/duckdb_lake.py), then all are moved into place, so a failure while writing leaves every partition
    as it was, and a re-publish of the same date replaces each file whole.
    """
    staged: dict[str, str] = {}
    try:
        with duckdb_lake.connect(lake) as con:
            for table, rows in tables.items():
                staged[table] = duckdb_lake.stage_partitions(con, lake, table, rows)
        if settings is not None:
            failpoints.hit("publish:partitions", settings)  # every table staged, none moved
        return [uri for table, staging in staged.items() for uri in duckdb_lake.move_staged(lake, staging, table)]
    finally:
        for staging in staged.values():
            duckdb_lake.remove_staging(lake, staging)


def restore_partitions(lake: Lake, warehouse: Warehouse, run_date: str) -> str | None:
    """Rewrite a run_date's partitions from the run of that date that is published now (or remove them); return it."""
    published = warehouse.published_on(run_date)
    folder = lake.uri("runs", run_date, published) if published else None
    sources = {table: f"{folder}/{name}" for table, name in PARTITIONED.items()} if folder else {}
    if sources and all(lake.exists(uri) for uri in sources.values()):
        write_partitions(lake, dict(sources))
        return published
    for table in PARTITIONED:
        duckdb_lake.remove_partition(lake, table, run_date)
    return None


def record_quarantine(lake: Lake, warehouse: Warehouse, run: RunRef) -> int:
    """Copy the run's quarantine rows (if any were written) into the warehouse; return how many."""
    uri = run.path("quarantine.parquet")
    if not lake.exists(uri):
        return 0
    quarantine = lake.read_parquet(uri, "quarantine").with_columns(pl.lit(run.run_id).alias("run_id"))
    return warehouse.record_quarantine(run.run_id, quarantine.to_arrow())


def run_record(
    run: RunRef, stages: Stages, stage_seconds: dict[str, float], flow_run_id: str, contract_versions: str
) -> RunRecord:
    """Return the scoring_runs row of a run from its stages' results."""
    encoded, validated, candidates = stages.encoded, stages.validated, stages.candidates
    finished = datetime.now(UTC)
    started = datetime.fromisoformat(run.started_at)
    return RunRecord(
        run_id=run.run_id,
        flow_run_id=flow_run_id,
        flow_name=run.flow_name,
        run_date=run.run_date,
        status="published",
        started_at=started,
        finished_at=finished,
        rows_in=validated.rows_in,
        rows_quarantined=validated.rows_quarantined,
        rows_scored=stages.scored.rows_scored,
        rows_reused=encoded.rows_reused,
        rows_computed=encoded.rows_computed,
        shards_reused=encoded.shards_reused,
        interactions_in=validated.interactions_in,
        interactions_quarantined=validated.interactions_quarantined,
        users_with_candidates=candidates.users_with_candidates,
        recall_at_k=candidates.recall_at_k,
        cold_recall_at_k=candidates.cold_recall_at_k,
        ranker_kind=candidates.ranker_kind,
        ranker_version=candidates.ranker_version,
        candidate_gate=candidates.gate or None,
        candidate_fallback=candidates.fallback,
        ndcg_at_10=candidates.ndcg_at_10,
        popularity_recall_at_k=candidates.popularity_recall_at_k,
        popularity_ndcg_at_10=candidates.popularity_ndcg_at_10,
        real_tokens=encoded.real_tokens,
        padded_tokens=encoded.padded_tokens,
        padding_efficiency=encoded.padding_efficiency,
        truncated_texts=encoded.truncated,
        texts_per_s=encoded.texts_per_s,
        wall_seconds=(finished - started).total_seconds(),
        device=encoded.device,
        model_version=encoded.model_version,
        contract_versions=contract_versions,
        stage_seconds=json.dumps(stage_seconds),
        data_docs=json.dumps({**validated.data_docs, **stages.checked.data_docs}),
        backend=encoded.engine.backend,
        precision=encoded.engine.precision,
        token_budget=encoded.engine.token_budget,
        engine_runtime=encoded.engine.runtime,
        fidelity_min=encoded.engine.fidelity_min,
        fidelity_p1=encoded.engine.fidelity_p1,
        calibration_device_kind=encoded.engine.device_kind,
        calibrated_tokens_per_s=encoded.engine.calibrated_tokens_per_s,
        calibration_from_cache=encoded.engine.calibration_from_cache,
        engine_choice=encoded.engine.choice,
        **cascade_columns(stages.routed),
    )


def cascade_columns(routed: Routed | None) -> dict[str, Any]:
    """Return the scoring_runs columns of the cascade: its model, budget, routed items and why, its sample's figures."""
    if routed is None or routed.large_version is None:
        return {}
    return {
        "cascade_model_version": routed.large_version,
        "cascade_budget": routed.budget,
        "routed_items": routed.routed,
        "routed_truncated": routed.routed_truncated,
        "routed_margin": routed.routed_margin,
        "cascade_threshold": routed.threshold,
        "cascade_agreement": routed.agreement,
        "cascade_cost_ratio": routed.cost_ratio,
        "cascade_seconds": round(routed.large_seconds, 3),
    }
