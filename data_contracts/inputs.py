"""Row contracts of the inputs (pandera on polars): items and interactions, with quarantine.

Decisions recorded here are the contract:
- The scored text of an item is ``title + "\\n" + body`` (a null title gives the body alone).
- Duplicate item_ids: every copy is quarantined (rule ``item_id:field_uniqueness``); no copy wins,
  because nothing in the file says which one is right.
- Interactions whose item_id is not among the valid items are quarantined (rule ``item_id:item_exists``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandera.polars as pa
import polars as pl

from data_contracts.quarantine import REQUIRED_COLUMNS, ROW, failing_rows, require_columns, split_by_failures
from nightscore.errors import InputUnreadable

ITEMS_CONTRACT = "items/1"
INTERACTIONS_CONTRACT = "interactions/1"
ITEM_COLUMNS: dict[str, pl.DataType] = {"item_id": pl.String(), "title": pl.String(), "body": pl.String(),
                                        "created_at": pl.Datetime("us", "UTC")}
INTERACTION_COLUMNS: dict[str, pl.DataType] = {"user_id": pl.String(), "item_id": pl.String(), "event": pl.String(),
                                               "ts": pl.Datetime("us", "UTC")}
EVENTS = ["view", "click", "purchase"]
REPLACEMENT_CHAR = "\ufffd"  # what invalid UTF-8 bytes decode to; a text holding it is quarantined


@dataclass(frozen=True)
class InputRules:
    """The run-dependent parameters of the input contracts."""

    not_after: datetime  # timestamps later than this are in the future
    max_text_chars: int = 100_000


def item_text_expr() -> pl.Expr:
    """Return the expression of the scored text: title + "\\n" + body (body alone when title is null)."""
    return pl.when(pl.col("title").is_null()).then(pl.col("body")).otherwise(
        pl.concat_str([pl.col("title"), pl.col("body")], separator="\n")
    ).alias("text")


def conform(frame: pl.DataFrame, columns: dict[str, pl.DataType], dataset: str, uri: str) -> pl.DataFrame:
    """Return frame with the contract's columns cast to their types (extra columns dropped, absent optional ones null)."""
    out: list[pl.Series] = []
    for name, dtype in columns.items():
        if name not in frame.columns:
            out.append(pl.Series(name, [None] * frame.height, dtype=dtype))
        else:
            out.append(_cast(frame.get_column(name), dtype, dataset, uri))
    return frame.select(out)


def _cast(series: pl.Series, dtype: pl.DataType, dataset: str, uri: str) -> pl.Series:
    if series.dtype == dtype:
        return series
    if series.dtype == pl.Binary and dtype == pl.String:
        return _decode_utf8(series)
    try:
        if isinstance(dtype, pl.Datetime):
            return _to_utc(series)
        return series.cast(dtype, strict=True)
    except (pl.exceptions.PolarsError, ValueError) as exc:
        raise InputUnreadable(
            f"{dataset} file {uri}: column {series.name} has type {series.dtype} and cannot be read as {dtype}"
        ) from exc


def _decode_utf8(series: pl.Series) -> pl.Series:
    """Return bytes decoded as UTF-8; invalid sequences become U+FFFD, which the valid_utf8 rule quarantines."""
    return pl.Series(series.name, [None if b is None else b.decode("utf-8", "replace") for b in series], dtype=pl.String)


def _to_utc(series: pl.Series) -> pl.Series:
    if series.dtype == pl.String:
        series = series.str.to_datetime(time_unit="us", time_zone="UTC", strict=True)
    if isinstance(series.dtype, pl.Date):
        series = series.cast(pl.Datetime("us"))
    if not isinstance(series.dtype, pl.Datetime):
        raise ValueError(f"not a timestamp: {series.dtype}")
    series = series.dt.cast_time_unit("us")
    tz = series.dtype.time_zone if isinstance(series.dtype, pl.Datetime) else None
    return series.dt.replace_time_zone("UTC") if tz is None else series.dt.convert_time_zone("UTC")


def items_schema(rules: InputRules) -> pa.DataFrameSchema:
    """Return the pandera schema of conformed items (with the derived text column)."""
    return pa.DataFrameSchema(
        {
            "item_id": pa.Column(str, nullable=False, unique=True, checks=pa.Check.str_length(min_value=1)),
            "title": pa.Column(str, nullable=True),
            "body": pa.Column(str, nullable=False),
            "created_at": pa.Column(pl.Datetime("us", "UTC"), nullable=True, checks=pa.Check.le(rules.not_after)),
            "text": pa.Column(str, nullable=False, checks=[
                _not_blank(), _valid_utf8(), pa.Check.str_length(max_value=rules.max_text_chars)]),
        },
        name="items",
    )


def interactions_schema(rules: InputRules) -> pa.DataFrameSchema:
    """Return the pandera schema of conformed interactions."""
    return pa.DataFrameSchema(
        {
            "user_id": pa.Column(str, nullable=False, checks=[_not_blank()]),
            "item_id": pa.Column(str, nullable=False),
            "event": pa.Column(str, nullable=False, checks=pa.Check.isin(EVENTS)),
            "ts": pa.Column(pl.Datetime("us", "UTC"), nullable=False, checks=pa.Check.le(rules.not_after)),
        },
        name="interactions",
    )


def _not_blank() -> pa.Check:
    return pa.Check(
        lambda data: data.lazyframe.select(pl.col(data.key).str.strip_chars().str.len_chars() > 0),
        name="not_blank",
    )


def _valid_utf8() -> pa.Check:
    return pa.Check(
        lambda data: data.lazyframe.select(~pl.col(data.key).str.contains(REPLACEMENT_CHAR, literal=True)),
        name="valid_utf8",
    )


def validate_items(raw: pl.DataFrame, rules: InputRules, uri: str, row_offset: int = 0,
                   duplicated_ids: pl.Series | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Return (valid items with a text column, quarantine rows) for a raw items frame.

    A batch of a larger file passes its first row's position (``row_offset``) and the ids duplicated
    anywhere in the file (`duplicated_ids`): a copy whose twin sits in another batch is quarantined
    with the same rule (``item_id:field_uniqueness``) as copies pandera finds inside the batch.
    """
    require_columns(raw, REQUIRED_COLUMNS["items"], "items", uri)
    if raw.height == 0 and row_offset == 0:
        raise InputUnreadable(f"items file {uri}: no rows")
    frame = conform(raw, ITEM_COLUMNS, "items", uri).with_columns(item_text_expr()).with_row_index(ROW, offset=row_offset)
    failures = failing_rows(frame.drop(ROW), items_schema(rules), "items", uri).with_columns(pl.col(ROW) + row_offset)
    if duplicated_ids is not None:
        failures = pl.concat([failures, _duplicates_elsewhere(frame, duplicated_ids)])
    valid, quarantine = split_by_failures(frame, failures, "items", pl.col("item_id"))
    return valid.drop(ROW), quarantine


def duplicated_item_ids(item_ids: pl.Series) -> pl.Series:
    """Return the item_ids that occur more than once (the global pass of the uniqueness rule, on ids only)."""
    return item_ids.filter(item_ids.is_duplicated()).unique()


def _duplicates_elsewhere(frame: pl.DataFrame, duplicated_ids: pl.Series) -> pl.DataFrame:
    """Return uniqueness failures of rows whose id is duplicated in the file but occurs once in this batch."""
    once = pl.col("item_id").is_not_null() & ~pl.col("item_id").is_duplicated()
    rows = frame.filter(once & pl.col("item_id").is_in(duplicated_ids.implode()))
    return rows.select(pl.col(ROW), pl.lit("item_id:field_uniqueness").alias("rule"), pl.col("item_id").alias("value"))


def validate_interactions(
    raw: pl.DataFrame, valid_item_ids: pl.Series, rules: InputRules, uri: str, row_offset: int = 0
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Return (valid interactions, quarantine rows); interactions of unknown items are quarantined.

    A batch of a larger file passes its first row's position as ``row_offset`` (row keys of null keys).
    """
    require_columns(raw, REQUIRED_COLUMNS["interactions"], "interactions", uri)
    frame = conform(raw, INTERACTION_COLUMNS, "interactions", uri).with_row_index(ROW, offset=row_offset)
    failures = failing_rows(frame.drop(ROW), interactions_schema(rules), "interactions", uri).with_columns(pl.col(ROW) + row_offset)
    unknown = frame.filter(pl.col("item_id").is_not_null() & ~pl.col("item_id").is_in(valid_item_ids.implode()))
    failures = pl.concat([failures, unknown.select(
        pl.col(ROW), pl.lit("item_id:item_exists").alias("rule"), pl.col("item_id").alias("value"))])
    key = pl.concat_str([pl.col("user_id"), pl.col("item_id"), pl.col("ts").dt.to_string()], separator="|")
    valid, quarantine = split_by_failures(frame, failures, "interactions", key)
    return valid.drop(ROW), quarantine
