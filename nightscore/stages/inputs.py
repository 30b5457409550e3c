"""Stages before the model: demo inputs, ingest snapshot, row contracts with quarantine."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from datetime import timedelta

import polars as pl

from data_contracts.inputs import (
    INTERACTION_COLUMNS, ITEM_COLUMNS, InputRules, conform, duplicated_item_ids, validate_interactions, validate_items,
)
from data_contracts.quarantine import REQUIRED_COLUMNS, empty_quarantine, require_columns
from nightscore.demo_data import generate_demo_data
from nightscore.errors import ContractViolation, InputUnreadable
from nightscore.run_context import RunContext
from nightscore.settings import Settings
from nightscore.stop import fault_point
from storage.lake import Lake

log = logging.getLogger(__name__)


def ensure_demo_inputs(lake: Lake, n_items: int = 2000, n_users: int = 500, seed: int = 0) -> tuple[str, str]:
    """Return (items URI, interactions URI) of the demo inputs in the lake, generating them if absent."""
    items_uri, inter_uri = lake.uri("inputs", "demo", "items.parquet"), lake.uri("inputs", "demo", "interactions.parquet")
    if not (lake.exists(items_uri) and lake.exists(inter_uri)):
        items, interactions = generate_demo_data(n_items, n_users, seed)
        lake.write_parquet(items, items_uri)
        lake.write_parquet(interactions, inter_uri)
        log.info("wrote demo inputs: %d items, %d interactions", items.height, interactions.height)
    return items_uri, inter_uri


INPUT_BATCH = 65_536  # input rows per batch: ingest and the row contracts stream a file this many rows at a time


def ingest(lake: Lake, run: RunContext, settings: Settings) -> dict[str, object]:
    """Snapshot both inputs into the run folder with contract types; return their row counts.

    Produces ``ingest/items.parquet`` and ``ingest/interactions.parquet``, streamed in batches of
    INPUT_BATCH rows. A file that cannot be read, is empty, lacks a required column or has a column of
    an uncoercible type raises InputUnreadable (exit 3) naming the file.
    """
    started = time.perf_counter()
    counts: dict[str, object] = {}
    for dataset, uri, columns in (
        ("items", run.items_uri, ITEM_COLUMNS), ("interactions", run.interactions_uri, INTERACTION_COLUMNS)
    ):
        rows = [0]
        lake.write_parquet_frames(_conformed(lake, dataset, uri, columns, rows), run.path(f"ingest/{dataset}.parquet"))
        counts[f"{dataset}_in"] = rows[0]
    counts["seconds"] = time.perf_counter() - started
    fault_point("ingest", settings.fault_pause_at, Path(str(settings.home)) / "faults")
    return counts


def _conformed(lake: Lake, dataset: str, uri: str, columns: dict[str, pl.DataType], rows: list[int]) -> Iterator[pl.DataFrame]:
    """Yield an input file's batches with contract types, counting rows into rows[0]; empty -> InputUnreadable."""
    for raw in lake.iter_frames(uri, dataset, columns=list(columns), batch_size=INPUT_BATCH):
        require_columns(raw, REQUIRED_COLUMNS[dataset], dataset, uri)
        rows[0] += raw.height
        yield conform(raw, columns, dataset, uri)
    if rows[0] == 0:  # no batch at all: the whole (empty) file says which rule it breaks first
        require_columns(lake.read_parquet(uri, dataset, columns=list(columns)), REQUIRED_COLUMNS[dataset], dataset, uri)
        raise InputUnreadable(f"{dataset} file {uri}: no rows")


def validate_inputs(lake: Lake, run: RunContext, settings: Settings) -> dict[str, object]:
    """Apply the row contracts batch by batch; write valid rows and quarantine; fail if too much is quarantined.

    Produces ``valid/items.parquet``, ``valid/interactions.parquet`` and ``quarantine.parquet``. Whole-file
    rules run on ids only: duplicated item_ids (one pass over the id column) and interactions of valid items.
    """
    started = time.perf_counter()
    rules = InputRules(
        not_after=run.reference_time + timedelta(hours=settings.future_tolerance_hours),
        max_text_chars=settings.max_text_chars,
    )
    items_uri, inter_uri = run.path("ingest/items.parquet"), run.path("ingest/interactions.parquet")
    duplicated = duplicated_item_ids(lake.read_parquet(items_uri, "items", columns=["item_id"]).get_column("item_id"))
    items = _Validated()
    lake.write_parquet_frames(items.run(lake.iter_frames(items_uri, "items", batch_size=INPUT_BATCH), lambda raw, offset:
        validate_items(raw, rules, run.items_uri, offset, duplicated), ["item_id"]), run.path("valid/items.parquet"))
    valid_ids = items.kept("item_id")
    inter = _Validated()
    lake.write_parquet_frames(inter.run(lake.iter_frames(inter_uri, "interactions", batch_size=INPUT_BATCH), lambda raw, offset:
        validate_interactions(raw, valid_ids, rules, run.interactions_uri, offset), ["user_id"]), run.path("valid/interactions.parquet"))
    q_items, q_inter = items.quarantine(), inter.quarantine()
    lake.write_parquet(pl.concat([q_items, q_inter]), run.path("quarantine.parquet"))
    counts = {
        "rows_in": items.rows_in, "rows_quarantined": items.rows_in - items.rows_valid,
        "interactions_in": inter.rows_in, "interactions_quarantined": inter.rows_in - inter.rows_valid,
        "users": inter.kept("user_id").n_unique(), "seconds": time.perf_counter() - started,
    }
    enforce_quarantine_share(counts, settings.quarantine_max_share, q_items, q_inter)
    return counts


class _Validated:
    """Counts, quarantine batches and kept key columns of one dataset validated batch by batch."""

    def __init__(self) -> None:
        self.rows_in = self.rows_valid = 0
        self._kept: dict[str, list[pl.Series]] = {}
        self._quarantine: list[pl.DataFrame] = []

    def run(self, batches: Iterator[pl.DataFrame], validate: Callable[[pl.DataFrame, int], tuple[pl.DataFrame, pl.DataFrame]],
            keep: list[str]) -> Iterator[pl.DataFrame]:
        """Yield the valid rows of each batch, keeping quarantine rows and the ``keep`` columns of valid rows."""
        for raw in batches:
            valid, quarantine = validate(raw, self.rows_in)
            self.rows_in, self.rows_valid = self.rows_in + raw.height, self.rows_valid + valid.height
            self._quarantine.append(quarantine)
            for name in keep:
                self._kept.setdefault(name, []).append(valid.get_column(name))
            yield valid

    def kept(self, name: str) -> pl.Series:
        """Return a kept column of every valid row, batch after batch (concatenated once)."""
        return pl.concat(self._kept[name])

    def quarantine(self) -> pl.DataFrame:
        """Return every quarantine row, batch after batch."""
        return pl.concat(self._quarantine) if self._quarantine else empty_quarantine()


def enforce_quarantine_share(counts: dict[str, object], limit: float, q_items: pl.DataFrame, q_inter: pl.DataFrame) -> None:
    """Raise ContractViolation when a dataset's quarantined share exceeds the limit."""
    for dataset, bad, total, q in (
        ("items", counts["rows_quarantined"], counts["rows_in"], q_items),
        ("interactions", counts["interactions_quarantined"], counts["interactions_in"], q_inter),
    ):
        share = bad / total if total else 0.0
        if share > limit:
            top = q.group_by("rule").len().sort("len", descending=True).row(0) if q.height else ("-", 0)
            raise ContractViolation(
                f"{dataset}: {bad} of {total} rows quarantined ({share:.1%} > {limit:.1%}); "
                f"most common rule {top[0]} ({top[1]} rows)"
            )
