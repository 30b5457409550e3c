"""Flow tier: fresh events between batch runs, end to end: a click posted to the service is no longer recommended,
`nightscore events export` writes it to the lake, and the next nightly run ingests it as an interaction; a flood of
events naming items that do not exist is dropped by the service and the next nightly still publishes."""

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

KEY = "flow-test-key-0123456789"
FLOOD = 600  # unknown-item events: more than 5% of the demo's interactions, the quarantine limit


def run(folder: Path, run_date: str) -> object:
    """Run the nightly flow on a folder of demo inputs."""
    return nightly(
        NightlyParams(
            run_date=run_date, items_uri=str(folder / "items.parquet"), interactions_uri=str(folder / "interactions.parquet")
        )
    )


def service() -> TestClient:
    """Return a client of the service over the home's cache and lake (events of any age, no rate limit: a flood)."""
    config = serving_config(load_settings(), api_keys=[KEY], events_max_age_s=1e9, rate_limit_per_s=0.0)
    return TestClient(create_app(config), headers={"Authorization": f"Bearer {KEY}"})


def top_item(client: TestClient, user: str) -> str:
    """Return the first item the service recommends to a user."""
    return str(client.get(f"/v1/users/{user}/recommendations").json()["items"][0]["item_id"])


def test_a_click_is_excluded_at_once_and_ingested_by_the_next_nightly_run(tiny: Path, tmp_path: Path) -> None:
    folder = demo_inputs(tmp_path / "in", items=300, users=80, seed=3)
    run(folder, "2026-11-30")  # its interactions end on 2026-10-31: that is its cut-off, not the end of its date
    users = warehouse_for(load_settings()).query("SELECT DISTINCT user_id FROM latest_user_candidates ORDER BY 1 LIMIT 2").rows
    user, early_user = users[0][0], users[1][0]
    clicked_at = datetime(2026, 12, 1, 8, 30, tzinfo=UTC)
    with service() as client:
        path = f"/v1/users/{user}/recommendations"
        top = top_item(client, user)
        body = {"user_id": user, "item_id": top, "event": "click", "ts": clicked_at.isoformat()}
        assert client.post("/v1/events", json=body).json() == {"status": "accepted"}
        after = client.get(path).json()
        assert after["fallback"] is None and top not in [item["item_id"] for item in after["items"]]
        # after the interactions the run read, within its run date: new to the run, so excluded too
        early = {"user_id": early_user, "item_id": top_item(client, early_user), "event": "view", "ts": "2026-11-15T12:00:00Z"}
        assert client.post("/v1/events", json=early).status_code == 202
        assert top_item(client, early_user) != early["item_id"]
        flood = [
            {"user_id": f"fake-{k % 6}", "item_id": f"no-such-item-{k}", "event": "click", "ts": clicked_at.isoformat()}
            for k in range(FLOOD)
        ]
        answers = [client.post("/v1/events", json=event).json() for event in flood]
        assert answers == [{"status": "dropped", "reason": "unknown_item"}] * FLOOD

    assert main(["events", "export", "--run-date", "2026-12-01"]) == 0
    run(folder, "2026-12-01")
    runs = (
        warehouse_for(load_settings())
        .query(
            "SELECT run_id, interactions_quarantined FROM scoring_runs "
            "WHERE run_date = DATE '2026-12-01' AND status = 'published'"
        )
        .rows
    )
    assert len(runs) == 1 and runs[0][1] == 0  # nothing of the flood reached the run
    lake = lake_for(load_settings())
    snapshot = next(Path(lake.uri("runs", "2026-12-01")).glob("*/ingest/interactions.parquet"))
    rows = pl.read_parquet(snapshot).filter((pl.col("user_id") == user) & (pl.col("item_id") == top))
    assert rows.filter((pl.col("event") == "click") & (pl.col("ts") == clicked_at)).height == 1
