"""Row contracts of the inputs (pandera on polars): items and interactions, with quarantine.

Decisions recorded here are the contract:
- The scored text of an item is ``title + "\\n" + body`` (a null title gives the body alone).
- Duplicate item_ids follow ``duplicate_id_policy``. ``quarantine_all`` (the default): every copy is quarantined
  (rule ``item_id:field_uniqueness``), since nothing in the file says which one is right. ``keep_latest``: the
  copy with the latest ``created_at`` is kept (a null created_at counts as the oldest; ties: the later row in the
  file) and the others are quarantined (rule ``item_id:duplicate_not_kept``, the reason naming the kept row).
- Bytes that are not valid UTF-8 are found where they are decoded (a binary column, or a string column whose
  data is not UTF-8): the row is quarantined (rule ``text:valid_utf8`` for title and body, ``<column>:valid_utf8``
  otherwise). A string that holds U+FFFD (the replacement character) as a valid code point is valid.
- Interactions whose item_id is not among the valid items are quarantined (rule ``item_id:item_exists``).
- An item's ``item_id`` and an interaction's ``user_id`` follow the one id rule (core/ids.py: printable, no
  surrounding space, at most 256 characters); a row that breaks it is quarantined (rule ``<column>:valid_id``), so
  the ranker can serve and ``POST /v1/events`` can report every id a run publishes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import pandera.polars as pa
import polars as pl

from core.errors import InputUnreadable
from core.ids import valid_id
from data_contracts.quarantine import REQUIRED_COLUMNS, ROW, failing_rows, require_columns, split_by_failures

ITEMS_CONTRACT = "items/1"
INTERACTIONS_CONTRACT = "interactions/1"
ITEM_COLUMNS: dict[str, pl.DataType] = {
    "item_id": pl.String(),
    "title": pl.String(),
    "body": pl.String(),
    "created_at": pl.Datetime("us", "UTC"),
}
INTERACTION_COLUMNS: dict[str, pl.DataType] = {
    "user_id": pl.String(),
    "item_id": pl.String(),
    "event": pl.String(),
    "ts": pl.Datetime("us", "UTC"),
}
EVENTS = ["view", "click", "purchase"]
INVALID_UTF8 = "__invalid_utf8"  # conform's marker column: the columns of a row whose bytes were not valid UTF-8
TEXT_COLUMNS = ("title", "body")
DuplicatePolicy = Literal["quarantine_all", "keep_latest"]
DUPLICATE_RULES = {"quarantine_all": "item_id:field_uniqueness", "keep_latest": "item_id:duplicate_not_kept"}


@dataclass(frozen=True)
class InputRules:
    """The run-dependent parameters of the input contracts."""

    not_after: datetime  # timestamps later than this are in the future
    max_text_chars: int = 100_000
    duplicate_policy: DuplicatePolicy = "quarantine_all"


def item_text_expr() -> pl.Expr:
    """Return the expression of the scored text: title + "\\n" + body (body alone when title is null)."""
    return (
        pl.when(pl.col("title").is_null())
        .then(pl.col("body"))
        .otherwise(pl.concat_str([pl.col("title"), pl.col("body")], separator="\n"))
        .alias("text")
    )


def conform(frame: pl.DataFrame, columns: dict[str, pl.DataType], dataset: str, uri: str) -> pl.DataFrame:
    """Return frame with the contract's columns cast to their types (extra columns dropped, absent optional ones null).

    Bytes decoded to text are checked there: the INVALID_UTF8 column names, per row, the columns whose bytes were not
    valid UTF-8 (null for a clean row; kept from an earlier conform of the same rows).
    """
    out: list[pl.Series] = []
    invalid: list[pl.Series] = [frame.get_column(INVALID_UTF8)] if INVALID_UTF8 in frame.columns else []
    for name, dtype in columns.items():
        if name not in frame.columns:
            out.append(pl.Series(name, [None] * frame.height, dtype=dtype))
        elif frame.schema[name] == pl.Binary and dtype == pl.String:
            text, bad = _decode_utf8(frame.get_column(name))
            out.append(text)
            invalid.append(pl.Series(INVALID_UTF8, [name if b else None for b in bad], dtype=pl.String))
        else:
            out.append(_cast(frame.get_column(name), dtype, dataset, uri))
    return frame.select(out).with_columns(_joined(invalid, frame.height))


def _joined(marks: list[pl.Series], height: int) -> pl.Series:
    """Return the INVALID_UTF8 column: each row's marked column names, comma-joined (null when none)."""
    if not marks:
        return pl.Series(INVALID_UTF8, [None] * height, dtype=pl.String)
    joined = pl.DataFrame(marks, schema=[f"m{i}" for i in range(len(marks))]).select(
        pl.concat_str(pl.all(), separator=",", ignore_nulls=True).alias(INVALID_UTF8)
    )
    return joined.get_column(INVALID_UTF8).replace("", None)


def _cast(series: pl.Series, dtype: pl.DataType, dataset: str, uri: str) -> pl.Series:
    if series.dtype == dtype:
        return series
    try:
        if isinstance(dtype, pl.Datetime):
            return _to_utc(series)
        return series.cast(dtype, strict=True)
    except (pl.exceptions.PolarsError, ValueError) as exc:
        raise InputUnreadable(
            f"{dataset} file {uri}: column {series.name} has type {series.dtype} and cannot be read as {dtype}"
        ) from exc


def _decode_utf8(series: pl.Series) -> tuple[pl.Series, list[bool]]:
    """Return bytes decoded as UTF-8 (invalid sequences shown as U+FFFD, for the quarantine's value) and which were invalid."""
    texts: list[str | None] = []
    invalid: list[bool] = []
    for raw in series:
        if raw is None:
            texts.append(None)
            invalid.append(False)
            continue
        try:
            texts.append(raw.decode("utf-8"))
            invalid.append(False)
        except UnicodeDecodeError:
            texts.append(raw.decode("utf-8", "replace"))
            invalid.append(True)
    return pl.Series(series.name, texts, dtype=pl.String), invalid


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
    """Return the pandera schema of conformed items (with the derived text column); uniqueness is `duplicate_rows`'."""
    return pa.DataFrameSchema(
        {
            "item_id": pa.Column(str, nullable=False, checks=[_valid_id()]),
            "title": pa.Column(str, nullable=True),
            "body": pa.Column(str, nullable=False),
            "created_at": pa.Column(pl.Datetime("us", "UTC"), nullable=True, checks=pa.Check.le(rules.not_after)),
            "text": pa.Column(str, nullable=False, checks=[_not_blank(), pa.Check.str_length(max_value=rules.max_text_chars)]),
        },
        name="items",
    )


def interactions_schema(rules: InputRules) -> pa.DataFrameSchema:
    """Return the pandera schema of conformed interactions."""
    return pa.DataFrameSchema(
        {
            "user_id": pa.Column(str, nullable=False, checks=[_valid_id()]),
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


def valid_id_mask(ids: pl.Series) -> pl.Series:
    """Return, per id, whether it follows the id rule (core/ids.py; nulls pass: they are not_nullable's), once per distinct id."""
    distinct = ids.drop_nulls().unique()
    good = distinct.filter(pl.Series([valid_id(v) for v in distinct], dtype=pl.Boolean))
    return ids.is_in(good.implode()) | ids.is_null()


def _valid_id() -> pa.Check:
    return pa.Check(
        lambda data: data.lazyframe.select(pl.col(data.key).map_batches(valid_id_mask, return_dtype=pl.Boolean)),
        name="valid_id",
    )


def validate_items(
    raw: pl.DataFrame, rules: InputRules, uri: str, row_offset: int = 0, duplicates: pl.DataFrame | None = None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Return (valid items with a text column, quarantine rows) for a raw items frame.

    A batch of a larger file passes its first row's position (``row_offset``) and `duplicate_rows` of the whole
    file (``duplicates``); without them the frame is taken to be the whole file.
    """
    require_columns(raw, REQUIRED_COLUMNS["items"], "items", uri)
    if raw.height == 0 and row_offset == 0:
        raise InputUnreadable(f"items file {uri}: no rows")
    frame = conform(raw, ITEM_COLUMNS, "items", uri).with_columns(item_text_expr()).with_row_index(ROW, offset=row_offset)
    if duplicates is None:
        duplicates = duplicate_rows(frame.select("item_id", "created_at"), rules.duplicate_policy, row_offset)
    failures = pl.concat(
        [
            failing_rows(frame.drop(ROW, INVALID_UTF8), items_schema(rules), "items", uri).with_columns(pl.col(ROW) + row_offset),
            invalid_utf8_failures(frame),
            duplicates.join(frame.select(ROW), on=ROW, how="semi"),
        ],
        how="diagonal_relaxed",
    )
    valid, quarantine = split_by_failures(frame, failures, "items", pl.col("item_id"))
    return valid.drop(ROW, INVALID_UTF8), quarantine


def duplicate_rows(ids: pl.DataFrame, policy: DuplicatePolicy, row_offset: int = 0) -> pl.DataFrame:
    """Return the rows the duplicate-id policy quarantines: (row, rule, value, reason), from (item_id, created_at) in file order.

    quarantine_all: every copy of a repeated id. keep_latest: every copy but the one with the latest created_at
    (null counts as the oldest; ties: the later row), the reason naming the row kept.
    """
    rows = ids.with_row_index(ROW, offset=row_offset).filter(pl.col("item_id").is_not_null() & pl.col("item_id").is_duplicated())
    rule = DUPLICATE_RULES[policy]
    if policy == "quarantine_all":
        return rows.select(
            pl.col(ROW),
            pl.lit(rule).alias("rule"),
            pl.col("item_id").alias("value"),
            pl.lit(None, dtype=pl.String).alias("reason"),
        )
    ranked = rows.sort(["item_id", pl.col("created_at").fill_null(datetime.min.replace(tzinfo=UTC)), ROW])
    kept = (
        ranked.group_by("item_id", maintain_order=True)
        .last()
        .select("item_id", pl.col(ROW).alias("kept_row"), pl.col("created_at").alias("kept_created_at"))
    )
    dropped = rows.join(kept, on="item_id").filter(pl.col(ROW) != pl.col("kept_row"))
    reason = pl.format(
        "duplicate item_id {}: kept row {} (latest created_at {}; policy keep_latest)",
        pl.col("item_id"),
        pl.col("kept_row"),
        pl.col("kept_created_at").dt.to_string().fill_null("null"),
    )
    return dropped.select(pl.col(ROW), pl.lit(rule).alias("rule"), pl.col("item_id").alias("value"), reason.alias("reason"))


def invalid_utf8_failures(frame: pl.DataFrame) -> pl.DataFrame:
    """Return (row, rule, value) of the rows conform found invalid UTF-8 in (the title and body as rule text:valid_utf8)."""
    marked = frame.filter(pl.col(INVALID_UTF8).is_not_null())
    if marked.height == 0:
        return pl.DataFrame(schema={ROW: pl.UInt32, "rule": pl.String, "value": pl.String})
    rows = []
    for row, names in marked.select(ROW, INVALID_UTF8).iter_rows():
        for name in dict.fromkeys("text" if n in TEXT_COLUMNS else n for n in names.split(",")):
            column = "text" if name == "text" else name
            rows.append((row, f"{name}:valid_utf8", marked.filter(pl.col(ROW) == row).get_column(column).item()))
    return pl.DataFrame(rows, schema={ROW: pl.UInt32, "rule": pl.String, "value": pl.String}, orient="row")


def validate_interactions(
    raw: pl.DataFrame, valid_item_ids: pl.Series, rules: InputRules, uri: str, row_offset: int = 0
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Return (valid interactions, quarantine rows); interactions of unknown items are quarantined.

    A batch of a larger file passes its first row's position as ``row_offset`` (row keys of null keys).
    """
    require_columns(raw, REQUIRED_COLUMNS["interactions"], "interactions", uri)
    frame = conform(raw, INTERACTION_COLUMNS, "interactions", uri).with_row_index(ROW, offset=row_offset)
    failures = failing_rows(frame.drop(ROW, INVALID_UTF8), interactions_schema(rules), "interactions", uri).with_columns(
        pl.col(ROW) + row_offset
    )
    unknown = frame.filter(pl.col("item_id").is_not_null() & ~pl.col("item_id").is_in(valid_item_ids.implode()))
    failures = pl.concat(
        [
            failures,
            invalid_utf8_failures(frame),
            unknown.select(pl.col(ROW), pl.lit("item_id:item_exists").alias("rule"), pl.col("item_id").alias("value")),
        ]
    )
    key = pl.concat_str([pl.col("user_id"), pl.col("item_id"), pl.col("ts").dt.to_string()], separator="|")
    valid, quarantine = split_by_failures(frame, failures, "interactions", key)
    return valid.drop(ROW, INVALID_UTF8), quarantine
