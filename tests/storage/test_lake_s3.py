"""Storage tier: the lake adapter and DuckDB on its Hive partitions, on a local folder and on a real S3 server (moto)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pytest

from core.errors import InputUnreadable, PublishError
from core.settings import LakeSettings, Settings
from storage import duckdb_lake
from storage.lake import Lake
from storage.resources import lake_for, lake_storage_options
from tests.servers import s3_bucket, s3_endpoint  # noqa: F401  (fixtures)

FRAME = pl.DataFrame({"item_id": ["a", "b", "c"], "score": [0.5, 0.25, 1.0], "n": [1, 2, 3]})


@pytest.fixture(params=["local", "s3"])
def lake(request: pytest.FixtureRequest, tmp_path: Path) -> Lake:
    """Return a lake under a local folder or under a prefix of a fresh bucket on moto_server."""
    if request.param == "local":
        return Lake(str(tmp_path / "lake"))
    bucket = request.getfixturevalue("s3_bucket")
    return lake_for(Settings(home=tmp_path, lake=LakeSettings(url=f"{bucket}/lake")))


def test_parquet_round_trip_with_columns_and_filter(lake: Lake) -> None:
    uri = lake.uri("runs", "2026-11-30", "r1", "frame.parquet")
    assert not lake.exists(uri)
    assert lake.write_parquet(FRAME, uri) == uri
    assert lake.exists(uri)
    assert lake.read_parquet(uri).equals(FRAME)
    got = lake.read_parquet(uri, columns=["item_id", "n", "missing"], where=pl.col("n") >= 2)
    assert got.equals(FRAME.filter(pl.col("n") >= 2).select("item_id", "n"))


def test_writes_leave_only_the_final_files(lake: Lake) -> None:
    lake.write_parquet(FRAME, lake.uri("a", "x.parquet"))
    lake.write_parquet(FRAME.head(1), lake.uri("a", "x.parquet"))  # replaced whole
    lake.write_json({"done": True}, lake.uri("a", "x.done"))
    root = lake.fs._strip_protocol(lake.root)
    assert sorted(p.rsplit("/", 1)[1] for p in lake.fs.find(root)) == ["x.done", "x.parquet"]
    assert lake.read_parquet(lake.uri("a", "x.parquet")).height == 1


def test_a_failed_write_leaves_no_file(lake: Lake) -> None:
    uri = lake.uri("broken.parquet")
    with pytest.raises(Exception):
        lake.write_parquet(pl.DataFrame({"o": [object()]}, schema={"o": pl.Object}), uri)
    assert not lake.exists(uri)


def test_json_markers(lake: Lake) -> None:
    uri = lake.uri("runs", "r1", "run.json")
    assert lake.read_json(uri) is None
    lake.write_json({"run_id": "r1", "when": dt.date(2026, 11, 30)}, uri)
    assert lake.read_json(uri) == {"run_id": "r1", "when": "2026-11-30"}


def test_missing_and_corrupt_parquet_are_input_unreadable(lake: Lake) -> None:
    with pytest.raises(InputUnreadable, match=r"items file .*nope.parquet: not found"):
        lake.read_parquet(lake.uri("nope.parquet"), "items")
    uri = lake.uri("bad.parquet")
    fs, path = lake.fs, lake.fs._strip_protocol(uri)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, b"PAR1 not really")
    with pytest.raises(InputUnreadable, match=r"items file .*bad\.parquet: not a readable Parquet file"):
        lake.read_parquet(uri, "items")


def test_put_dir_copies_a_local_tree(lake: Lake, tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "static" / "css").mkdir(parents=True)
    (site / "index.html").write_text("<html>index</html>")
    (site / "static" / "css" / "style.css").write_text("body {}")
    uris = lake.put_dir(site, lake.uri("docs", "items"))
    assert uris == [lake.uri("docs", "items", "index.html"), lake.uri("docs", "items", "static", "css", "style.css")]
    fs = lake.fs
    assert fs.cat_file(fs._strip_protocol(uris[0])) == b"<html>index</html>"
    assert lake.exists(uris[1])


def test_s3_lake_from_settings_endpoint_and_region(
    s3_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Endpoint and region from settings alone (no AWS_ENDPOINT_URL); inputs in the same bucket reach the same server."""
    import os

    import s3fs

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    s3fs.S3FileSystem.clear_instance_cache()
    cfg = Settings(home=tmp_path, lake=LakeSettings(url=f"{s3_bucket}/p", s3_endpoint_url=endpoint, s3_region="us-east-1"))
    assert lake_storage_options(cfg)["endpoint_url"] == endpoint
    lake = lake_for(cfg)
    outside = f"{s3_bucket}/inputs/items.parquet"  # not under the lake root: resolved with the lake's options
    lake.write_parquet(FRAME, outside)
    assert lake.read_parquet(outside).equals(FRAME)
    assert lake_storage_options(Settings(home=tmp_path, lake=LakeSettings(s3_endpoint_url=endpoint))) == {}  # a local lake


def test_duckdb_writes_and_reads_hive_partitions(lake: Lake) -> None:
    rows = pl.DataFrame(
        {
            "run_date": [dt.date(2026, 11, 29)] * 2 + [dt.date(2026, 11, 30)] * 3,
            "item_id": ["a", "b", "a", "b", "c"],
            "score": [0.1, 0.2, 0.3, 0.4, 0.5],
        }
    )
    with duckdb_lake.connect(lake) as con:
        uris = duckdb_lake.write_partitions(con, lake, "item_scores", rows.to_arrow())
        assert uris == [lake.uri("outputs", "item_scores", f"run_date=2026-11-{d}", "part-0.parquet") for d in (29, 30)]
        counts = duckdb_lake.read_partitions(con, lake, "item_scores").aggregate("run_date, count(*)").order("run_date")
        assert counts.fetchall() == [(dt.date(2026, 11, 29), 2), (dt.date(2026, 11, 30), 3)]

        stale = lake.uri("outputs", "item_scores", "run_date=2026-11-30", "part-1.parquet")
        lake.write_parquet(rows.drop("run_date"), stale)  # a file of an earlier, larger write
        duckdb_lake.write_partitions(con, lake, "item_scores", rows.filter(pl.col("item_id") == "c").to_arrow())
        again = duckdb_lake.read_partitions(con, lake, "item_scores").aggregate("run_date, count(*)").order("run_date")
        assert again.fetchall() == [(dt.date(2026, 11, 29), 2), (dt.date(2026, 11, 30), 1)]
    assert not lake.exists(stale)
    staged = lake.fs._strip_protocol(lake.uri("outputs", duckdb_lake.STAGING))
    assert not lake.fs.exists(staged) or lake.fs.find(staged) == []


def test_duckdb_partitions_straight_from_a_lake_file(lake: Lake) -> None:
    """A run's Parquet file in the lake is partitioned by DuckDB reading it from the lake (no Python frame)."""
    rows = pl.DataFrame(
        {
            "run_date": [dt.date(2026, 12, 1)] * 4,
            "user_id": ["u1", "u1", "u2", "u2"],
            "rank": [1, 2, 1, 2],
            "item_id": ["a", "b", "b", "c"],
        }
    )
    source = lake.write_parquet(rows, lake.uri("runs", "2026-12-01", "r9", "user_candidates.parquet"))
    with duckdb_lake.connect(lake) as con:
        assert duckdb_lake.write_partitions(con, lake, "user_candidates", source) == [
            lake.uri("outputs", "user_candidates", "run_date=2026-12-01", "part-0.parquet")
        ]
        back = duckdb_lake.read_partitions(con, lake, "user_candidates").pl().sort("user_id", "rank")
    assert back.select(rows.columns).equals(rows)
    with duckdb_lake.connect(lake) as con, pytest.raises(PublishError, match="no run_date column"):
        duckdb_lake.write_partitions(con, lake, "user_candidates", rows.drop("run_date").to_arrow())


def test_partition_files_keep_row_groups_small_and_rows_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition is written in row groups of at most ROW_GROUP_ROWS rows (DuckDB's default row group of a
    1M-item run held 180 MB of embeddings at a time), under a capped buffer pool, rows in source order."""
    import pyarrow.parquet as pq

    monkeypatch.setattr(duckdb_lake, "ROW_GROUP_ROWS", 4096)
    lake = Lake(str(tmp_path / "lake"))
    n = 20_000
    rows = pl.DataFrame(
        {
            "run_date": [dt.date(2026, 12, 1)] * n,
            "item_id": [f"item-{i:06d}" for i in range(n)],
            "embedding": [[float(i)] * 8 for i in range(n)],
        }
    )
    with duckdb_lake.connect(lake) as con:
        [uri] = duckdb_lake.write_partitions(con, lake, "item_scores", rows.to_arrow())
        assert con.execute("select current_setting('memory_limit')").fetchall() == [("488.2 MiB",)]
    meta = pq.ParquetFile(uri).metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sum(sizes) == n and max(sizes) <= 4096 and len(sizes) >= 5
    assert pl.read_parquet(uri).equals(rows.drop("run_date"))
