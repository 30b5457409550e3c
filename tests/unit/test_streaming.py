"""Unit tests of the streamed data path: lake batches, batched output contracts, ordered scoring ranges, stream publish."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from data_contracts.outputs import item_score_failures
from storage.lake import Lake
from storage.warehouse.duckdb_warehouse import DuckDBWarehouse
from tasks import score as scoring
from tasks.score import RangeSpill, range_bounds


def _scores(n: int, dim: int = 4, topic_score: float = 0.5) -> pl.DataFrame:
    vectors = np.eye(n, dim, dtype=np.float32) if n <= dim else np.tile(np.eye(1, dim, dtype=np.float32), (n, 1))
    return pl.DataFrame(
        {"item_id": [f"i{i:03d}" for i in range(n)], "topic": ["sports"] * n, "topic_score": [topic_score] * n}
    ).with_columns(pl.Series("embedding", vectors).cast(pl.Array(pl.Float32, dim)))


def test_lake_frames_round_trip_in_batches(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    frame = _scores(10)
    uri = lake.write_parquet_frames((frame.slice(i, 3) for i in range(0, 10, 3)), lake.uri("x.parquet"))
    batches = list(lake.iter_frames(uri, batch_size=4, columns=["item_id", "embedding"]))
    assert [b.height for b in batches] == [4, 4, 2]
    assert pl.concat(batches).equals(frame.select("item_id", "embedding"))
    assert lake.parquet_rows(uri) == 10


def test_lake_writes_an_empty_file_with_the_schema(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    uri = lake.write_parquet_frames([], lake.uri("empty.parquet"), pl.Schema({"item_id": pl.String}))
    assert lake.read_parquet(uri).schema == pl.Schema({"item_id": pl.String})


def test_batched_output_contract_equals_whole_frame() -> None:
    bad = _scores(6).with_columns(
        pl.when(pl.col("item_id") == "i004").then(1.5).otherwise(pl.col("topic_score")).alias("topic_score")
    )
    whole = item_score_failures(bad, ["sports"], 7)
    batched = item_score_failures((bad.slice(i, 2) for i in range(0, 6, 2)), ["sports"], 7)
    assert batched == whole
    assert any("6 rows, expected 7" in f for f in whole) and any("topic_score" in f for f in whole)


def test_batched_output_contract_finds_duplicates_across_batches() -> None:
    frame = pl.concat([_scores(3), _scores(3).slice(0, 1)])  # i000 twice, in different batches
    assert item_score_failures((frame.slice(i, 2) for i in range(0, 4, 2)), ["sports"], 4) == [
        "item_scores.item_id is not unique"
    ]


@pytest.mark.parametrize("block", [1, 2, 3, 100])
def test_range_spill_returns_each_range_sorted_and_complete(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, block: int) -> None:
    monkeypatch.setattr(scoring, "SCORE_BLOCK", block)
    ids = pl.Series("item_id", [f"i{i:02d}" for i in np.random.default_rng(0).permutation(11)])
    bounds = range_bounds(ids)
    assert bounds.is_sorted()
    with RangeSpill(bounds) as spill:
        for part in (ids[:4], ids[4:]):
            spill.add("v", pl.DataFrame({"item_id": part, "x": part.str.slice(1).cast(pl.Int64)}))
        out = pl.concat([spill.read("v", r).sort("item_id") for r in range(len(bounds))])
    assert out.get_column("item_id").to_list() == sorted(ids.to_list())


def test_range_bounds_never_leave_a_one_row_last_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scoring, "SCORE_BLOCK", 2)
    ids = pl.Series("item_id", [f"i{i:02d}" for i in range(11)])
    assert range_bounds(ids).to_list() == ["i00", "i02", "i04", "i06", "i08"]  # the 11th id joins the last range


def test_duckdb_publishes_an_arrow_stream(tmp_path: Path) -> None:
    wh = DuckDBWarehouse(str(tmp_path / "w.duckdb"), embedding_dim=2)
    n = 5
    table = pa.table(
        {
            "run_id": ["r1"] * n,
            "run_date": [date(2026, 11, 30)] * n,
            "item_id": [f"i{i}" for i in range(n)],
            "model_version": ["m"] * n,
            "topic": ["sports"] * n,
            "topic_score": [0.5] * n,
            "token_count": pa.array([3] * n, pa.int32()),
            "content_hash": ["h"] * n,
            "embedding": pa.array([[1.0, 0.0]] * n, pa.list_(pa.float32(), 2)),
        }
    )
    stream = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=2))
    candidates = pa.table(
        {
            "run_id": ["r1"],
            "run_date": [date(2026, 11, 30)],
            "user_id": ["u"],
            "rank": pa.array([1], pa.int32()),
            "item_id": ["i0"],
            "score": [0.9],
        }
    )
    wh.publish({"run_id": "r1", "run_date": date(2026, 11, 30), "flow_name": "nightly"}, stream, candidates)
    assert wh.query("select count(*), min(item_id), max(item_id) from item_scores").rows == [(5, "i0", "i4")]
