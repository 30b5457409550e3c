"""Flow tier: the whole nightly flow with its lake on a real S3 server (moto_server), against the same run on a local lake."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pytest

from core.settings import load_settings
from nightscore.demo import generate_demo_data
from storage import duckdb_lake
from storage.resources import lake_for, warehouse_for
from tests.servers import s3_bucket, s3_endpoint  # noqa: F401  (fixtures)

if TYPE_CHECKING:
    from core.records import Published

RUN_DATE = "2026-11-30"
NEXT_DATE = "2026-12-01"
SCORES = (
    "select item_id, model_version, topic, topic_score, token_count, content_hash, embedding from item_scores order by item_id"
)
CANDIDATES = "select user_id, rank, item_id, score from user_candidates order by user_id, rank"


def run_nightly(**params: Any) -> Published:
    """Run the nightly flow with NightlyParams built from keyword arguments."""
    from flows.nightly import nightly
    from flows.params import NightlyParams

    return nightly(NightlyParams(**params))


def warehouse_frame(sql: str) -> pl.DataFrame:
    """Return a query on the current settings' warehouse as a polars frame."""
    result = warehouse_for(load_settings()).query(sql)
    return pl.DataFrame(result.rows, schema=result.columns, orient="row")


def test_nightly_on_an_s3_lake_matches_a_local_lake(
    tiny: Path,
    s3_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    items, interactions = generate_demo_data(300, 60, seed=11)
    local_in = tmp_path / "in"
    local_in.mkdir()
    items.write_parquet(local_in / "items.parquet")
    interactions.write_parquet(local_in / "interactions.parquet")
    local = run_nightly(
        run_date=RUN_DATE, items_uri=str(local_in / "items.parquet"), interactions_uri=str(local_in / "interactions.parquet")
    )
    local_scores, local_candidates = warehouse_frame(SCORES), warehouse_frame(CANDIDATES)

    s3_home = tmp_path / "home-s3"
    monkeypatch.setenv("NIGHTSCORE_HOME", str(s3_home))
    monkeypatch.setenv("NIGHTSCORE_LAKE_URL", f"{s3_bucket}/lake")
    lake = lake_for(load_settings())
    items_uri = lake.write_parquet(items, f"{s3_bucket}/incoming/items.parquet")
    inter_uri = lake.write_parquet(interactions, f"{s3_bucket}/incoming/interactions.parquet")
    remote = run_nightly(run_date=RUN_DATE, items_uri=items_uri, interactions_uri=inter_uri)

    assert local.record.status == remote.record.status == "published"
    assert local_scores.height == 300 and local_candidates.height == 60 * 20
    assert warehouse_frame(SCORES).equals(local_scores)
    assert warehouse_frame(CANDIDATES).equals(local_candidates)
    assert not (s3_home / "lake").exists()  # every lake file went to S3

    with duckdb_lake.connect(lake) as con:
        hive_scores = duckdb_lake.read_partitions(con, lake, "item_scores").pl()
        hive_candidates = duckdb_lake.read_partitions(con, lake, "user_candidates").pl()
    assert hive_scores.get_column("run_date").unique().to_list() == [dt.date(2026, 11, 30)]
    assert hive_scores.select(local_scores.columns[:6]).sort("item_id").equals(local_scores.drop("embedding"))
    assert hive_candidates.select(local_candidates.columns).sort("user_id", "rank").equals(local_candidates)

    docs = json.loads(
        warehouse_for(load_settings()).query("select data_docs from scoring_runs where run_id = ?", [remote.run_id]).rows[0][0]
    )
    assert set(docs) == {"items", "interactions", "item_scores", "user_candidates"}
    for index in docs.values():
        assert index.startswith(f"{s3_bucket}/lake/runs/{RUN_DATE}/") and index.endswith("/index.html")
        assert lake.exists(index)

    # the next night on S3: published vectors reused from the S3 run folder, a second partition beside the first
    nxt = run_nightly(run_date=NEXT_DATE, items_uri=items_uri, interactions_uri=inter_uri)
    reused, computed = (
        warehouse_for(load_settings())
        .query("select rows_reused, rows_computed from scoring_runs where run_id = ?", [nxt.run_id])
        .rows[0]
    )
    assert (reused, computed) == (300, 0)
    with duckdb_lake.connect(lake) as con:
        per_date = duckdb_lake.read_partitions(con, lake, "user_candidates").aggregate("run_date, count(*)").order("run_date")
        assert per_date.fetchall() == [(dt.date(2026, 11, 30), 1200), (dt.date(2026, 12, 1), 1200)]
