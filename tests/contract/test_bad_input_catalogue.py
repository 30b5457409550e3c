"""Contract tier: the catalogue of bad inputs, each with its expected quarantine rule or unreadable-file error.

Every case starts from a clean demo batch and breaks one thing. Row-level defects are quarantined with
their rule while every valid row passes; file-level defects stop with InputUnreadable (exit 3) naming
the file. (That a failing run publishes nothing and keeps the previous publication is tested at the
flow tier: tests/flow/test_nightly_flow.py.)
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nightscore.demo_data import generate_demo_data
from nightscore.errors import InputUnreadable
from nightscore.settings import Settings
from nightscore.check import check_inputs
from storage.lake import Lake

NOW = datetime(2026, 11, 30, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def demo() -> tuple[pl.DataFrame, pl.DataFrame]:
    return generate_demo_data(200, 40, seed=21)


def run_check(tmp_path: Path, items: pl.DataFrame | Path, interactions: pl.DataFrame | Path):
    """Write the frames (unless given as files) and return check_inputs on them."""
    paths = []
    for name, data in (("items", items), ("interactions", interactions)):
        if isinstance(data, Path):
            paths.append(str(data))
            continue
        path = tmp_path / f"{name}.parquet"
        data.write_parquet(path)
        paths.append(str(path))
    return check_inputs(Lake(str(tmp_path)), Settings(home=tmp_path), paths[0], paths[1], now=NOW)


def set_cell(frame: pl.DataFrame, column: str, row: int, value: object) -> pl.DataFrame:
    return frame.with_columns(pl.when(pl.int_range(pl.len()) == row).then(pl.lit(value, dtype=frame.schema[column]))
                              .otherwise(pl.col(column)).alias(column))


ROW_CASES = {
    "null item_id": ("items", lambda i: set_cell(i, "item_id", 3, None), "item_id:not_nullable"),
    "null body": ("items", lambda i: set_cell(i, "body", 3, None), "body:not_nullable"),
    "duplicate item_id (both copies)": ("items", lambda i: set_cell(i, "item_id", 4, i["item_id"][3]), "item_id:field_uniqueness"),
    "empty text": ("items", lambda i: set_cell(set_cell(i, "body", 3, ""), "title", 3, None), "text:not_blank"),
    "whitespace-only text": ("items", lambda i: set_cell(set_cell(i, "body", 3, " \t "), "title", 3, "  "), "text:not_blank"),
    "1 MB text": ("items", lambda i: set_cell(i, "body", 3, "word " * 200_000), "text:str_length(None, 100000)"),
    "future created_at": ("items", lambda i: set_cell(i, "created_at", 3, datetime(2027, 3, 1, tzinfo=timezone.utc)),
                          "created_at:less_than_or_equal_to"),
    "null user_id": ("interactions", lambda x: set_cell(x, "user_id", 3, None), "user_id:not_nullable"),
    "null ts": ("interactions", lambda x: set_cell(x, "ts", 3, None), "ts:not_nullable"),
    "unknown event type": ("interactions", lambda x: set_cell(x, "event", 3, "share"), "event:isin"),
    "future timestamp": ("interactions", lambda x: set_cell(x, "ts", 3, datetime(2027, 1, 1, tzinfo=timezone.utc)),
                         "ts:less_than_or_equal_to"),
    "unknown item": ("interactions", lambda x: set_cell(x, "item_id", 3, "item-999999"), "item_id:item_exists"),
}


@pytest.mark.parametrize("case", list(ROW_CASES))
def test_row_defect_is_quarantined_with_its_rule_and_the_rest_pass(case: str, tmp_path: Path, demo) -> None:
    dataset, breaker, rule = ROW_CASES[case]
    items, interactions = demo
    if dataset == "items":
        items = breaker(items)
    else:
        interactions = breaker(interactions)
    check = run_check(tmp_path, items, interactions)
    rules = {(d, r) for d, r in check.by_rule.select("dataset", "rule").iter_rows()}
    assert any(d == dataset and r.startswith(rule) for d, r in rules), rules
    expected = 2 if "duplicate" in case else 1
    assert check.quarantined[dataset] == expected


def test_invalid_utf8_bytes_are_quarantined(tmp_path: Path, demo) -> None:
    items, interactions = demo
    bodies = [b.encode() for b in items["body"]]
    bodies[5] = b"caf\xe9 \xff\xfe broken bytes"
    table = items.drop("body").to_arrow().append_column("body", pa.array(bodies, type=pa.binary()))
    pq.write_table(table, tmp_path / "items.parquet")
    check = run_check(tmp_path, tmp_path / "items.parquet", interactions)
    assert check.by_rule.filter(pl.col("rule") == "text:valid_utf8")["failures"].to_list() == [1]
    assert check.quarantined["items"] == 1


def test_extra_column_is_ignored(tmp_path: Path, demo) -> None:
    items, interactions = demo
    check = run_check(tmp_path, items.with_columns(pl.lit(1).alias("unexpected")), interactions)
    assert check.quarantined == {"items": 0, "interactions": 0} and check.passed(0.05)


FILE_CASES = {
    "missing column": (lambda i, p: i.drop("item_id").write_parquet(p), "missing required column"),
    "wrong dtype that cannot be coerced": (lambda i, p: i.with_columns(pl.lit(3.5).alias("created_at")).write_parquet(p),
                                           "column created_at has type Float64"),
    "empty file (no rows)": (lambda i, p: i.head(0).write_parquet(p), "no rows"),
    "zero-byte file": (lambda i, p: p.write_bytes(b""), "not a readable Parquet file"),
    "truncated parquet": (lambda i, p: (i.write_parquet(p), p.write_bytes(p.read_bytes()[:500])), "not a readable Parquet file"),
    "missing file": (lambda i, p: None, "not found"),
}


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_unreadable_file_names_the_file_and_the_problem(case: str, tmp_path: Path, demo) -> None:
    writer, message = FILE_CASES[case]
    path = tmp_path / "bad_items.parquet"
    writer(demo[0], path)
    with pytest.raises(InputUnreadable, match=message) as error:
        run_check(tmp_path, path, demo[1])
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_cli_check_prints_rules_and_exits_3_over_the_limit(tmp_path: Path, demo) -> None:
    items, interactions = demo
    bad = items.with_columns(pl.when(pl.int_range(pl.len()) < 30).then(pl.lit("share")).otherwise(pl.col("body")).alias("body"))
    inter = interactions.with_columns(pl.when(pl.int_range(pl.len()) < 100).then(pl.lit("share")).otherwise(pl.col("event")).alias("event"))
    bad.write_parquet(tmp_path / "items.parquet")
    inter.write_parquet(tmp_path / "interactions.parquet")
    cli = str(Path(sys.executable).with_name("nightscore"))
    done = subprocess.run([cli, "contracts", "check", "--items", str(tmp_path / "items.parquet"), "--interactions",
                           str(tmp_path / "interactions.parquet"), "--home", str(tmp_path / "h")], capture_output=True, text=True)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "event:isin" in done.stdout and "FAIL" in done.stdout
