"""The `ingest` node: a typed snapshot of the run's inputs in its folder (ingest/items.parquet, ingest/interactions.parquet)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from itertools import chain

import polars as pl
from prefect import task
from prefect.cache_policies import NO_CACHE

from core import failpoints
from core.errors import InputUnreadable
from core.records import Ingested, RunRef
from data_contracts.inputs import INTERACTION_COLUMNS, ITEM_COLUMNS, conform
from data_contracts.quarantine import MAY_BE_EMPTY, REQUIRED_COLUMNS, require_columns
from storage.events import ingested_partitions
from storage.lake import Lake
from storage.resources import lake_for
from tasks.retries import IO_RETRIES, IO_RETRY_DELAYS, is_transient

INPUT_BATCH = 65_536  # input rows per batch: ingest and the row contracts stream a file this many rows at a time


@task(
    name="ingest", cache_policy=NO_CACHE, retries=IO_RETRIES, retry_delay_seconds=IO_RETRY_DELAYS, retry_condition_fn=is_transient
)
def ingest(run: RunRef) -> Ingested:
    """Produce the run's input snapshot, streamed in batches of INPUT_BATCH rows, with the contracts' column types.

    A file that cannot be read, is empty (an items file; interactions may be), lacks a required column or has a
    column of an uncoercible type raises InputUnreadable (exit 3) naming the file.
    """
    started, lake = time.perf_counter(), lake_for(run.settings)
    events = ingested_partitions(lake, run.date)  # the online service's exported events (storage/events.py)
    counts = {
        dataset: snapshot(lake, dataset, uri, columns, run.path(f"ingest/{dataset}.parquet"), extra)
        for dataset, uri, columns, extra in (
            ("items", run.items_uri, ITEM_COLUMNS, []),
            ("interactions", run.interactions_uri, INTERACTION_COLUMNS, events),
        )
    }
    failpoints.hit("ingest", run.settings)
    return Ingested(
        run.path("ingest/items.parquet"),
        run.path("ingest/interactions.parquet"),
        counts["items"],
        counts["interactions"],
        time.perf_counter() - started,
    )


def snapshot(
    lake: Lake, dataset: str, uri: str, columns: dict[str, pl.DataType], target: str, extra: list[str] | None = None
) -> int:
    """Write an input file's contract columns (then those of the extra files), conformed batch by batch, to target;
    return the row count."""
    rows = [0]
    frames = chain(*(_conformed(lake, dataset, u, columns, rows) for u in [uri, *(extra or [])]))
    lake.write_parquet_frames(frames, target, pl.Schema(columns))
    return rows[0]


def _conformed(lake: Lake, dataset: str, uri: str, columns: dict[str, pl.DataType], rows: list[int]) -> Iterator[pl.DataFrame]:
    """Yield an input file's batches with contract types, counting rows into rows[0]; empty -> InputUnreadable."""
    for raw in lake.iter_frames(uri, dataset, columns=list(columns), batch_size=INPUT_BATCH):
        require_columns(raw, REQUIRED_COLUMNS[dataset], dataset, uri)
        rows[0] += raw.height
        yield conform(raw, columns, dataset, uri)
    if rows[0] == 0:  # no batch at all: the whole (empty) file says which rule it breaks first
        require_columns(lake.read_parquet(uri, dataset, columns=list(columns)), REQUIRED_COLUMNS[dataset], dataset, uri)
        if dataset not in MAY_BE_EMPTY:
            raise InputUnreadable(f"{dataset} file {uri}: no rows")
