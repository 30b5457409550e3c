"""Dataset-level gates (Great Expectations suites) at both ends of a run, against the previous published run.

Each gate validates what the stage wrote, streamed into a `DatasetView` (a seeded sample above 200k rows
for the per-row expectations, whole-dataset aggregates for the rest; GX reads pandas),
writes GX Data Docs under the run's folder (``contracts/docs/<dataset>/index.html``; GX builds them in a
local temporary folder, then they are copied into the lake, so they land on S3 with an s3:// lake) and the
stats the next run compares against (``contracts/<dataset>.stats.json``). A failed expectation fails the run
with exit code 3.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import replace


from data_contracts.dataset_view import DatasetView, stream_view, view_of
from data_contracts.datasets import DatasetReport, SuiteParams, render_failures, validate_dataset
from nightscore.errors import ContractViolation
from nightscore.run_context import RunContext
from nightscore.settings import Settings
from nightscore.stages.runs import latest_published_folder
from storage.lake import Lake
from storage.warehouse import Warehouse

log = logging.getLogger(__name__)

FILES = {"items": "valid/items.parquet", "interactions": "valid/interactions.parquet",
         "item_scores": "item_scores.parquet", "user_candidates": "user_candidates.parquet"}


def suite_params(settings: Settings, expected_users: int | None = None) -> SuiteParams:
    """Return the suites' parameters from settings."""
    return SuiteParams(
        row_count_band=settings.row_count_band, topic_share_tolerance=settings.topic_share_tolerance,
        mean_topic_score_tolerance=settings.mean_topic_score_tolerance, top_k=settings.top_k,
        min_user_coverage=settings.min_user_coverage, topic_labels=tuple(settings.topic_labels),
        events=tuple(settings.event_weights), expected_users=expected_users,
    )


def previous_stats(lake: Lake, warehouse: Warehouse, dataset: str) -> dict[str, float] | None:
    """Return a dataset's stats from the latest published run, or None for a first run."""
    latest = latest_published_folder(lake, warehouse)
    return None if latest is None else lake.read_json(f"{latest[1]}/contracts/{dataset}.stats.json")


def docs_uri(lake: Lake, run: RunContext, dataset: str) -> str:
    """Return the lake folder of a dataset's Data Docs for this run (a plain absolute path on a local lake)."""
    uri = run.path(f"contracts/docs/{dataset}")
    return lake.fs._strip_protocol(uri) if lake.is_local else uri


SUITE_BATCH = 8_192  # rows per batch: an embedding's norm is computed in float64 lists, ~8x the vectors' bytes
SAMPLE_ROWS = 200_000  # above this many rows, the per-row expectations read a seeded sample


def suite_view(lake: Lake, uri: str, dataset: str) -> DatasetView:
    """Return a dataset as its suite reads it, streamed: the row sample, the row count and the aggregates.

    Only the sample (at most SAMPLE_ROWS rows, embeddings replaced by their norms batch by batch) and a few
    small tables stay in memory, never the dataset's rows.
    """
    height = lake.parquet_rows(uri)
    if height == 0:
        return view_of(lake.read_parquet(uri, dataset), SAMPLE_ROWS)
    batches = lake.iter_frames(uri, dataset, batch_size=SUITE_BATCH)
    return stream_view(batches, height, SAMPLE_ROWS)


def validate_into_lake(lake: Lake, run: RunContext, dataset: str, previous: dict[str, float] | None,
                       params: SuiteParams) -> DatasetReport:
    """Validate a run's dataset; build its Data Docs in a local temporary folder, copy them into the lake.

    The report's docs_path is the index.html in the lake.
    """
    view = suite_view(lake, run.path(FILES[dataset]), dataset)
    with tempfile.TemporaryDirectory(prefix=f"nightscore-docs-{dataset}-") as local:
        report = validate_dataset(dataset, view, previous, params, docs_dir=local)
        lake.put_dir(local, docs_uri(lake, run, dataset))
    return replace(report, docs_path=f"{docs_uri(lake, run, dataset)}/index.html")


def gate(lake: Lake, warehouse: Warehouse, run: RunContext, settings: Settings, datasets: list[str],
         expected_users: int | None = None) -> dict[str, object]:
    """Validate datasets against their suites; raise ContractViolation naming each failed expectation."""
    started, params = time.perf_counter(), suite_params(settings, expected_users)
    docs, versions, failed = {}, {}, []
    for dataset in datasets:
        report = validate_into_lake(lake, run, dataset, previous_stats(lake, warehouse, dataset), params)
        lake.write_json(report.statistics, run.path(f"contracts/{dataset}.stats.json"))
        docs[dataset], versions[dataset] = report.docs_path, report.suite_version
        if not report.success:
            failed.append(render_failures(report))
    log.info("dataset suites %s: %s; Data Docs %s", ",".join(datasets), "failed" if failed else "passed", docs)
    if failed:
        raise ContractViolation("dataset suite failed: " + " | ".join(failed))
    return {"docs": docs, "suite_versions": versions, "seconds": time.perf_counter() - started}
