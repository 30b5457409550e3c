"""Flow tier: the nightly flow with the cascade on, the tiny encoder as the small model and its 2-layer twin as the large."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from core.errors import ModelLoadError
from core.run_context import run_folder
from core.settings import load_settings
from flows.nightly import nightly
from flows.params import NightlyParams
from nightscore.demo import generate_demo_data
from storage.resources import lake_for, warehouse_for
from tests.flow.test_nightly_flow import RUN_DATE, write_inputs
from tests.tiny_model import write_tiny_model

CURVE_PNG = "cascade--agreement-with-the-all-large-topics-and-encode-cost-vs-share-routed.png"


def query(sql: str) -> list[tuple[object, ...]]:
    """Return the rows of a query on the test's warehouse."""
    return [tuple(row) for row in warehouse_for(load_settings()).query(sql).rows]


@pytest.fixture
def cascade(tiny: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Return the large twin's folder, configured as the cascade's large model with a budget of 20% of the items."""
    twin = write_tiny_model(tmp_path_factory.getbasetemp() / "tiny-bert-twin", layers=2, seed=1)
    monkeypatch.setenv("NIGHTSCORE_LARGE_MODEL", str(twin))
    monkeypatch.setenv("NIGHTSCORE_CASCADE_BUDGET_SHARE", "0.2")
    monkeypatch.setenv("NIGHTSCORE_CASCADE_SAMPLE", "64")
    monkeypatch.setenv("NIGHTSCORE_MAX_SEQ_LENGTH", "128")  # the small model truncates ~12% of the demo texts
    return twin


def test_the_nightly_run_routes_the_budgets_share_to_the_large_model(cascade: Path, tmp_path: Path) -> None:
    items, interactions = generate_demo_data(300, 60, seed=5)
    items_uri, inter_uri = write_inputs(tmp_path / "in", items, interactions)
    record = nightly(NightlyParams(run_date=RUN_DATE, items_uri=items_uri, interactions_uri=inter_uri)).record

    assert record.routed_items == 60 and record.cascade_budget == "share 0.2"
    assert record.routed_truncated is not None and record.routed_margin is not None
    assert 0 < record.routed_truncated < 60 and record.routed_truncated + record.routed_margin == 60
    assert record.cascade_model_version is not None and record.cascade_model_version.startswith("tiny-bert-twin@")
    assert record.cascade_agreement is not None and 0 <= record.cascade_agreement <= 1
    assert query("select scored_by, count(*) from latest_item_scores group by 1 order by 1") == [("large", 60), ("small", 240)]
    assert query("select count(distinct model_version) from latest_item_scores") == [(1,)]  # one model's vectors
    assert query("select routed_items, cascade_threshold is not null from latest_run") == [(60, True)]
    lake = lake_for(load_settings())
    folder = run_folder(lake.uri, record.run_date, record.run_id)
    curve = lake.read_parquet(f"{folder}/cascade_curve.parquet")
    assert curve.filter(pl.col("point") == "curve").get_column("agreement").to_list()[-1] == 1.0  # all routed = all-large
    assert lake.exists(f"{folder}/report/{CURVE_PNG}")


def test_a_configured_large_model_that_is_not_there_fails_before_any_work(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NIGHTSCORE_LARGE_MODEL", str(tmp_path / "no-such-model"))
    items, interactions = generate_demo_data(50, 10, seed=6)
    items_uri, inter_uri = write_inputs(tmp_path / "in", items, interactions)
    with pytest.raises(ModelLoadError, match="no-such-model"):
        nightly(NightlyParams(run_date=RUN_DATE, items_uri=items_uri, interactions_uri=inter_uri))
    assert not (tiny / "warehouse.duckdb").exists() and not (tiny / "lake" / "runs").exists()  # refused before any work
