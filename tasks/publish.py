"""The `stage-cache` and `publish` nodes: the publication protocol of storage/publication.py inside a Prefect transaction.

`stage_cache` and `publish` run inside one Prefect transaction with `publish_serving_node` (flows/pipeline.py), each
with an on_rollback hook, so a failing step undoes the ones before it: the staged cache version is dropped, and a
committed publication is withdrawn. A step undoes its own partial work itself (Prefect runs a task's rollback hook only
once the task has succeeded). Only when the whole transaction commits (`publish`'s on_commit hook) is the publication
finalized, so every failure point before can go back to the run before.

No Prefect retries here: in Prefect 3.9 a failed attempt inside a transaction rolls back the steps before it even
when a retry then succeeds. Lock contention is retried inside the warehouse adapter, transport errors of the cache
and the lake inside theirs.
"""

from __future__ import annotations

import json
import logging
import time

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.transactions import Transaction, get_transaction

from core.errors import NightscoreError
from core.records import Candidates, Checked, Published, RunRef, Staged, Stages
from data_contracts.inputs import INTERACTIONS_CONTRACT, ITEMS_CONTRACT
from data_contracts.outputs import ITEM_SCORES_CONTRACT, USER_CANDIDATES_CONTRACT
from storage import leases, publication
from storage.resources import cache_for, lake_for, warehouse_for

log = logging.getLogger(__name__)

CONTRACT_VERSIONS = ",".join([ITEMS_CONTRACT, INTERACTIONS_CONTRACT, ITEM_SCORES_CONTRACT, USER_CANDIDATES_CONTRACT])


def _remember(**values: object) -> None:
    """Keep values on this task's transaction for its rollback and commit hooks."""
    txn = get_transaction()
    if txn is not None:
        for key, value in values.items():
            txn.set(key, value)


@task(name="stage-cache", cache_policy=NO_CACHE)
def stage_cache(run: RunRef, candidates: Candidates, checked: Checked) -> Staged:
    """Produce the run's cache version (not yet visible to readers); return its size and the pointer before it."""
    with cache_for(run.settings) as cache:
        written, old_pointer = publication.stage(lake_for(run.settings), cache, run.run_id, candidates.entries_uri)
    _remember(run=run)
    return Staged(written, old_pointer)


@stage_cache.on_rollback
def _drop_staged_version(txn: Transaction) -> None:
    run: RunRef = txn.get("run")
    with cache_for(run.settings) as cache:  # the pointers are publish's to put back; the version goes unless served
        publication.drop_unless_current(cache, run.run_id)
    log.warning("rolled back the staged cache version of %s", run.run_id)


@task(name="publish", cache_policy=NO_CACHE)
def publish(run: RunRef, stages: Stages, staged: Staged) -> Published:
    """Publish the run's item_scores and user_candidates (warehouse transaction + cache pointer + partitions)."""
    started, cfg, flow_run_id = time.perf_counter(), run.settings, str(flow_run.get_id())
    lake, warehouse = lake_for(cfg), warehouse_for(cfg, run.embedding_dim)
    publication.record_quarantine(lake, warehouse, run)
    lease = leases.held_by(flow_run_id)
    record = publication.run_record(run, stages, stages.seconds(), flow_run_id, CONTRACT_VERSIONS)
    with cache_for(cfg) as cache:
        before = publication.commit(lake, warehouse, cache, run, record, lease.fence if lease else None)
    _remember(run=run, before=before)
    seconds = {**stages.seconds(), "publish": round(time.perf_counter() - started, 3)}
    record = publication.run_record(run, stages, seconds, flow_run_id, CONTRACT_VERSIONS)
    warehouse.record_run({name: getattr(record, name) for name in ("run_id", "finished_at", "wall_seconds", "stage_seconds")})
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
def _withdraw_publication(txn: Transaction) -> None:
    run: RunRef = txn.get("run")
    publication.withdraw(run, txn.get("before"), "a later publish step failed")


@publish.on_commit
def _finalize_publication(txn: Transaction) -> None:
    """The whole publication stuck: delete the rows of the same-date run it replaced, retire old cache versions."""
    run: RunRef = txn.get("run")
    try:
        with cache_for(run.settings) as cache:
            deleted, retiring = publication.finalize(warehouse_for(run.settings), cache, run.run_id)
    except NightscoreError as exc:  # leftovers go at the next publication of the date; never fail a published run
        log.warning("publication of %s stuck, but its clean-up did not: %s", run.run_id, exc)
        return
    log.info(
        "publication of %s final: %d replaced rows deleted, old versions retiring: %s",
        run.run_id,
        deleted,
        ", ".join(retiring) or "none",
    )
