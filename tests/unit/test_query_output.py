"""Unit tier: how `nightscore query` prints a result: streamed a batch at a time, valid JSON, a layout that fits (issue 34)."""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest

from nightscore.output import render_stream


def endless() -> Iterator[list[tuple[Any, ...]]]:
    """Yield batches of rows for ever: only a renderer that streams ever returns its first chunk."""
    for start in itertools.count(step=3):
        yield [(n, f"row {n}") for n in range(start, start + 3)]


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_every_format_streams_a_batch_at_a_time(fmt: str) -> None:
    first_chunks = list(itertools.islice(render_stream(["n", "label"], endless(), fmt, 80), 3))
    assert "row 0" in "".join(first_chunks)


def test_json_is_valid_with_nan_and_infinity_as_null() -> None:
    rows = [(float("nan"), float("inf"), [1.0, float("-inf")], {"x": float("nan")}), (1.5, None, [], {})]
    text = "".join(render_stream(["a", "b", "v", "s"], [rows[:1], [], rows[1:]], "json"))

    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    assert json.loads(text, parse_constant=refuse) == [
        {"a": None, "b": None, "v": [1.0, None], "s": {"x": None}},
        {"a": 1.5, "b": None, "v": [], "s": {}},
    ]
    assert json.loads("".join(render_stream(["a"], [], "json"))) == []


def test_csv_has_a_header_then_every_batch() -> None:
    text = "".join(render_stream(["a", "b"], [[(1, "x,y")], [(2, None)]], "csv"))
    assert list(csv.reader(io.StringIO(text))) == [["a", "b"], ["1", "x,y"], ["2", ""]]


def test_a_table_that_fits_is_aligned_with_every_cell_whole() -> None:
    text = "".join(render_stream(["run_id", "rows_in"], [[("nightly-2026-11-30-abcd1234", 300), ("r2", 4)]], "table", 80))
    lines = text.splitlines()
    assert lines[0].split("|")[0].strip() == "run_id" and "nightly-2026-11-30-abcd1234" in lines[2]
    assert len({line.index("|") for line in lines[:1] + lines[2:4]}) == 1  # one column edge
    assert "…" not in text and lines[-1] == "(2 rows)"


def test_a_table_wider_than_the_terminal_is_printed_one_column_per_line() -> None:
    columns = [f"column_{n}" for n in range(12)]
    row = tuple(f"value-{n}-" + "x" * 20 for n in range(12))
    text = "".join(render_stream(columns, [[row, row]], "table", 80))
    lines = text.splitlines()
    assert lines[0].startswith("-[ RECORD 1 ]") and lines[1] == f"column_0  | {row[0]}"
    assert lines[13].startswith("-[ RECORD 2 ]") and all(len(line) <= 80 for line in lines)
    assert "…" not in text


def test_a_multi_line_cell_keeps_its_lines_in_its_column() -> None:
    plan = "┌─ Projection ─┐\n│ count_star() │\n└──────────────┘"
    lines = "".join(render_stream(["key", "plan"], [[("physical_plan", plan)]], "table", 80)).splitlines()
    assert [line.split(" | ")[1] for line in lines[2:5]] == plan.split("\n")
