"""The `publish` node: stage the cache version, then one warehouse transaction that switches the cache pointer and
commits, then the lake partitions.

`stage_cache` and `publish` run inside one Prefect transaction with `publish_serving_node`
(flows/pipeline.py), each with an on_rollback hook, so a failing step undoes the ones before it: the staged
cache version is dropped, and a committed publication is retracted (the warehouse's latest run, both cache
pointers and the lake partitions go back to the run before; the failed run's rows are deleted). A step undoes
its own partial work itself (Prefect runs a task's rollback hook only once the task has succeeded). Only when the
whole transaction commits (`publish`'s on_commit hook) are the rows of a same-date run it replaced deleted and the
older cache versions retired, so every failure point before can go back to that run.

The cache pointer moves only when the run becomes the latest one (the newest run_date; storage/publication.py):
publishing an older run_date (a backfill) writes its rows and partitions and leaves latest_* and the cache alone.

No Prefect retries here: in Prefect 3.9 a failed attempt inside a transaction rolls back the steps before it
even when a retry then succeeds. Lock contention is retried inside the warehouse adapter, transport errors of the
cache and the lake inside theirs.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.transactions import Transaction, get_transaction

from core import failpoints
from core.errors import NightscoreError
from core.records import Candidates, Checked, Published, RunRecord, RunRef, Staged, Stages
from core.settings import Settings
from data_contracts.inputs import INTERACTIONS_CONTRACT, ITEMS_CONTRACT
from data_contracts.outputs import ITEM_SCORES_CONTRACT, USER_CANDIDATES_CONTRACT
from storage import duckdb_lake, leases
from storage.cache import CandidateCache
from storage.lake import Lake
from storage.publication import Pointers, drop_unless_current, retract, switch_in_transaction, unstage_cache
from storage.resources import cache_for, lake_for, warehouse_for
from storage.warehouse.base import Warehouse
from tasks.validate import record_quarantine

log = logging.getLogger(__name__)

ENTRY_BATCH = 4_096  # cache entries per batch (a user's entry is ~10 KB: ids and feature rows)
BATCH_ROWS = 32_768  # item_scores rows per batch when publishing (x 384 floats: ~50 MB)
CONTRACT_VERSIONS = ",".join([ITEMS_CONTRACT, INTERACTIONS_CONTRACT, ITEM_SCORES_CONTRACT, USER_CANDIDATES_CONTRACT])
PARTITIONED = {"item_scores": "item_scores.parquet", "user_candidates": "user_candidates.parquet"}


def _remember(**values: object) -> None:
    """Keep values on this task's transaction for its rollback and commit hooks."""
    txn = get_transaction()
    if txn is not None:
        for key, value in values.items():
            txn.set(key, value)


@task(name="stage-cache", cache_policy=NO_CACHE)
def stage_cache(run: RunRef, candidates: Candidates, checked: Checked) -> Staged:
    """Produce the run's cache version (not yet visible to readers); return its size and the pointer before it."""
    lake = lake_for(run.settings)
    with cache_for(run.settings) as cache:
        old_pointer = cache.current()
        if old_pointer == run.run_id:  # resumed after a crash past the switch: the version was complete before it
            written = lake.parquet_rows(candidates.entries_uri)
        else:
            written = cache.write_version(run.run_id, cache_entries(lake, candidates.entries_uri))
    _remember(run=run)
    return Staged(written, old_pointer)


@stage_cache.on_rollback
def _drop_staged_version(txn: Transaction) -> None:
    run: RunRef = txn.get("run")
    with cache_for(run.settings) as cache:  # the pointers are publish's to put back; the version goes unless served
        drop_unless_current(cache, run.run_id)
    log.warning("rolled back the staged cache version of %s", run.run_id)


def cache_entries(lake: Lake, uri: str) -> Iterator[tuple[str, bytes]]:
    """Yield (user_id, payload) of every user's cache entry (candidate ids and feature rows), streamed in batches."""
    for batch in lake.iter_frames(uri, "candidate_entries", batch_size=ENTRY_BATCH):
        yield from batch.select("user_id", "entry").iter_rows()


@task(name="publish", cache_policy=NO_CACHE)
def publish(run: RunRef, stages: Stages, staged: Staged) -> Published:
    """Publish the run's item_scores and user_candidates (warehouse transaction + cache pointer + partitions)."""
    started, cfg = time.perf_counter(), run.settings
    lake, warehouse = lake_for(cfg), warehouse_for(cfg, run.embedding_dim)
    record_quarantine(lake, warehouse, run)
    with cache_for(cfg) as cache:
        before = commit(lake, warehouse, cache, run, stages)
    _remember(run=run, before=before)
    seconds = time.perf_counter() - started
    record = run_record(run, stages, {**stages.seconds(), "publish": round(seconds, 3)})
    warehouse.record_run(
        {
            "run_id": run.run_id,
            "finished_at": record.finished_at,
            "wall_seconds": record.wall_seconds,
            "stage_seconds": record.stage_seconds,
        }
    )
    log.info("published %s: %d item scores, %d users in cache", run.run_id, stages.scored.rows_scored, staged.cache_entries)
    return Published(
        record,
        {**stages.validated.data_docs, **stages.checked.data_docs},
        json.loads(record.stage_seconds),
        stages.encoded.shards,
        staged.cache_entries,
        quality=stages.candidates.quality,
    )


@publish.on_rollback
def _retract_publication(txn: Transaction) -> None:
    run: RunRef = txn.get("run")
    take_back(run, txn.get("before"), "a later publish step failed")


@publish.on_commit
def _finalize_publication(txn: Transaction) -> None:
    """The whole publication stuck: delete the rows of the same-date run it replaced, retire old cache versions."""
    run: RunRef = txn.get("run")
    try:
        deleted = warehouse_for(run.settings).finalize_publication(run.run_id)
        with cache_for(run.settings) as cache:
            retiring = cache.retire_old_versions()
    except NightscoreError as exc:  # leftovers go at the next publication of the date; never fail a published run
        log.warning("publication of %s stuck, but its clean-up did not: %s", run.run_id, exc)
        return
    log.info(
        "publication of %s final: %d replaced rows deleted, old versions retiring: %s",
        run.run_id,
        deleted,
        ", ".join(retiring) or "none",
    )


def take_back(run: RunRef, before: Pointers | None, reason: str) -> None:
    """Retract a committed publication (warehouse, cache pointers, rows), then put its date's lake partitions back."""
    cfg = run.settings
    warehouse = warehouse_for(cfg)
    with cache_for(cfg) as cache:
        retract(warehouse, cache, run.run_id, reason, before)
    try:
        restore_partitions(lake_for(cfg), warehouse, run.run_date)
    except Exception as exc:  # noqa: BLE001 - the warehouse and cache are back; the lake is best effort
        log.error("lake partitions of %s may still hold the retracted run %s: %s", run.run_date, run.run_id, exc)


def commit(lake: Lake, warehouse: Warehouse, cache: CandidateCache, run: RunRef, stages: Stages) -> Pointers | None:
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

    candidates = lake.read_parquet(stages.candidates.uri, "user_candidates")
    lease = leases.held_by(str(flow_run.get_id()))
    try:  # DuckDB / COPY consume item_scores batch by batch: the warehouse never gets the whole table at once
        record = run_record(run, stages, stages.seconds())
        latest = warehouse.publish(
            record.row(),
            arrow_stream(lake, stages.scored.uri, "item_scores"),
            candidates.to_arrow(),
            before_commit=switch_pointer,
            fence=lease.fence if lease else None,
            keep_replaced=True,
        )
    except BaseException:
        _undo(lambda: unstage_cache(cache, run.run_id, switched[0] if switched else None), run)
        raise
    before = switched[0] if switched else None
    if latest != run.run_id:  # an older run_date: its rows are published for analysts, the cache serves latest
        drop_unless_current(cache, run.run_id)
    try:
        write_partitions(lake, {"item_scores": stages.scored.uri, "user_candidates": candidates.to_arrow()}, run.settings)
    except BaseException as exc:
        reason = f"lake partitions failed: {type(exc).__name__}: {exc}"
        _undo(lambda: take_back(run, before, reason), run)
        raise
    return before


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
    rows = warehouse.query(
        "SELECT run_id FROM scoring_runs WHERE CAST(run_date AS VARCHAR) = ? AND status = 'published' "
        "ORDER BY published_at DESC LIMIT 1",
        [run_date],
    ).rows
    folder = lake.uri("runs", run_date, rows[0][0]) if rows else None
    sources = {table: f"{folder}/{name}" for table, name in PARTITIONED.items()} if folder else {}
    if sources and all(lake.exists(uri) for uri in sources.values()):
        write_partitions(lake, dict(sources))
        return str(rows[0][0])
    for table in PARTITIONED:
        duckdb_lake.remove_partition(lake, table, run_date)
    return None


def run_record(run: RunRef, stages: Stages, stage_seconds: dict[str, float]) -> RunRecord:
    """Return the scoring_runs row of a run from its stages' results."""
    encoded, validated, candidates = stages.encoded, stages.validated, stages.candidates
    finished = datetime.now(UTC)
    started = datetime.fromisoformat(run.started_at)
    return RunRecord(
        run_id=run.run_id,
        flow_run_id=str(flow_run.get_id()),
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
        contract_versions=CONTRACT_VERSIONS,
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
    )
