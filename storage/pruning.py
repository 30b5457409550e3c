"""Pruning across the warehouse and the lake: old runs' rows, then their run folders, serving features and partitions.

The warehouse decides what is old (`Warehouse.prune_runs`: the keep rules, never the latest published run nor a run
whose attempt holds a live lease); the lake then loses those runs' folders (``runs/<date>/<run_id>/``: inputs'
snapshots, shards, scores, Data Docs pages), their serving features (``serving/<run_id>/``), the folders of failed
attempts and of replaced runs a later publication superseded, and the partitions of run dates no published run is left for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from core.run_context import run_folder
from storage import duckdb_lake
from storage.lake import Lake
from storage.warehouse.base import Warehouse

log = logging.getLogger(__name__)

PARTITIONED_TABLES = ("item_scores", "user_candidates")


@dataclass(frozen=True)
class PruneReport:
    """What a prune removed: runs in the warehouse, folders and bytes in the lake."""

    runs: int
    folders: int
    bytes_freed: int


def prune(warehouse: Warehouse, lake: Lake, keep_runs: int | None, keep_days: int | None) -> PruneReport:
    """Prune old runs' rows in the warehouse, then the lake folders and partitions nothing needs any more."""
    pruned = warehouse.prune_runs(keep_runs, keep_days)
    folders, freed = 0, 0
    for run_id, run_date in pruned.folders:
        for uri in (run_folder(lake.uri, run_date, run_id), lake.uri("serving", run_id)):
            size = lake.remove_tree(uri)
            folders, freed = folders + (size > 0), freed + size
    for run_date in pruned.dates_gone:
        for table in PARTITIONED_TABLES:
            duckdb_lake.remove_partition(lake, table, run_date)
    log.info("pruned %d run(s); removed %d lake folder(s), %d bytes", pruned.runs, folders, freed)
    return PruneReport(pruned.runs, folders, freed)
