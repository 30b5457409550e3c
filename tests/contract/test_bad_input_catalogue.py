"""Contract tier: the catalogue of bad inputs, each with its expected quarantine rule or unreadable-file error.

Every case starts from a clean demo batch and breaks one thing. Row-level defects are quarantined with
their rule while every valid row passes; file-level defects stop with InputUnreadable (exit 3) naming
the file. (That a failing run publishes nothing and keeps the previous publication is tested at the
flow tier: tests/flow/test_nightly_flow.py.)
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.errors import InputUnreadable
from core.settings import Settings
from data_contracts.inputs import InputRules, duplicate_rows, validate_items
from nightscore.check import InputCheck, check_inputs
from nightscore.demo import generate_demo_data
from storage.lake import Lake

NOW = datetime(2026, 11, 30, tzinfo=UTC)
Demo = tuple[pl.DataFrame, pl.DataFrame]  # (items, interactions), the demo fixture


@pytest.fixture(scope="module")
def demo() -> Demo:
    return generate_demo_data(200, 40, seed=21)


def run_check(tmp_path: Path, items: pl.DataFrame | Path, interactions: pl.DataFrame | Path) -> InputCheck:
    """Write the frames (unless given as files) and return check_inputs on them."""
    paths: list[str] = []
    for name, data in (("items", items), ("interactions", interactions)):
        if isinstance(data, Path):
            paths.append(str(data))
            continue
        path = tmp_path / f"{name}.parquet"
        data.write_parquet(path)
        paths.append(str(path))
    return check_inputs(Lake(str(tmp_path)), Settings(home=tmp_path), paths[0], paths[1], now=NOW)


def set_cell(frame: pl.DataFrame, column: str, row: int, value: object) -> pl.DataFrame:
    return frame.with_columns(
        pl.when(pl.int_range(pl.len()) == row)
        .then(pl.lit(value, dtype=frame.schema[column]))
        .otherwise(pl.col(column))
        .alias(column)
    )


ROW_CASES = {
    "null item_id": ("items", lambda i: set_cell(i, "item_id", 3, None), "item_id:not_nullable"),
    "null body": ("items", lambda i: set_cell(i, "body", 3, None), "body:not_nullable"),
    "duplicate item_id (both copies)": (
        "items",
        lambda i: set_cell(i, "item_id", 4, i["item_id"][3]),
        "item_id:field_uniqueness",
    ),
    "empty text": ("items", lambda i: set_cell(set_cell(i, "body", 3, ""), "title", 3, None), "text:not_blank"),
    "whitespace-only text": ("items", lambda i: set_cell(set_cell(i, "body", 3, " \t "), "title", 3, "  "), "text:not_blank"),
    "1 MB text": ("items", lambda i: set_cell(i, "body", 3, "word " * 200_000), "text:str_length(None, 100000)"),
    "future created_at": (
        "items",
        lambda i: set_cell(i, "created_at", 3, datetime(2027, 3, 1, tzinfo=UTC)),
        "created_at:less_than_or_equal_to",
    ),
    "null user_id": ("interactions", lambda x: set_cell(x, "user_id", 3, None), "user_id:not_nullable"),
    "null ts": ("interactions", lambda x: set_cell(x, "ts", 3, None), "ts:not_nullable"),
    "unknown event type": ("interactions", lambda x: set_cell(x, "event", 3, "share"), "event:isin"),
    "future timestamp": (
        "interactions",
        lambda x: set_cell(x, "ts", 3, datetime(2027, 1, 1, tzinfo=UTC)),
        "ts:less_than_or_equal_to",
    ),
    "unknown item": ("interactions", lambda x: set_cell(x, "item_id", 3, "item-999999"), "item_id:item_exists"),
}


@pytest.mark.parametrize("case", list(ROW_CASES))
def test_row_defect_is_quarantined_with_its_rule_and_the_rest_pass(case: str, tmp_path: Path, demo: Demo) -> None:
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


def test_invalid_utf8_bytes_are_quarantined(tmp_path: Path, demo: Demo) -> None:
    items, interactions = demo
    bodies = [b.encode() for b in items["body"]]
    bodies[5] = b"caf\xe9 \xff\xfe broken bytes"
    table = items.drop("body").to_arrow().append_column("body", pa.array(bodies, type=pa.binary()))
    pq.write_table(table, tmp_path / "items.parquet")
    check = run_check(tmp_path, tmp_path / "items.parquet", interactions)
    assert check.by_rule.filter(pl.col("rule") == "text:valid_utf8")["failures"].to_list() == [1]
    assert check.quarantined["items"] == 1


def test_extra_column_is_ignored(tmp_path: Path, demo: Demo) -> None:
    items, interactions = demo
    check = run_check(tmp_path, items.with_columns(pl.lit(1).alias("unexpected")), interactions)
    assert check.quarantined == {"items": 0, "interactions": 0} and check.passed(0.05)


FILE_CASES = {
    "missing column": (lambda i, p: i.drop("item_id").write_parquet(p), "missing required column"),
    "wrong dtype that cannot be coerced": (
        lambda i, p: i.with_columns(pl.lit(3.5).alias("created_at")).write_parquet(p),
        "column created_at has type Float64",
    ),
    "empty file (no rows)": (lambda i, p: i.head(0).write_parquet(p), "no rows"),
    "zero-byte file": (lambda i, p: p.write_bytes(b""), "not a readable Parquet file"),
    "truncated parquet": (lambda i, p: (i.write_parquet(p), p.write_bytes(p.read_bytes()[:500])), "not a readable Parquet file"),
    "missing file": (lambda i, p: None, "not found"),
}


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_unreadable_file_names_the_file_and_the_problem(case: str, tmp_path: Path, demo: Demo) -> None:
    writer, message = FILE_CASES[case]
    path = tmp_path / "bad_items.parquet"
    writer(demo[0], path)
    with pytest.raises(InputUnreadable, match=message) as error:
        run_check(tmp_path, path, demo[1])
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_cli_check_prints_rules_and_exits_3_over_the_limit(tmp_path: Path, demo: Demo) -> None:
    items, interactions = demo
    bad = items.with_columns(pl.when(pl.int_range(pl.len()) < 30).then(pl.lit("share")).otherwise(pl.col("body")).alias("body"))
    inter = interactions.with_columns(
        pl.when(pl.int_range(pl.len()) < 100).then(pl.lit("share")).otherwise(pl.col("event")).alias("event")
    )
    bad.write_parquet(tmp_path / "items.parquet")
    inter.write_parquet(tmp_path / "interactions.parquet")
    cli = str(Path(sys.executable).with_name("nightscore"))
    done = subprocess.run(
        [
            cli,
            "contracts",
            "check",
            "--items",
            str(tmp_path / "items.parquet"),
            "--interactions",
            str(tmp_path / "interactions.parquet"),
            "--home",
            str(tmp_path / "h"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 3, done.stderr[-2000:]
    assert "event:isin" in done.stdout and "FAIL" in done.stdout


# --- text as it is decoded (issue 18, item 11) ----------------------------------------------------------------


def utf8_declared_with_bad_bytes(items: pl.DataFrame, row: int, data: bytes) -> pa.Table:
    """Return items as Arrow with the body of one row replaced by raw bytes in a column still typed string (UTF-8)."""
    bodies = [b.encode() for b in items["body"]]
    bodies[row] = data
    binary = pa.array(bodies, type=pa.binary())
    body = pa.Array.from_buffers(pa.string(), len(binary), binary.buffers())  # what a careless exporter writes
    return items.drop("body").to_arrow().append_column("body", body)


def test_a_valid_replacement_character_is_kept(tmp_path: Path, demo: Demo) -> None:
    items, interactions = demo
    items = set_cell(items, "body", 5, "Caf\ufffd menu \u2014 the catalogue's own text")
    check = run_check(tmp_path, items, interactions)
    assert check.quarantined["items"] == 0 and check.passed(0.05)


def test_invalid_bytes_in_a_utf8_declared_column_are_quarantined_per_row(tmp_path: Path, demo: Demo) -> None:
    items, interactions = demo
    pq.write_table(utf8_declared_with_bad_bytes(items, 5, b"caf\xe9 \xff broken"), tmp_path / "items.parquet")
    check = run_check(tmp_path, tmp_path / "items.parquet", interactions)  # the whole file is not refused
    assert check.by_rule.filter(pl.col("rule") == "text:valid_utf8")["failures"].to_list() == [1]
    assert check.quarantined["items"] == 1
    lake = Lake(str(tmp_path))  # the run's streaming read path (ingest, validate) says the same
    rules = InputRules(not_after=NOW)
    batches = list(lake.iter_frames(lake.uri("items.parquet"), "items", batch_size=64))
    offsets = range(0, 10_000, 64)
    results = [validate_items(batch, rules, "items.parquet", offset) for batch, offset in zip(batches, offsets, strict=False)]
    quarantine = pl.concat([q for _, q in results])
    assert quarantine.select("row_key", "rule").rows() == [(items["item_id"][5], "text:valid_utf8")]
    assert sum(v.height for v, _ in results) == items.height - 1


def test_invalid_bytes_in_an_interaction_key_name_their_column(tmp_path: Path, demo: Demo) -> None:
    items, interactions = demo
    users = [u.encode() for u in interactions["user_id"]]
    users[2] = b"user-\xc3\x28"
    table = interactions.drop("user_id").to_arrow().append_column("user_id", pa.array(users, type=pa.binary()))
    pq.write_table(table, tmp_path / "interactions.parquet")
    check = run_check(tmp_path, items, tmp_path / "interactions.parquet")
    assert check.by_rule.filter(pl.col("rule") == "user_id:valid_utf8")["failures"].to_list() == [1]


# --- duplicate ids (issue 18, item 12) -------------------------------------------------------------------------


def with_copies(items: pl.DataFrame) -> pl.DataFrame:
    """Return items where item 3's id appears on rows 3, 10 and 20 with three created_at; row 20 is the latest."""
    out = set_cell(set_cell(items, "item_id", 10, items["item_id"][3]), "item_id", 20, items["item_id"][3])
    stamps = [datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 2, tzinfo=UTC), datetime(2026, 11, 3, tzinfo=UTC)]
    for row, stamp in zip((3, 10, 20), (stamps[1], stamps[0], stamps[2]), strict=True):
        out = set_cell(out, "created_at", row, stamp)
    return out.with_columns(
        pl.when(pl.int_range(pl.len()) == 20).then(pl.lit("the newest copy")).otherwise(pl.col("body")).alias("body")
    )


def test_keep_latest_keeps_the_newest_copy_and_says_why_the_others_went(demo: Demo) -> None:
    items = with_copies(demo[0])
    rules = InputRules(not_after=NOW, duplicate_policy="keep_latest")
    valid, quarantine = validate_items(items, rules, "items.parquet")
    kept = valid.filter(pl.col("item_id") == items["item_id"][3])
    assert kept.height == 1 and kept["body"].item() == "the newest copy"
    assert quarantine["rule"].to_list() == ["item_id:duplicate_not_kept"] * 2
    assert all("kept row 20" in reason and "keep_latest" in reason for reason in quarantine["reason"])
    default, all_copies = validate_items(items, InputRules(not_after=NOW), "items.parquet")
    assert all_copies["rule"].to_list() == ["item_id:field_uniqueness"] * 3 and default.height == items.height - 3


def test_keep_latest_breaks_ties_by_the_later_row_and_counts_no_date_as_oldest(demo: Demo) -> None:
    items = set_cell(set_cell(demo[0], "item_id", 9, demo[0]["item_id"][4]), "item_id", 12, demo[0]["item_id"][4])
    same = datetime(2026, 11, 5, tzinfo=UTC)
    items = set_cell(set_cell(set_cell(items, "created_at", 4, same), "created_at", 9, same), "created_at", 12, None)
    dropped = duplicate_rows(items.select("item_id", "created_at"), "keep_latest")
    assert sorted(dropped["__row"].to_list()) == [4, 12]  # row 9 (same date as row 4, later in the file) is kept
    shuffled = duplicate_rows(items.select("item_id", "created_at").reverse(), "keep_latest")  # a re-ordered export
    assert sorted(shuffled["__row"].to_list()) == sorted([items.height - 1 - 9, items.height - 1 - 12])  # row 4 is now later
