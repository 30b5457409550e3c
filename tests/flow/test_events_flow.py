"""Flow tier: fresh events between batch runs, end to end: a click posted to the service is no longer recommended,
`nightscore events export` writes it to the lake, and the next nightly run ingests it as an interaction."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polars as pl
from fastapi.testclient import TestClient

from core.settings import load_settings
from flows.nightly import nightly
from flows.params import NightlyParams
from nightscore.cli import main
from serving.app import create_app
from serving.config import serving_config
from storage.resources import lake_for, warehouse_for
from tests.helpers import demo_inputs


def run(folder: Path, run_date: str) -> object:
    """Run the nightly flow on a folder of demo inputs."""
    return nightly(
        NightlyParams(
            run_date=run_date, items_uri=str(folder / "items.parquet"), interactions_uri=str(folder / "interactions.parquet")
        )
    )


def test_a_click_is_excluded_at_once_and_ingested_by_the_next_nightly_run(tiny: Path, tmp_path: Path) -> None:
    folder = demo_inputs(tmp_path / "in", items=300, users=80, seed=3)
    run(folder, "2026-11-30")  # candidates computed as of 2026-12-01T00:00Z
    user = warehouse_for(load_settings()).query("SELECT user_id FROM latest_user_candidates LIMIT 1").rows[0][0]
    clicked_at = datetime(2026, 12, 1, 8, 30, tzinfo=UTC)
    with TestClient(create_app(serving_config(load_settings()))) as client:
        path = f"/v1/users/{user}/recommendations"
        top = client.get(path).json()["items"][0]["item_id"]
        body = {"user_id": user, "item_id": top, "event": "click", "ts": clicked_at.isoformat()}
        assert client.post("/v1/events", json=body).status_code == 202
        after = client.get(path).json()
        assert after["fallback"] is None and top not in [item["item_id"] for item in after["items"]]

    assert main(["events", "export", "--run-date", "2026-12-01"]) == 0
    run(folder, "2026-12-01")
    runs = (
        warehouse_for(load_settings())
        .query("SELECT run_id FROM scoring_runs WHERE run_date = DATE '2026-12-01' AND status = 'published'")
        .rows
    )
    assert len(runs) == 1
    lake = lake_for(load_settings())
    snapshot = next(Path(lake.uri("runs", "2026-12-01")).glob("*/ingest/interactions.parquet"))
    rows = pl.read_parquet(snapshot).filter((pl.col("user_id") == user) & (pl.col("item_id") == top))
    assert rows.filter((pl.col("event") == "click") & (pl.col("ts") == clicked_at)).height == 1
