"""Storage tier: the DuckDB warehouse adapter on real files."""

from __future__ import annotations

import subprocess
import sys
from datetime import date, datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from nightscore.errors import PublishError, UsageError
from storage.warehouse import DuckDBWarehouse

DIM = 384


def scores(run_id: str, run_date: date, n: int) -> pa.Table:
    """Return n item_scores rows of a run."""
    vectors = np.eye(n, DIM, dtype=np.float32)
    return pl.DataFrame({
        "run_id": [run_id] * n, "run_date": [run_date] * n, "item_id": [f"i{i}" for i in range(n)],
        "model_version": ["m"] * n, "topic": ["sports"] * n, "topic_score": [0.5] * n,
        "token_count": [10] * n, "content_hash": ["h"] * n,
    }).with_columns(pl.Series("embedding", vectors).cast(pl.Array(pl.Float32, DIM))).to_arrow()


def candidates(run_id: str, run_date: date, users: int) -> pa.Table:
    """Return two candidates per user of a run."""
    return pl.DataFrame({
        "run_id": [run_id] * 2 * users, "run_date": [run_date] * 2 * users,
        "user_id": [f"u{u}" for u in range(users) for _ in range(2)], "rank": [1, 2] * users,
        "item_id": ["i0", "i1"] * users, "score": [0.9, 0.8] * users,
    }).cast({"rank": pl.Int32}).to_arrow()


def run_row(run_id: str, run_date: date) -> dict[str, object]:
    """Return a minimal scoring_runs row."""
    return {"run_id": run_id, "flow_name": "nightly", "run_date": run_date, "status": "running",
            "started_at": datetime.now(timezone.utc), "rows_in": 3}


def publish(wh: DuckDBWarehouse, run_id: str, run_date: date, n: int = 3, **kw: object) -> None:
    """Record and publish a run with n items."""
    wh.record_run(run_row(run_id, run_date))
    wh.publish(run_row(run_id, run_date), scores(run_id, run_date, n), candidates(run_id, run_date, 2), **kw)


def one(wh: DuckDBWarehouse, sql: str) -> object:
    return wh.query(sql).rows[0][0]


def test_publish_makes_the_run_latest(tmp_path: Path) -> None:
    wh = DuckDBWarehouse(str(tmp_path / "w.duckdb"))
    publish(wh, "r1", date(2026, 11, 29))
    publish(wh, "r2", date(2026, 11, 30), n=5)
    assert one(wh, "select run_id from latest_run") == "r2"
    assert one(wh, "select count(*) from latest_item_scores") == 5
    assert one(wh, "select count(*) from item_scores") == 8  # history kept by run_date
    assert one(wh, "select count(*) from latest_user_candidates") == 4


def test_failure_before_commit_rolls_everything_back(tmp_path: Path) -> None:
    wh = DuckDBWarehouse(str(tmp_path / "w.duckdb"))
    publish(wh, "r1", date(2026, 11, 29))

    def explode() -> None:
        raise RuntimeError("cache switch failed")

    with pytest.raises(RuntimeError):
        publish(wh, "r2", date(2026, 11, 29), n=7, before_commit=explode)
    assert one(wh, "select run_id from latest_run") == "r1"
    assert one(wh, "select count(*) from item_scores") == 3
    assert one(wh, "select status from scoring_runs where run_id = 'r2'") == "running"


def test_republishing_a_run_date_replaces_rows(tmp_path: Path) -> None:
    wh = DuckDBWarehouse(str(tmp_path / "w.duckdb"))
    publish(wh, "r1", date(2026, 11, 30))
    publish(wh, "r2", date(2026, 11, 30))
    assert one(wh, "select count(*) from item_scores") == 3
    assert one(wh, "select count(*) from user_candidates") == 4
    assert one(wh, "select status from scoring_runs where run_id = 'r1'") == "replaced"


def test_mark_run_never_touches_a_published_run(tmp_path: Path) -> None:
    wh = DuckDBWarehouse(str(tmp_path / "w.duckdb"))
    wh.record_run({**run_row("r1", date(2026, 11, 30)), "flow_run_id": "f1"})
    publish(wh, "r1", date(2026, 11, 30))
    wh.record_run({**run_row("r2", date(2026, 12, 1)), "flow_run_id": "f2"})
    assert wh.mark_run("f1", "failed", "late failure") == 0
    assert wh.mark_run("f2", "failed", "bad input") == 1
    assert wh.query("select run_id, status from scoring_runs order by run_id").rows == [("r1", "published"), ("r2", "failed")]


def test_query_is_read_only_and_needs_a_warehouse(tmp_path: Path) -> None:
    wh = DuckDBWarehouse(str(tmp_path / "w.duckdb"))
    with pytest.raises(UsageError, match="no warehouse"):
        wh.query("select 1")
    publish(wh, "r1", date(2026, 11, 30))
    with pytest.raises(Exception, match="read-only"):
        wh.query("delete from item_scores")
    assert one(wh, "select count(*) from item_scores") == 3


HOLD_LOCK = """
import duckdb, sys, time
con = duckdb.connect(sys.argv[1])
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def hold_write_lock(path: Path, seconds: float) -> subprocess.Popen[str]:
    """Start a process that holds DuckDB's write lock on path for a while; return it once locked."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_publish_waits_for_a_lock_then_succeeds(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    wh = DuckDBWarehouse(str(path), lock_retries=10, lock_backoff_s=0.2)
    publish(wh, "r1", date(2026, 11, 29))
    holder = hold_write_lock(path, 1.0)
    publish(wh, "r2", date(2026, 11, 30))
    holder.wait(timeout=30)
    assert one(wh, "select run_id from latest_run") == "r2"


def test_publish_gives_up_on_a_held_lock_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    publish(DuckDBWarehouse(str(path)), "r1", date(2026, 11, 29))
    holder = hold_write_lock(path, 30)
    try:
        with pytest.raises(PublishError, match="locked by another process"):
            publish(DuckDBWarehouse(str(path), lock_retries=2, lock_backoff_s=0.05), "r2", date(2026, 11, 30))
    finally:
        holder.kill()
        holder.wait()
    assert one(DuckDBWarehouse(str(path)), "select run_id from latest_run") == "r1"
