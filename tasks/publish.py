"""The `publish` node: stage the cache version, then one warehouse transaction that switches the cache pointer and
commits, then the lake partitions.

`stage_cache` and `publish` run inside one Prefect transaction with `publish_serving_features`
(flows/pipeline.py), each with an on_rollback hook, so a failing step undoes the ones before it: the staged
cache version is dropped, and a committed publication is retracted (the warehouse's latest run and the cache
pointer go back to the run before). A step undoes its own partial work itself (Prefect runs a task's rollback
hook only once the task has succeeded).

No Prefect retries here: in Prefect 3.9 a failed attempt inside a transaction rolls back the steps before it
even when a retry then succeeds. Lock contention is retried inside the warehouse adapter.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.transactions import Transaction, get_transaction

from data_contracts.inputs import INTERACTIONS_CONTRACT, ITEMS_CONTRACT
from data_contracts.outputs import ITEM_SCORES_CONTRACT, USER_CANDIDATES_CONTRACT
from nightscore.stop import fault_point
from storage import duckdb_lake
from storage.cache import CandidateCache
from storage.candidate_payload import encode_candidates
from storage.lake import Lake
from storage.publication import retract, unstage_cache
from storage.resources import cache_for, lake_for, warehouse_for
from storage.warehouse import Warehouse
from tasks.results import Candidates, Checked, Published, RunRecord, RunRef, Staged, Stages
from tasks.validate import record_quarantine

log = logging.getLogger(__name__)

BATCH_ROWS = 32_768  # item_scores rows per batch when publishing (x 384 floats: ~50 MB)
CONTRACT_VERSIONS = ",".join([ITEMS_CONTRACT, INTERACTIONS_CONTRACT, ITEM_SCORES_CONTRACT, USER_CANDIDATES_CONTRACT])


def _remember(**values: object) -> None:
    """Keep values on this task's transaction for its rollback hook."""
    txn = get_transaction()
    if txn is not None:
        for key, value in values.items():
            txn.set(key, value)


@task(name="stage-cache", cache_policy=NO_CACHE)
def stage_cache(run: RunRef, candidates: Candidates, checked: Checked) -> Staged:
    """Produce the run's cache version (not yet visible to readers); return its size and the pointer before it."""
    lake = lake_for(run.settings)
    frame = lake.read_parquet(candidates.uri, "user_candidates")
    with cache_for(run.settings) as cache:
        old_pointer = cache.current()
        if old_pointer == run.run_id:  # resumed after a crash past the switch: the version was complete before it
            written = frame.get_column("user_id").n_unique()
        else:
            written = cache.write_version(run.run_id, cache_entries(frame))
    _remember(run=run, old_pointer=old_pointer)
    return Staged(written, old_pointer)


@stage_cache.on_rollback
def _drop_staged_version(txn: Transaction) -> None:
    run: RunRef = txn.get("run")
    with cache_for(run.settings) as cache:
        unstage_cache(cache, run.run_id, txn.get("old_pointer"))
    log.warning("rolled back the staged cache version of %s", run.run_id)


def cache_entries(candidates: pl.DataFrame) -> Iterator[tuple[str, bytes]]:
    """Yield (user_id, payload) for every user in the long candidates table, ranks in order."""
    grouped = candidates.sort(["user_id", "rank"]).group_by("user_id", maintain_order=True).agg("item_id", "score")
    for user_id, item_ids, scores in grouped.iter_rows():
        yield user_id, encode_candidates(item_ids, scores)


@task(name="publish", cache_policy=NO_CACHE)
def publish(run: RunRef, stages: Stages, staged: Staged) -> Published:
    """Publish the run's item_scores and user_candidates (warehouse transaction + cache pointer + partitions)."""
    started, cfg = time.perf_counter(), run.settings
    lake, warehouse = lake_for(cfg), warehouse_for(cfg, run.embedding_dim)
    record_quarantine(lake, warehouse, run)
    with cache_for(cfg) as cache:
        commit(lake, warehouse, cache, run, stages, staged)
        dropped = cache.retire_old_versions()
    seconds = time.perf_counter() - started
    record = run_record(run, stages, {**stages.seconds(), "publish": round(seconds, 3)})
    warehouse.record_run({"run_id": run.run_id, "finished_at": record.finished_at, "wall_seconds": record.wall_seconds,
                          "stage_seconds": record.stage_seconds})
    _remember(run=run)
    log.info("published %s: %d item scores, %d users in cache (old versions retiring: %s)", run.run_id,
             stages.scored.rows_scored, staged.cache_entries, ", ".join(dropped) or "none")
    return Published(record, {**stages.validated.data_docs, **stages.checked.data_docs}, json.loads(record.stage_seconds),
                     stages.encoded.shards, staged.cache_entries)


@publish.on_rollback
def _retract_publication(txn: Transaction) -> None:
    run: RunRef = txn.get("run")
    with cache_for(run.settings) as cache:
        retract(warehouse_for(run.settings), cache, run.run_id, "a later publish step failed")


def commit(lake: Lake, warehouse: Warehouse, cache: CandidateCache, run: RunRef, stages: Stages, staged: Staged) -> None:
    """One warehouse transaction that switches the cache pointer before it commits, then the lake partitions.

    A failure before the commit leaves everything as it was; a failure of the partitions after it retracts
    the publication (warehouse and cache pointer back to the run before) and raises.
    """
    def switch_pointer() -> None:
        cache.switch_current(run.run_id)
        fault_point("publish", run.settings.fault_pause_at, Path(run.settings.home) / "faults")  # switched, not committed

    candidates = lake.read_parquet(stages.candidates.uri, "user_candidates")
    try:  # DuckDB / COPY consume item_scores batch by batch: the warehouse never gets the whole table at once
        record = run_record(run, stages, stages.seconds())
        warehouse.publish(record.row(), arrow_stream(lake, stages.scored.uri, "item_scores"),
                          candidates.to_arrow(), before_commit=switch_pointer)
    except BaseException:
        unstage_cache(cache, run.run_id, staged.old_pointer)
        raise
    try:
        write_partitions(lake, {"item_scores": stages.scored.uri, "user_candidates": candidates.to_arrow()})
    except BaseException as exc:
        retract(warehouse, cache, run.run_id, f"lake partitions failed: {type(exc).__name__}: {exc}")
        raise


def arrow_stream(lake: Lake, uri: str, dataset: str) -> pa.RecordBatchReader:
    """Return the Parquet file at uri as an Arrow stream of BATCH_ROWS-row batches, read as it is consumed."""
    frames = lake.iter_frames(uri, dataset, batch_size=BATCH_ROWS)
    first = next(frames, None)
    if first is None:
        return pa.RecordBatchReader.from_batches(lake.read_parquet(uri, dataset).to_arrow().schema, [])
    head = first.to_arrow()
    rest = (batch for frame in frames for batch in frame.to_arrow().to_batches())
    return pa.RecordBatchReader.from_batches(head.schema, itertools.chain(head.to_batches(), rest))


def write_partitions(lake: Lake, tables: dict[str, pa.Table | str]) -> list[str]:
    """Write published tables as Hive partitions <lake>/outputs/<table>/run_date=YYYY-MM-DD/part-0.parquet.

    A table is an Arrow table or the URI of its Parquet file in the lake (DuckDB then streams it from the lake).
    Written by one plain DuckDB COPY per run_date (through the lake's s3fs on S3; storage/duckdb_lake.py) and
    moved into place, so a re-publish of the same date replaces each file whole.
    """
    with duckdb_lake.connect(lake) as con:
        return [uri for table, rows in tables.items() for uri in duckdb_lake.write_partitions(con, lake, table, rows)]


def run_record(run: RunRef, stages: Stages, stage_seconds: dict[str, float]) -> RunRecord:
    """Return the scoring_runs row of a run from its stages' results."""
    encoded, validated, candidates = stages.encoded, stages.validated, stages.candidates
    finished = datetime.now(timezone.utc)
    started = datetime.fromisoformat(run.started_at)
    return RunRecord(
        run_id=run.run_id, flow_run_id=str(flow_run.get_id()), flow_name=run.flow_name, run_date=run.run_date,
        status="published", started_at=started, finished_at=finished, rows_in=validated.rows_in,
        rows_quarantined=validated.rows_quarantined, rows_scored=stages.scored.rows_scored,
        rows_reused=encoded.rows_reused, rows_computed=encoded.rows_computed, shards_reused=encoded.shards_reused,
        interactions_in=validated.interactions_in, interactions_quarantined=validated.interactions_quarantined,
        users_with_candidates=candidates.users_with_candidates, recall_at_k=candidates.recall_at_k,
        ndcg_at_10=candidates.ndcg_at_10, popularity_recall_at_k=candidates.popularity_recall_at_k,
        popularity_ndcg_at_10=candidates.popularity_ndcg_at_10, real_tokens=encoded.real_tokens,
        padded_tokens=encoded.padded_tokens, padding_efficiency=encoded.padding_efficiency,
        truncated_texts=encoded.truncated, texts_per_s=encoded.texts_per_s,
        wall_seconds=(finished - started).total_seconds(), device=encoded.device, model_version=encoded.model_version,
        contract_versions=CONTRACT_VERSIONS, stage_seconds=json.dumps(stage_seconds),
        data_docs=json.dumps({**validated.data_docs, **stages.checked.data_docs}))
