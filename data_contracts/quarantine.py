"""Turning pandera failures into quarantine rows: dataset, row key, rule, offending value, reason."""

from __future__ import annotations

import pandera.polars as pa
import polars as pl
from pandera.errors import SchemaError, SchemaErrors

from core.errors import InputUnreadable

ROW = "__row"
REQUIRED_COLUMNS = {"items": ["item_id", "body"], "interactions": ["user_id", "item_id", "event", "ts"]}
# Inputs a run accepts without rows: nobody has used a new catalogue yet (its run publishes item scores, no candidates).
MAY_BE_EMPTY = frozenset({"interactions"})
QUARANTINE_SCHEMA = pl.Schema(
    {"dataset": pl.String(), "row_key": pl.String(), "rule": pl.String(), "value": pl.String(), "reason": pl.String()}
)


def empty_quarantine() -> pl.DataFrame:
    """Return a quarantine frame with no rows."""
    return pl.DataFrame(schema=QUARANTINE_SCHEMA)


def require_columns(frame: pl.DataFrame | pl.LazyFrame, required: list[str], dataset: str, uri: str) -> None:
    """Raise InputUnreadable naming the file when a required column is missing."""
    names = frame.collect_schema().names() if isinstance(frame, pl.LazyFrame) else frame.columns
    missing = [c for c in required if c not in names]
    if missing:
        raise InputUnreadable(f"{dataset} file {uri}: missing required column(s) {', '.join(missing)}")


def failing_rows(frame: pl.DataFrame, schema: pa.DataFrameSchema, dataset: str, uri: str) -> pl.DataFrame:
    """Return pandera's data-level failures as (row, rule, value); schema-level failures raise InputUnreadable."""
    try:
        schema.validate(frame, lazy=True)
    except SchemaErrors as exc:
        cases = exc.failure_cases
    except SchemaError as exc:
        raise InputUnreadable(f"{dataset} file {uri}: {_one_line(exc)}") from exc
    else:
        return pl.DataFrame(schema={ROW: pl.UInt32, "rule": pl.String, "value": pl.String})
    structural = cases.filter(pl.col("index").is_null())
    if structural.height:
        first = structural.row(0, named=True)
        raise InputUnreadable(f"{dataset} file {uri}: {first['column']} fails {first['check']} ({first['failure_case']})")
    return cases.select(
        pl.col("index").cast(pl.UInt32).alias(ROW),
        pl.concat_str([pl.col("column"), pl.col("check")], separator=":").alias("rule"),
        pl.col("failure_case").cast(pl.String).alias("value"),
    )


def split_by_failures(
    frame: pl.DataFrame, failures: pl.DataFrame, dataset: str, key: pl.Expr
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Return (rows with no failure, quarantine rows) for a frame carrying the ROW index column."""
    bad = failures.get_column(ROW).unique()
    valid = frame.filter(~pl.col(ROW).is_in(bad.implode()))
    keys = frame.select(pl.col(ROW), key.alias("row_key"))
    if "reason" not in failures.columns:  # a rule may say why in its own words; the others get the standard reason
        failures = failures.with_columns(pl.lit(None, dtype=pl.String).alias("reason"))
    standard = pl.format("{} failed for value {}", pl.col("rule"), pl.col("value").str.slice(0, 80).fill_null("null"))
    quarantine = failures.join(keys, on=ROW, how="left").select(
        pl.lit(dataset).alias("dataset"),
        pl.coalesce(pl.col("row_key"), pl.format("#{}", pl.col(ROW))).alias("row_key"),
        pl.col("rule"),
        pl.col("value").str.slice(0, 200).fill_null("null"),
        pl.coalesce(pl.col("reason"), standard).alias("reason"),
    )
    return valid, quarantine.cast(QUARANTINE_SCHEMA)


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]
