"""Dataset suites (Great Expectations) at both ends of a run, against the previous published run's stats.

Shared by the `validate` and `validate-outputs` nodes. Each gate validates a dataset's `DatasetView` (its
aggregates, gathered while the node streamed the dataset for its row contracts), writes GX Data Docs under the
run's folder (``contracts/docs/<dataset>/index.html``: built in a local temporary folder, then copied into the
lake, so they land on S3 with an s3:// lake), every expectation's outcome (``contracts/<dataset>.results.json``,
what the run's contracts artifact shows) and the stats the next run compares against
(``contracts/<dataset>.stats.json``). A failed expectation fails the run with exit code 3.

GX copies its ~4 MB of static assets (images, fonts, styles) into every site; they are kept once per GX version
under ``<lake>/contracts/docs-static/<version>/`` instead, and the pages link there by relative paths (which
work on a local lake, over HTTP from the lake root, and on S3 behind a static site).
"""

from __future__ import annotations

import logging
import posixpath
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from core.errors import ContractViolation
from core.records import RunRef
from data_contracts.dataset_view import DatasetView
from data_contracts.datasets import DatasetReport, SuiteParams, render_failures, validate_dataset
from storage.lake import Lake
from storage.published_stats import published_stats
from storage.warehouse.base import Warehouse

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SuiteResults:
    """The gate's outcome: Data Docs and suite version per dataset, and its seconds."""

    data_docs: dict[str, str]
    suite_versions: dict[str, str]
    seconds: float


def docs_uri(lake: Lake, run: RunRef, dataset: str) -> str:
    """Return the lake folder of a dataset's Data Docs for this run (a plain absolute path on a local lake)."""
    uri = run.path(f"contracts/docs/{dataset}")
    return str(lake.fs._strip_protocol(uri)) if lake.is_local else uri


def validate_into_lake(
    lake: Lake, run: RunRef, dataset: str, view: DatasetView, previous: dict[str, float] | None, params: SuiteParams
) -> DatasetReport:
    """Validate a run's dataset view; build its Data Docs in a local temporary folder, copy its pages into the lake."""
    with tempfile.TemporaryDirectory(prefix=f"nightscore-docs-{dataset}-") as local:
        report = validate_dataset(dataset, view, previous, params, docs_dir=local)
        share_static_assets(lake, Path(local), run.path(f"contracts/docs/{dataset}"))
        lake.put_dir(local, docs_uri(lake, run, dataset))
    return replace(report, docs_path=f"{docs_uri(lake, run, dataset)}/index.html")


def shared_static_uri(lake: Lake) -> str:
    """Return the lake folder of the Data Docs assets of this GX version, shared by every run."""
    import great_expectations

    return lake.uri("contracts", "docs-static", str(great_expectations.__version__))


_STATIC_REF = re.compile(r"""(?<=["'(])(?:\./|(?:\.\./)*)static/""")


def share_static_assets(lake: Lake, site: Path, site_uri: str) -> None:
    """Move a local GX site's static/ folder to the lake's shared one (uploaded once) and point its pages there."""
    static = site / "static"
    if not static.is_dir():
        return
    shared = shared_static_uri(lake)
    marker = f"{shared}/.complete"
    if not lake.exists(marker):  # the marker is written last: a half-uploaded copy is uploaded again
        lake.put_dir(static, shared)
        lake.write_bytes(b"", marker)
    shutil.rmtree(static)
    shared_path = lake.fs._strip_protocol(shared)
    for page in site.rglob("*.html"):
        folder = lake.fs._strip_protocol(posixpath.join(site_uri, page.parent.relative_to(site).as_posix()))
        prefix = posixpath.relpath(shared_path, posixpath.normpath(folder)) + "/"
        page.write_text(_STATIC_REF.sub(prefix, page.read_text(encoding="utf-8")), encoding="utf-8")


def write_outcomes(lake: Lake, run: RunRef, report: DatasetReport) -> str:
    """Write a dataset's expectation outcomes (suite version, success, each expectation) to the run folder; return the URI."""
    document = {
        "dataset": report.dataset,
        "suite_version": report.suite_version,
        "success": report.success,
        "outcomes": [asdict(outcome) for outcome in report.outcomes],
    }
    return lake.write_json(document, run.path(f"contracts/{report.dataset}.results.json"))


def gate(
    lake: Lake, warehouse: Warehouse, run: RunRef, views: dict[str, DatasetView], expected_users: int | None = None
) -> SuiteResults:
    """Validate each dataset's view against its suite; raise ContractViolation naming each failed expectation."""
    started, params = time.perf_counter(), SuiteParams.from_settings(run.settings, expected_users)
    docs, versions, failed = {}, {}, []
    previous = published_stats(lake, warehouse, views).stats
    for dataset, view in views.items():
        report = validate_into_lake(lake, run, dataset, view, previous[dataset], params)
        lake.write_json(report.statistics, run.path(f"contracts/{dataset}.stats.json"))
        write_outcomes(lake, run, report)
        docs[dataset], versions[dataset] = str(report.docs_path), report.suite_version
        if not report.success:
            failed.append(render_failures(report))
    log.info("dataset suites %s: %s; Data Docs %s", ",".join(views), "failed" if failed else "passed", docs)
    if failed:
        raise ContractViolation("dataset suite failed: " + " | ".join(failed))
    return SuiteResults(docs, versions, time.perf_counter() - started)
