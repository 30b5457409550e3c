"""The `validate-inputs` node: row contracts with quarantine, then the inputs' dataset suites.

Produces ``valid/items.parquet``, ``valid/interactions.parquet`` and ``quarantine.parquet``. Rows are read
once: each batch goes through its pandera contract, its valid rows are written and folded into the dataset
view the suites read. Whole-file rules run on ids only: duplicated item_ids (one pass over the id and created_at
columns, by NIGHTSCORE_DUPLICATE_ID_POLICY) and interactions of valid items.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import polars as pl
from prefect import task
from prefect.cache_policies import NO_CACHE

from core.errors import ContractViolation
from core.records import Ingested, RunRef, Validated
from data_contracts.dataset_view import DatasetView, ViewBuilder
from data_contracts.inputs import InputRules, duplicate_rows, validate_interactions, validate_items
from data_contracts.quarantine import empty_quarantine
from storage import publication
from storage.lake import Lake
from storage.resources import lake_for, warehouse_for
from tasks.ingest import INPUT_BATCH
from tasks.suites import gate

Validator = Callable[[pl.DataFrame, int], tuple[pl.DataFrame, pl.DataFrame]]


@task(name="validate-inputs", cache_policy=NO_CACHE)
def validate_inputs(run: RunRef, ingested: Ingested) -> Validated:
    """Produce valid/items, valid/interactions and quarantine; record quarantine rows even when the run fails."""
    started = time.perf_counter()
    lake, warehouse = lake_for(run.settings), warehouse_for(run.settings, run.embedding_dim)
    try:
        items, interactions = apply_row_contracts(lake, run, ingested)
        enforce_quarantine_share(items, interactions, run.settings.contracts.quarantine_max_share)
    except ContractViolation:
        publication.record_quarantine(lake, warehouse, run)
        raise
    suites = gate(lake, warehouse, run, {"items": items.view(), "interactions": interactions.view()})
    return Validated(
        run.path("valid/items.parquet"),
        run.path("valid/interactions.parquet"),
        run.path("quarantine.parquet"),
        items.rows_in,
        items.rows_in - items.rows_valid,
        interactions.rows_in,
        interactions.rows_in - interactions.rows_valid,
        interactions.kept("user_id").n_unique(),
        suites.data_docs,
        suites.suite_versions,
        time.perf_counter() - started,
    )


def apply_row_contracts(lake: Lake, run: RunRef, ingested: Ingested) -> tuple[RowContract, RowContract]:
    """Validate both inputs batch by batch; write their valid rows and the quarantine; return what each pass kept."""
    rules = InputRules(
        not_after=run.reference_time + timedelta(hours=run.settings.contracts.future_tolerance_hours),
        max_text_chars=run.settings.contracts.max_text_chars,
        duplicate_policy=run.settings.contracts.duplicate_id_policy,
    )
    ids = lake.read_parquet(ingested.items_uri, "items", columns=["item_id", "created_at"])  # id columns only
    duplicates = duplicate_rows(ids, rules.duplicate_policy)
    items = RowContract(lambda raw, offset: validate_items(raw, rules, run.items_uri, offset, duplicates), ["item_id"])
    items.write(lake, batches_of(lake, ingested.items_uri, "items"), run.path("valid/items.parquet"))
    valid_ids = items.kept("item_id")
    interactions = RowContract(
        lambda raw, offset: validate_interactions(raw, valid_ids, rules, run.interactions_uri, offset), ["user_id"]
    )
    interactions.write(lake, batches_of(lake, ingested.interactions_uri, "interactions"), run.path("valid/interactions.parquet"))
    lake.write_parquet(pl.concat([items.quarantine(), interactions.quarantine()]), run.path("quarantine.parquet"))
    return items, interactions


def batches_of(lake: Lake, uri: str, dataset: str) -> Iterator[pl.DataFrame]:
    """Yield a file's frames of INPUT_BATCH rows; an empty file (an interactions file may be) yields itself once."""
    empty = True
    for batch in lake.iter_frames(uri, dataset, batch_size=INPUT_BATCH):
        empty = False
        yield batch
    if empty:  # its columns still reach the valid file, the kept ids and the suites' view
        yield lake.read_parquet(uri, dataset)


class RowContract:
    """One dataset's pass through its row contract: counts, quarantine rows, kept key columns, the suites' view."""

    def __init__(self, validate: Validator, keep: list[str]) -> None:
        self.rows_in = self.rows_valid = 0
        self._validate, self._keep = validate, keep
        self._kept: dict[str, list[pl.Series]] = {name: [] for name in keep}
        self._quarantine: list[pl.DataFrame] = []
        self._view = ViewBuilder()

    def write(self, lake: Lake, batches: Iterator[pl.DataFrame], uri: str) -> None:
        """Write the valid rows of every batch to uri (one row group per batch)."""
        lake.write_parquet_frames(self._valid(batches), uri)

    def _valid(self, batches: Iterator[pl.DataFrame]) -> Iterator[pl.DataFrame]:
        for raw in batches:
            valid, quarantine = self._validate(raw, self.rows_in)
            self.rows_in, self.rows_valid = self.rows_in + raw.height, self.rows_valid + valid.height
            self._quarantine.append(quarantine)
            for name in self._keep:
                self._kept[name].append(valid.get_column(name))
            yield self._view.add(valid)

    def kept(self, name: str) -> pl.Series:
        """Return a kept column of every valid row, batch after batch (concatenated once)."""
        return pl.concat(self._kept[name])

    def quarantine(self) -> pl.DataFrame:
        """Return every quarantine row, batch after batch."""
        return pl.concat(self._quarantine) if self._quarantine else empty_quarantine()

    def view(self) -> DatasetView:
        """Return the valid rows' aggregates, as the dataset suite reads them."""
        return self._view.view()


def enforce_quarantine_share(items: RowContract, interactions: RowContract, limit: float) -> None:
    """Raise ContractViolation when a dataset's quarantined share exceeds the limit."""
    for dataset, contract in (("items", items), ("interactions", interactions)):
        bad, total = contract.rows_in - contract.rows_valid, contract.rows_in
        share = bad / total if total else 0.0
        if share > limit:
            quarantine = contract.quarantine()
            top = quarantine.group_by("rule").len().sort("len", descending=True).row(0) if quarantine.height else ("-", 0)
            raise ContractViolation(
                f"{dataset}: {bad} of {total} rows quarantined ({share:.1%} > {limit:.1%}); "
                f"most common rule {top[0]} ({top[1]} rows)"
            )
