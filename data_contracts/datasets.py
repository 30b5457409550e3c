"""Dataset-level contracts (Great Expectations 1.x): one versioned suite per dataset, checked against the last run.

Row-level rules (nulls, ranges, sets, uniqueness, unit-norm embeddings, ranks) are the pandera contracts'
(data_contracts/inputs.py, outputs.py); these suites check what no single row can tell: the dataset's size
against the previous successful run, the mean topic_score and each topic's share against it, and the share of
users served. Each rule lives in one place.

Suites are JSON files in ``data_contracts/suites/`` in GX's suite shape (``name``, ``meta.version``,
``expectations``). Run-dependent values are placeholders ``{"$param": "<name>"}`` filled from
`suite_params` (settings plus the previous successful run's `dataset_stats`); an expectation whose
``meta.requires`` names a parameter this run lacks (no previous run, no expected user count) is left out
of this run's suite. A placeholder naming an unknown parameter is a `UsageError`, never a silent skip.

``meta.table`` says which table an expectation reads, each built by polars from a `DatasetView`'s aggregates
(data_contracts/dataset_view.py, gathered while the stage streamed the dataset for its row contracts):

- ``full``: a column-less frame as tall as the whole dataset (the row count);
- ``summary`` (item_scores, one row: mean_topic_score);
- ``topic_shares`` (item_scores: topic, share, previous_share, share_delta);
- ``coverage`` (user_candidates, one row: n_users, expected_users, user_coverage).

GX reads pandas, not polars or DuckDB: each table is converted with ``to_pandas`` just before it is validated.
GX itself is imported inside the functions that use it (its import takes ~2 s), so importing this module is cheap.
Topic drift is checked as each topic's absolute share change rather than GX's KL-divergence expectation:
the share check names the drifted topic, and KL rises to +inf as soon as a topic vanishes.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from core.collector import imports_held
from core.errors import UsageError
from core.settings import DEFAULT_TOPIC_LABELS, Settings
from data_contracts.dataset_view import COUNT, DatasetView, view_of
from data_contracts.inputs import EVENTS
from data_contracts.quarantine import MAY_BE_EMPTY

if TYPE_CHECKING:
    import pandas as pd
    from great_expectations.core.expectation_validation_result import (
        ExpectationValidationResult,
    )
    from great_expectations.data_context import AbstractDataContext
    from great_expectations.datasource.fluent import PandasDatasource
    from great_expectations.expectations import Expectation

logger = logging.getLogger(__name__)

SUITES_DIR = Path(__file__).with_name("suites")
DATASETS = ("items", "interactions", "item_scores", "user_candidates")
PARAM = "$param"
FULL = "full"
TOPIC_SHARE = "topic_share:"
HINT = "hint"  # an expectation's meta: what a failure is measured against and the setting that moves it
DOCS_SITE = "nightscore"
EXAMPLES = 5  # offending values quoted per failure
# Columns GX quotes next to each offending value, so a failure names the row it found.
TABLE_KEYS: dict[str, list[str]] = {"topic_shares": ["topic"]}


@dataclass(frozen=True)
class SuiteParams:
    """The settings of the dataset suites; the previous run's values come separately as its stats."""

    row_count_band: float = 0.5  # rows may move by this fraction of the previous run's count, either way
    topic_share_tolerance: float = 0.1  # absolute change of one topic's share of items
    mean_topic_score_tolerance: float = 0.1  # absolute change of the mean topic_score
    top_k: int = 100  # candidates per user, at most
    min_user_coverage: float = 0.9  # users with candidates / expected users, at least
    topic_labels: tuple[str, ...] = tuple(DEFAULT_TOPIC_LABELS)
    events: tuple[str, ...] = tuple(EVENTS)
    expected_users: int | None = None  # users who should get candidates; None: the previous run's n_users

    @classmethod
    def from_settings(cls, settings: Settings, expected_users: int | None = None) -> SuiteParams:
        """Return the suites' parameters from settings (and the users a run should serve, when known)."""
        return cls(
            row_count_band=settings.contracts.row_count_band,
            topic_share_tolerance=settings.contracts.topic_share_tolerance,
            mean_topic_score_tolerance=settings.contracts.mean_topic_score_tolerance,
            top_k=settings.candidates.top_k,
            min_user_coverage=settings.contracts.min_user_coverage,
            topic_labels=tuple(settings.topics.labels),
            events=tuple(settings.candidates.event_weights),
            expected_users=expected_users,
        )


@dataclass(frozen=True)
class ExpectationFailure:
    """One failed expectation: its GX type, its column(s), what GX observed, and what was expected."""

    expectation: str
    column: str | None
    observed: object
    details: str
    hint: str | None = None


@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation's result, passed or failed: what the run's contracts artifact lists."""

    expectation: str
    column: str | None
    table: str
    success: bool
    observed: object


@dataclass(frozen=True)
class DatasetReport:
    """The outcome of validating one dataset: failures, the stats a later run compares against, docs."""

    dataset: str
    suite_version: str
    success: bool
    failures: list[ExpectationFailure]
    statistics: dict[str, float]
    docs_path: str | None
    outcomes: list[ExpectationOutcome] = field(default_factory=list)


def load_suite_file(dataset: str) -> dict[str, Any]:
    """Return the raw suite of a dataset (placeholders unfilled), checking it names itself and a version."""
    if dataset not in DATASETS:
        raise UsageError(f"no dataset suite for {dataset!r}; known: {', '.join(DATASETS)}")
    path = SUITES_DIR / f"{dataset}.json"
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"dataset suite {path} cannot be read: {exc}") from exc
    if spec.get("name") != dataset or not spec.get("meta", {}).get("version"):
        raise UsageError(f"dataset suite {path} must carry name {dataset!r} and meta.version")
    return spec


def as_view(data: pl.DataFrame | DatasetView) -> DatasetView:
    """Return data as a DatasetView (a whole frame is viewed in one pass)."""
    return data if isinstance(data, DatasetView) else view_of(data)


def dataset_stats(dataset: str, data: pl.DataFrame | DatasetView) -> dict[str, float]:
    """Return the JSON-able stats a later run compares against (row_count, n_users, mean_topic_score, topic_share:<t>)."""
    view = as_view(data)
    stats = {"row_count": float(view.height)}
    if dataset in ("interactions", "user_candidates") and "user_id" in view.columns:
        stats["n_users"] = float(view.user_counts.height)
    if dataset == "item_scores" and view.height:
        mean = view.topic_score_mean
        if mean is not None and math.isfinite(mean):
            stats["mean_topic_score"] = float(mean)
        for topic, share in _shares(view).iter_rows():
            stats[f"{TOPIC_SHARE}{topic}"] = float(share)
    return stats


def suite_params(previous: dict[str, float] | None, params: SuiteParams) -> dict[str, Any]:
    """Return the placeholder values of a run: settings, plus bands around the previous run's stats when known."""
    values: dict[str, Any] = {
        "row_count_min": 1,
        "row_count_max": None,
        "topic_share_tolerance": params.topic_share_tolerance,
        "min_user_coverage": params.min_user_coverage,
        "row_count_band": params.row_count_band,
        "mean_topic_score_tolerance": params.mean_topic_score_tolerance,
    }
    values.update(_previous_params(previous or {}, params))
    if params.expected_users is not None:
        values["expected_users"] = params.expected_users
    if params.expected_users == 0:
        values["row_count_min"] = 0  # nobody can be given a candidate (no interactions, every item seen): empty is right
    return values


def _previous_params(previous: dict[str, float], params: SuiteParams) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if "row_count" in previous:
        count = previous["row_count"]
        values["previous_row_count"] = int(count)
        values["row_count_min"] = max(1, math.floor(count * (1 - params.row_count_band)))
        values["row_count_max"] = math.ceil(count * (1 + params.row_count_band))
    if "mean_topic_score" in previous:
        values["previous_mean_topic_score"] = previous["mean_topic_score"]
        values["mean_topic_score_min"] = previous["mean_topic_score"] - params.mean_topic_score_tolerance
        values["mean_topic_score_max"] = previous["mean_topic_score"] + params.mean_topic_score_tolerance
    shares = {k.removeprefix(TOPIC_SHARE): v for k, v in previous.items() if k.startswith(TOPIC_SHARE)}
    if shares:
        values["previous_topic_shares"] = shares
    if "n_users" in previous:
        values["expected_users"] = int(previous["n_users"])
    return values


def suite_expectations(dataset: str, values: dict[str, Any]) -> dict[str, list[Expectation]]:
    """Return this run's expectations of a dataset grouped by the table they read, placeholders filled."""
    from great_expectations.expectations.expectation_configuration import (
        ExpectationConfiguration,
    )

    tables: dict[str, list[Expectation]] = {}
    for index, item in enumerate(load_suite_file(dataset)["expectations"]):
        where = f"{dataset} suite, expectation {index} ({item.get('type')})"
        meta = _with_hint(dict(item.get("meta", {})), values)
        if any(values.get(name) is None for name in meta.get("requires", [])):
            logger.debug("%s left out: this run lacks %s", where, meta["requires"])
            continue
        table = meta.get("table", FULL)
        if table not in (FULL, *DERIVED):
            raise UsageError(f"{where}: unknown table {table!r}")
        try:  # GX's suite constructor logs and drops an invalid expectation; building it here raises instead
            config = ExpectationConfiguration(type=item["type"], kwargs=_fill(item["kwargs"], values, where), meta=meta)
            tables.setdefault(table, []).append(config.to_domain_obj())
        except UsageError:
            raise
        except Exception as exc:  # GX raises pydantic and its own errors alike for a bad configuration
            raise UsageError(f"{where} is invalid: {exc}") from exc
    return tables


def _with_hint(meta: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """Return meta with its hint's {placeholders} filled from the run's values, or without it when one is missing."""
    hint = meta.pop(HINT, None)
    try:
        return meta | {HINT: hint.format_map(values)} if hint else meta
    except KeyError:  # compared with a previous run this run does not have
        return meta


def _fill(value: Any, values: dict[str, Any], where: str) -> Any:
    if isinstance(value, dict) and set(value) == {PARAM}:
        if value[PARAM] not in values:
            raise UsageError(f"{where}: unknown suite parameter {value[PARAM]!r}")
        return values[value[PARAM]]
    if isinstance(value, dict):
        return {key: _fill(item, values, where) for key, item in value.items()}
    if isinstance(value, list):
        return [_fill(item, values, where) for item in value]
    return value


def _shares(view: DatasetView) -> pl.DataFrame:
    shares = (pl.col(COUNT) / view.height).alias("share")
    return view.topic_counts.select("topic", shares).sort("topic", nulls_last=True)


def _topic_shares(view: DatasetView, values: dict[str, Any]) -> pl.DataFrame:
    previous = values.get("previous_topic_shares", {})
    before = pl.DataFrame(
        {"topic": list(previous), "previous_share": list(previous.values())},
        schema={"topic": pl.String, "previous_share": pl.Float64},
    )
    joined = _shares(view).join(before, on="topic", how="full", coalesce=True)
    return (
        joined.with_columns(pl.col("share", "previous_share").fill_null(0.0))
        .with_columns((pl.col("share") - pl.col("previous_share")).abs().alias("share_delta"))
        .sort("share_delta", "topic", descending=[True, False], nulls_last=True)
    )  # worst drift quoted first


def _summary(view: DatasetView, values: dict[str, Any]) -> pl.DataFrame:
    return pl.DataFrame({"mean_topic_score": [view.topic_score_mean]}, schema={"mean_topic_score": pl.Float64})


def _coverage(view: DatasetView, values: dict[str, Any]) -> pl.DataFrame:
    users, expected = view.user_counts.get_column("user_id").drop_nulls().len(), values["expected_users"]
    coverage = users / expected if expected else 1.0
    return pl.DataFrame({"n_users": [users], "expected_users": [expected], "user_coverage": [coverage]})


Derivation = Callable[[DatasetView, dict[str, Any]], pl.DataFrame]
DERIVED: dict[str, Derivation] = {"summary": _summary, "topic_shares": _topic_shares, "coverage": _coverage}


def _table(table: str, view: DatasetView, values: dict[str, Any]) -> pd.DataFrame:
    import pandas as pd

    if table == FULL:  # no columns: costs nothing however tall the dataset
        return pd.DataFrame(index=pd.RangeIndex(view.height))
    return DERIVED[table](view, values).to_pandas()


def _context(docs_dir: str | None) -> AbstractDataContext:
    """Return an in-memory GX context: offline, no progress bars, at most one local Data Docs site."""
    gx_logger = logging.getLogger("great_expectations")
    if gx_logger.level == logging.NOTSET:  # GX logs each context's set-up at INFO; keep run logs to ours
        gx_logger.setLevel(logging.WARNING)
    with imports_held():  # a run's first context imports Great Expectations: 2.5 s, several full collections
        import great_expectations as gx
        from great_expectations.data_context.types.base import (
            DataContextConfig,
            InMemoryStoreBackendDefaults,
            ProgressBarsConfig,
        )

        from data_contracts.docs_views import site_config  # Great Expectations' renderers: loaded for Data Docs only

    sites = {} if docs_dir is None else {DOCS_SITE: site_config(str(docs_dir))}
    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        data_docs_sites=sites,
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),
    )
    return gx.get_context(mode="ephemeral", project_config=config)


def _validate_table(
    context: AbstractDataContext,
    source: PandasDatasource,
    dataset: str,
    table: str,
    expectations: list[Expectation],
    data: pd.DataFrame,
    meta: dict[str, Any],
) -> list[ExpectationValidationResult]:
    import great_expectations as gx

    batch = source.add_dataframe_asset(table).add_batch_definition_whole_dataframe(table)
    suite = context.suites.add(gx.ExpectationSuite(name=f"{dataset}.{table}", expectations=expectations, meta=meta))
    definition = context.validation_definitions.add(gx.ValidationDefinition(name=suite.name, data=batch, suite=suite))
    result_format: dict[str, Any] = {"result_format": "SUMMARY", "partial_unexpected_count": EXAMPLES}
    keys = [key for key in TABLE_KEYS.get(table, []) if key in data.columns]
    if keys:
        result_format["unexpected_index_column_names"] = keys
    # ValidationDefinition.run (not batch.validate) stores the result, which is what Data Docs render.
    return definition.run(batch_parameters={"dataframe": data}, result_format=result_format).results


def validate_dataset(
    dataset: str,
    data: pl.DataFrame | DatasetView,
    previous: dict[str, float] | None,
    params: SuiteParams,
    docs_dir: str | None = None,
) -> DatasetReport:
    """Validate a run's dataset against its suite and the previous successful run's stats.

    Args:
        dataset: one of DATASETS.
        data: the dataset as written by the run: a whole frame, or its view gathered while it streamed.
        previous: `dataset_stats` of the previous successful run, or None for a first run (row count >= 1
            only; the mean, topic-share and coverage checks are left out unless params supply them).
        params: the suite settings.
        docs_dir: a local folder to write this validation's GX Data Docs (HTML) into; its index.html lists
            this validation only, so give each run its own folder. GX writes local files only: for a lake
            on S3 the caller builds into a temporary folder and copies it (tasks/suites.py).

    Returns:
        The report; its statistics are what the next run should receive as previous if this one is published.
    """
    started, spec, view = time.perf_counter(), load_suite_file(dataset), as_view(data)
    values = suite_params(previous, params)
    if previous is None and dataset in MAY_BE_EMPTY:
        values["row_count_min"] = 0  # a first run may have no rows of it; later runs are held to the previous count
    context = _context(docs_dir)
    source = context.data_sources.add_pandas(dataset)
    failures: list[ExpectationFailure] = []
    outcomes: list[ExpectationOutcome] = []
    for table, expectations in suite_expectations(dataset, values).items():
        table_data = _table(table, view, values)
        results = _validate_table(context, source, dataset, table, expectations, table_data, spec["meta"])
        failures += [_failure(result, table) for result in results if not result.success]
        outcomes += [_outcome(result, table) for result in results]
    docs_path = _build_docs(context, docs_dir)
    logger.info(
        "dataset %s: %d rows, %d failed expectation(s), validated in %.2fs",
        dataset,
        view.height,
        len(failures),
        time.perf_counter() - started,
    )
    version = str(spec["meta"]["version"])
    return DatasetReport(dataset, version, not failures, failures, dataset_stats(dataset, view), docs_path, outcomes)


def _outcome(result: ExpectationValidationResult, table: str) -> ExpectationOutcome:
    config = result.expectation_config
    kwargs = config.kwargs if config is not None else {}
    column = kwargs.get("column") or ",".join(kwargs.get("column_list") or []) or None
    return ExpectationOutcome(
        config.type if config is not None else "unknown", column, table, bool(result.success), _observed(result.result or {})
    )


def _build_docs(context: AbstractDataContext, docs_dir: str | None) -> str | None:
    if docs_dir is None:
        return None
    context.build_data_docs(site_names=[DOCS_SITE])
    return str(Path(docs_dir) / "index.html")


def _failure(result: ExpectationValidationResult, table: str) -> ExpectationFailure:
    config = result.expectation_config
    if config is None:  # GX always sets it for a suite's results
        return ExpectationFailure("unknown", None, None, f"{table} table: a result without its expectation")
    kwargs = {k: v for k, v in config.kwargs.items() if k not in ("column", "column_list", "batch_id")}
    column = config.kwargs.get("column") or ",".join(config.kwargs.get("column_list") or []) or None
    error = _exception_message(result.exception_info or {})
    if error is not None:
        return ExpectationFailure(config.type, column, None, f"{table} table: raised {error}")
    expected = ", ".join(f"{key}={_plain(value)!r}" for key, value in kwargs.items())
    return ExpectationFailure(
        config.type,
        column,
        _observed(result.result or {}),
        f"{table} table; expected {expected}" if expected else f"{table} table",
        (config.meta or {}).get(HINT),
    )


def _exception_message(info: dict[str, Any]) -> str | None:
    # GX reports either one exception or one per metric it could not compute.
    entries = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
    messages = [str(entry.get("exception_message")) for entry in entries if entry.get("raised_exception")]
    return "; ".join(dict.fromkeys(messages)) if messages else None


def _observed(result: dict[str, Any]) -> object:
    if result.get("observed_value") is not None:
        return _plain(result["observed_value"])
    if "unexpected_count" not in result:
        return None
    examples = result.get("partial_unexpected_index_list") or result.get("partial_unexpected_list") or []
    percent = result.get("unexpected_percent")
    return _plain(
        {
            "unexpected_count": result["unexpected_count"],
            "unexpected_percent": None if percent is None else round(float(percent), 4),
            "examples": list(examples)[:EXAMPLES],
        }
    )


def _plain(value: Any) -> Any:
    """Return value with numpy scalars and other GX leftovers turned into JSON-able Python values."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def render_failures(report: DatasetReport) -> str:
    """Return one line per failed expectation with its observed value (empty when the dataset passed)."""
    head = f"{report.dataset} (suite v{report.suite_version})"
    return "\n".join(
        f"{head}: {f.expectation} on {f.column or 'the table'} failed: "
        f"observed {json.dumps(f.observed, default=str)}; {f.details}" + (f" ({f.hint})" if f.hint else "")
        for f in report.failures
    )
