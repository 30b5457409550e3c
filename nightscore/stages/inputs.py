"""Stages before the model: demo inputs, ingest snapshot, row contracts with quarantine."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from datetime import timedelta

import polars as pl

from data_contracts.inputs import (
    INTERACTION_COLUMNS, ITEM_COLUMNS, InputRules, conform, validate_interactions, validate_items,
)
from data_contracts.quarantine import require_columns, REQUIRED_COLUMNS
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


def ingest(lake: Lake, run: RunContext, settings: Settings) -> dict[str, object]:
    """Snapshot both inputs into the run folder with contract types; return their row counts.

    Produces ``ingest/items.parquet`` and ``ingest/interactions.parquet``. A file that cannot be
    read, is empty, lacks a required column or has a column of an uncoercible type raises
    InputUnreadable (exit 3) naming the file.
    """
    started = time.perf_counter()
    counts: dict[str, object] = {}
    for dataset, uri, columns in (
        ("items", run.items_uri, ITEM_COLUMNS), ("interactions", run.interactions_uri, INTERACTION_COLUMNS)
    ):
        raw = lake.read_parquet(uri, dataset, columns=list(columns))
        require_columns(raw, REQUIRED_COLUMNS[dataset], dataset, uri)
        if raw.height == 0:
            raise InputUnreadable(f"{dataset} file {uri}: no rows")
        lake.write_parquet(conform(raw, columns, dataset, uri), run.path(f"ingest/{dataset}.parquet"))
        counts[f"{dataset}_in"] = raw.height
    counts["seconds"] = time.perf_counter() - started
    fault_point("ingest", settings.fault_pause_at, Path(str(settings.home)) / "faults")
    return counts


def validate_inputs(lake: Lake, run: RunContext, settings: Settings) -> dict[str, object]:
    """Apply the row contracts; write valid rows and quarantine; fail if too much is quarantined.

    Produces ``valid/items.parquet``, ``valid/interactions.parquet`` and ``quarantine.parquet``.
    """
    started = time.perf_counter()
    rules = InputRules(
        not_after=run.reference_time + timedelta(hours=settings.future_tolerance_hours),
        max_text_chars=settings.max_text_chars,
    )
    items_in = lake.read_parquet(run.path("ingest/items.parquet"), "items")
    items, q_items = validate_items(items_in, rules, run.items_uri)
    inter_in = lake.read_parquet(run.path("ingest/interactions.parquet"), "interactions")
    interactions, q_inter = validate_interactions(inter_in, items.get_column("item_id"), rules, run.interactions_uri)
    lake.write_parquet(items, run.path("valid/items.parquet"))
    lake.write_parquet(interactions, run.path("valid/interactions.parquet"))
    lake.write_parquet(pl.concat([q_items, q_inter]), run.path("quarantine.parquet"))
    counts = {
        "rows_in": items_in.height, "rows_quarantined": items_in.height - items.height,
        "interactions_in": inter_in.height, "interactions_quarantined": inter_in.height - interactions.height,
        "users": interactions.get_column("user_id").n_unique(), "seconds": time.perf_counter() - started,
    }
    enforce_quarantine_share(counts, settings.quarantine_max_share, q_items, q_inter)
    return counts


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
