"""Dataset suites (Great Expectations) at both ends of a run, against the previous published run's stats.

Shared by the `validate` and `validate-outputs` nodes. Each gate validates a dataset's `DatasetView` (its
aggregates, gathered while the node streamed the dataset for its row contracts), writes GX Data Docs under the
run's folder (``contracts/docs/<dataset>/index.html``: built in a local temporary folder, then copied into the
lake, so they land on S3 with an s3:// lake) and the stats the next run compares against
(``contracts/<dataset>.stats.json``). A failed expectation fails the run with exit code 3.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass, replace

from data_contracts.dataset_view import DatasetView
from data_contracts.datasets import DatasetReport, SuiteParams, render_failures, validate_dataset
from nightscore.errors import ContractViolation
from nightscore.run_context import run_folder
from storage.lake import Lake
from storage.warehouse import Warehouse
from tasks.results import RunRef

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SuiteResults:
    """The gate's outcome: Data Docs and suite version per dataset, and its seconds."""

    data_docs: dict[str, str]
    suite_versions: dict[str, str]
    seconds: float


def previous_stats(lake: Lake, warehouse: Warehouse, dataset: str) -> dict[str, float] | None:
    """Return a dataset's stats from the latest published run, or None for a first run."""
    latest = warehouse.latest_published()
    if latest is None:
        return None
    return lake.read_json(f"{run_folder(lake.uri, latest.run_date, latest.run_id)}/contracts/{dataset}.stats.json")


def docs_uri(lake: Lake, run: RunRef, dataset: str) -> str:
    """Return the lake folder of a dataset's Data Docs for this run (a plain absolute path on a local lake)."""
    uri = run.path(f"contracts/docs/{dataset}")
    return str(lake.fs._strip_protocol(uri)) if lake.is_local else uri


def validate_into_lake(lake: Lake, run: RunRef, dataset: str, view: DatasetView, previous: dict[str, float] | None,
                       params: SuiteParams) -> DatasetReport:
    """Validate a run's dataset view; build its Data Docs in a local temporary folder, copy them into the lake."""
    with tempfile.TemporaryDirectory(prefix=f"nightscore-docs-{dataset}-") as local:
        report = validate_dataset(dataset, view, previous, params, docs_dir=local)
        lake.put_dir(local, docs_uri(lake, run, dataset))
    return replace(report, docs_path=f"{docs_uri(lake, run, dataset)}/index.html")


def gate(lake: Lake, warehouse: Warehouse, run: RunRef, views: dict[str, DatasetView],
         expected_users: int | None = None) -> SuiteResults:
    """Validate each dataset's view against its suite; raise ContractViolation naming each failed expectation."""
    started, params = time.perf_counter(), SuiteParams.from_settings(run.settings, expected_users)
    docs, versions, failed = {}, {}, []
    for dataset, view in views.items():
        report = validate_into_lake(lake, run, dataset, view, previous_stats(lake, warehouse, dataset), params)
        lake.write_json(report.statistics, run.path(f"contracts/{dataset}.stats.json"))
        docs[dataset], versions[dataset] = str(report.docs_path), report.suite_version
        if not report.success:
            failed.append(render_failures(report))
    log.info("dataset suites %s: %s; Data Docs %s", ",".join(views), "failed" if failed else "passed", docs)
    if failed:
        raise ContractViolation("dataset suite failed: " + " | ".join(failed))
    return SuiteResults(docs, versions, time.perf_counter() - started)
