"""Contract tier: dataset-level Great Expectations suites on demo inputs and small synthetic outputs."""

from __future__ import annotations

import json
import logging
import re
from datetime import date
from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl
import pytest

from core.errors import UsageError
from core.settings import flat_names
from data_contracts.datasets import (
    DATASETS,
    DatasetReport,
    SuiteParams,
    dataset_stats,
    load_suite_file,
    render_failures,
    suite_expectations,
    suite_params,
    validate_dataset,
)
from nightscore.demo import generate_demo_data

K = 10
PARAMS = SuiteParams(top_k=K)
TOPICS = list(PARAMS.topic_labels)
DIM = 384


def make_item_scores(n: int = 400, seed: int = 0) -> pl.DataFrame:
    """Return a clean item_scores frame: unit-norm embeddings, topics spread over the labels, scores in [0, 1]."""
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return pl.DataFrame(
        {
            "run_id": "run-1",
            "run_date": date(2026, 11, 1),
            "item_id": [f"i{i:04d}" for i in range(n)],
            "model_version": "minilm-1",
            "topic": [TOPICS[i % len(TOPICS)] for i in range(n)],
            "topic_score": rng.uniform(0.2, 0.8, n),
            "token_count": rng.integers(4, 200, n, dtype=np.int32),
            "content_hash": [f"h{i}" for i in range(n)],
        }
    ).with_columns(pl.Series("embedding", vectors, dtype=pl.Array(pl.Float32, DIM)))


def make_candidates(n_users: int = 50, k: int = K, seed: int = 0) -> pl.DataFrame:
    """Return a clean user_candidates frame: k distinct items per user, ranks 1..k, decreasing scores."""
    rng = np.random.default_rng(seed)
    rows = [
        (f"u{u:03d}", rank, f"i{item:04d}", 1.0 - rank / 100)
        for u in range(n_users)
        for rank, item in enumerate(rng.choice(500, k, replace=False), start=1)
    ]
    frame = pl.DataFrame(
        rows, schema={"user_id": pl.String, "rank": pl.Int32, "item_id": pl.String, "score": pl.Float32}, orient="row"
    )
    return frame.select(pl.lit("run-1").alias("run_id"), pl.lit(date(2026, 11, 1)).alias("run_date"), pl.all())


@pytest.fixture(scope="module")
def frames() -> dict[str, pl.DataFrame]:
    items, interactions = generate_demo_data(300, 60, seed=5)
    return {"items": items, "interactions": interactions, "item_scores": make_item_scores(), "user_candidates": make_candidates()}


def with_value(frame: pl.DataFrame, column: str, row: int, value: object) -> pl.DataFrame:
    """Return frame with one cell replaced."""
    return frame.with_columns(
        pl.when(pl.int_range(pl.len()) == row)
        .then(pl.lit(value, dtype=frame.schema[column]))
        .otherwise(pl.col(column))
        .alias(column)
    )


def failed(report: DatasetReport, expectation: str, column: str | None = None) -> list:
    """Return the report's failures of one expectation type (and column)."""
    return [f for f in report.failures if f.expectation == expectation and (column is None or f.column == column)]


def only_failure(report: DatasetReport, expectation: str, column: str | None) -> object:
    """Assert the report failed exactly one expectation, this one, and return its observed value."""
    assert not report.success
    assert [(f.expectation, f.column) for f in report.failures] == [(expectation, column)], render_failures(report)
    return report.failures[0].observed


# --- the suite files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", DATASETS)
def test_each_suite_file_loads_with_a_version_and_every_expectation_builds(dataset: str) -> None:
    spec = load_suite_file(dataset)
    assert spec["name"] == dataset and str(spec["meta"]["version"]).strip()
    previous = {"row_count": 100.0, "mean_topic_score": 0.5, "topic_share:sports": 1.0, "n_users": 10.0}
    tables = suite_expectations(dataset, suite_params(previous, PARAMS))
    assert sum(len(expectations) for expectations in tables.values()) == len(spec["expectations"])
    assert [e.expectation_type for e in tables["full"]] == ["expect_table_row_count_to_be_between"]


def test_first_run_leaves_out_the_checks_against_the_previous_run() -> None:
    from great_expectations.expectations import ExpectTableRowCountToBeBetween

    tables = suite_expectations("item_scores", suite_params(None, PARAMS))
    assert "topic_shares" not in tables and "summary" not in tables
    row_count = tables["full"][0]
    assert isinstance(row_count, ExpectTableRowCountToBeBetween)
    assert (row_count.min_value, row_count.max_value) == (1, None)
    assert "coverage" not in suite_expectations("user_candidates", suite_params(None, PARAMS))


DATASET_LEVEL = {
    "expect_table_row_count_to_be_between",
    "expect_column_mean_to_be_between",
    "expect_column_values_to_be_between",
    "expect_column_min_to_be_between",
}


@pytest.mark.parametrize("dataset", DATASETS)
def test_suites_check_only_what_no_row_can_tell(dataset: str) -> None:
    """Row rules are pandera's: no suite reads the rows themselves, only the dataset's aggregates."""
    for item in load_suite_file(dataset)["expectations"]:
        assert item["type"] in DATASET_LEVEL and item["meta"]["table"] != "rows", item


def test_unknown_placeholder_and_unknown_dataset_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="row_count_min"):
        suite_expectations("items", {})
    with pytest.raises(UsageError, match="no dataset suite"):
        load_suite_file("nope")


def test_row_count_band_follows_the_previous_run() -> None:
    values = suite_params({"row_count": 1000.0}, SuiteParams(row_count_band=0.5))
    assert (values["row_count_min"], values["row_count_max"]) == (500, 1500)
    assert suite_params({"row_count": 1.0}, SuiteParams(row_count_band=0.9))["row_count_min"] == 1


# --- clean frames ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", DATASETS)
def test_clean_frame_passes_first_run_and_against_itself(frames: dict[str, pl.DataFrame], dataset: str) -> None:
    frame = frames[dataset]
    first = validate_dataset(dataset, frame, None, PARAMS)
    assert first.success, render_failures(first)
    assert render_failures(first) == ""
    assert first.suite_version == str(load_suite_file(dataset)["meta"]["version"])
    assert first.statistics["row_count"] == frame.height
    json.dumps(first.statistics)  # stored for the next run as-is
    again = validate_dataset(dataset, frame, first.statistics, PARAMS)
    assert again.success, render_failures(again)


def test_item_scores_stats_are_what_the_next_run_compares(frames: dict[str, pl.DataFrame]) -> None:
    stats = dataset_stats("item_scores", frames["item_scores"])
    assert stats["mean_topic_score"] == pytest.approx(frames["item_scores"]["topic_score"].mean())
    assert sum(v for k, v in stats.items() if k.startswith("topic_share:")) == pytest.approx(1.0)
    assert stats["topic_share:sports"] == pytest.approx(50 / 400)
    assert dataset_stats("user_candidates", frames["user_candidates"])["n_users"] == 50


# --- drift against the previous run --------------------------------------------------------------------


def test_all_items_moved_to_one_topic_fails_naming_the_topic(frames: dict[str, pl.DataFrame]) -> None:
    previous = dataset_stats("item_scores", frames["item_scores"])
    drifted = frames["item_scores"].with_columns(pl.lit("sports").alias("topic"))
    report = validate_dataset("item_scores", drifted, previous, PARAMS)
    observed = cast("dict[str, Any]", only_failure(report, "expect_column_values_to_be_between", "share_delta"))
    assert observed["unexpected_count"] == len(TOPICS)
    assert observed["examples"][0] == {"share_delta": pytest.approx(1 - 50 / 400), "topic": "sports"}
    line = render_failures(report)
    assert line.count("\n") == 0
    assert "expect_column_values_to_be_between on share_delta" in line and '"topic": "sports"' in line


def test_shifted_mean_topic_score_fails_with_the_observed_mean(frames: dict[str, pl.DataFrame]) -> None:
    previous = dataset_stats("item_scores", frames["item_scores"])
    shifted = frames["item_scores"].with_columns(pl.col("topic_score") * 0.5)
    report = validate_dataset("item_scores", shifted, previous, PARAMS)
    observed = only_failure(report, "expect_column_mean_to_be_between", "mean_topic_score")
    assert observed == pytest.approx(previous["mean_topic_score"] * 0.5)
    assert f"observed {observed}" in render_failures(report)


@pytest.mark.parametrize(("previous_rows", "passes"), [(1000, False), (200, False), (500, True), (300, True)])
def test_row_count_outside_the_band_of_the_previous_run_fails(
    frames: dict[str, pl.DataFrame], previous_rows: int, passes: bool
) -> None:
    report = validate_dataset("item_scores", frames["item_scores"], {"row_count": float(previous_rows)}, PARAMS)
    if passes:
        assert report.success, render_failures(report)
    else:
        assert only_failure(report, "expect_table_row_count_to_be_between", None) == 400
        assert "observed 400" in render_failures(report)


DRIFTED: dict[str, tuple[str, Any, str]] = {  # a case: (dataset, how the frame changes, what the line must say)
    "row count": ("items", lambda f: f.head(100), "previous published run had 300 rows; NIGHTSCORE_ROW_COUNT_BAND=0.5"),
    "mean topic_score": (
        "item_scores",
        lambda f: f.with_columns(pl.col("topic_score") * 0.5),
        "previous published run's mean topic_score was 0.4874; NIGHTSCORE_MEAN_TOPIC_SCORE_TOLERANCE=0.1",
    ),
    "topic shares": (
        "item_scores",
        lambda f: f.with_columns(pl.lit("sports").alias("topic")),
        "since the previous published run; NIGHTSCORE_TOPIC_SHARE_TOLERANCE=0.1",
    ),
    "coverage": ("user_candidates", lambda f: f.head(40 * K), "50 users were owed candidates; NIGHTSCORE_MIN_USER_COVERAGE=0.9"),
}


@pytest.mark.parametrize("case", sorted(DRIFTED))
def test_a_drift_failure_says_what_it_compares_with_and_the_setting_that_allows_more(
    frames: dict[str, pl.DataFrame], case: str
) -> None:
    """A catalogue that grows or a model that moves fails the run: the line says against what, and what to change."""
    dataset, change, said = DRIFTED[case]
    report = validate_dataset(dataset, change(frames[dataset]), dataset_stats(dataset, frames[dataset]), PARAMS)
    line = render_failures(report)
    assert not report.success and line.count("\n") == 0 and said in line, line
    for name in re.findall(r"NIGHTSCORE_[A-Z0-9_]+", line):
        assert name.removeprefix("NIGHTSCORE_").lower() in flat_names(), name


def test_a_first_runs_failure_names_no_previous_run(frames: dict[str, pl.DataFrame]) -> None:
    line = render_failures(validate_dataset("items", frames["items"].clear(), None, PARAMS))
    assert "observed 0" in line and "previous" not in line and "NIGHTSCORE_" not in line


def test_empty_frame_fails_the_first_run_row_count(frames: dict[str, pl.DataFrame]) -> None:
    report = validate_dataset("items", frames["items"].clear(), None, PARAMS)
    assert failed(report, "expect_table_row_count_to_be_between")[0].observed == 0


@pytest.mark.parametrize(
    ("params", "previous"),
    [
        (SuiteParams(top_k=K, expected_users=100), None),
        (PARAMS, {"row_count": 500.0, "n_users": 100.0}),
    ],
)
def test_too_few_users_served_fails_coverage(frames: dict[str, pl.DataFrame], params: SuiteParams, previous: dict | None) -> None:
    report = validate_dataset("user_candidates", frames["user_candidates"], previous, params)
    assert only_failure(report, "expect_column_min_to_be_between", "user_coverage") == pytest.approx(0.5)


@pytest.mark.parametrize("previous", [None, {"row_count": 500.0, "n_users": 100.0}])
def test_no_candidates_pass_when_nobody_is_owed_one(frames: dict[str, pl.DataFrame], previous: dict | None) -> None:
    """A run without interactions (or whose users have seen every item) owes no candidates: an empty table is right."""
    params = SuiteParams(top_k=K, expected_users=0)
    assert validate_dataset("user_candidates", frames["user_candidates"].clear(), previous, params).success
    report = validate_dataset("user_candidates", frames["user_candidates"].clear(), previous, PARAMS)
    assert failed(report, "expect_table_row_count_to_be_between")[0].observed == 0


def test_a_first_runs_log_may_be_empty_a_later_one_is_held_to_the_previous_count(frames: dict[str, pl.DataFrame]) -> None:
    assert validate_dataset("interactions", frames["interactions"].clear(), None, PARAMS).success
    report = validate_dataset("interactions", frames["interactions"].clear(), {"row_count": 1000.0}, PARAMS)
    assert failed(report, "expect_table_row_count_to_be_between")[0].observed == 0


# --- Data Docs and quiet -------------------------------------------------------------------------------


def test_data_docs_index_is_written(frames: dict[str, pl.DataFrame], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    previous = dataset_stats("item_scores", frames["item_scores"])
    drifted = frames["item_scores"].with_columns(pl.lit("sports").alias("topic"))
    with caplog.at_level(logging.WARNING):
        report = validate_dataset("item_scores", drifted, previous, PARAMS, docs_dir=str(tmp_path / "docs"))
    assert report.docs_path == str(tmp_path / "docs" / "index.html")
    index = Path(report.docs_path).read_text(encoding="utf-8")
    assert "item_scores.topic_shares" in index
    pages = list((tmp_path / "docs" / "validations" / "item_scores").rglob("*.html"))
    assert {page.parent.parent.parent.name for page in pages} == {"full", "summary", "topic_shares"}
    assert not [r for r in caplog.records if r.name.startswith("great_expectations")], caplog.text
    assert validate_dataset("items", frames["items"], None, PARAMS).docs_path is None


def test_data_docs_templates_are_compiled_once_per_process_into_the_same_pages(
    frames: dict[str, pl.DataFrame], tmp_path: Path
) -> None:
    from data_contracts.docs_views import TEMPLATES

    def build(folder: str) -> dict[str, str]:
        validate_dataset("item_scores", frames["item_scores"], None, PARAMS, docs_dir=str(tmp_path / folder))
        site = tmp_path / folder
        pages = site.rglob("*.html")
        return {_without_stamps(str(p.relative_to(site))): _without_stamps(p.read_text(encoding="utf-8")) for p in pages}

    first = build("a")
    compiled = len(TEMPLATES)
    assert compiled > 10  # GX's page and index templates, each compiled once
    second = build("b")
    assert len(TEMPLATES) == compiled  # the second build compiled nothing: every template came from the cache
    assert second == first and any("item_scores.full" in page for page in first.values())


def _without_stamps(html: str) -> str:
    """Return a Data Docs page without what differs between two builds (run times, element ids, cache busters)."""
    html = re.sub(r"\d{8}T\d{6}\.\d+Z|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(\+00:00|Z)?|\b\d{10}\.\d+", "<time>", html)
    return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}", "<id>", html)
