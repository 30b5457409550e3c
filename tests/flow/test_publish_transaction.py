"""Flow tier: warehouse and cache publish inside one Prefect transaction; a failure after the commit is taken back."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from core.settings import load_settings
from flows.nightly import nightly
from flows.params import NightlyParams
from nightscore.demo import generate_demo_data
from storage.resources import cache_for, lake_for, warehouse_for


def inputs(folder: Path, seed: int, run_date: str) -> NightlyParams:
    """Write demo inputs (200 items, 40 users) and return nightly parameters for run_date reading them."""
    items, interactions = generate_demo_data(200, 40, seed=seed)
    folder.mkdir(parents=True)
    items.write_parquet(folder / "items.parquet")
    interactions.write_parquet(folder / "interactions.parquet")
    return NightlyParams(
        items_uri=str(folder / "items.parquet"), interactions_uri=str(folder / "interactions.parquet"), run_date=run_date
    )


def test_partition_failure_after_the_commit_retracts_warehouse_and_cache(tiny: Path, tmp_path: Path) -> None:
    first = nightly(inputs(tmp_path / "a", 1, "2026-11-29"))
    cfg = load_settings()
    lake = lake_for(cfg)
    blocker = Path(lake.fs._strip_protocol(lake.uri("outputs", "_staging")))
    shutil.rmtree(blocker, ignore_errors=True)
    blocker.write_text("a file where the partition writer needs a folder")  # the lake step after the commit fails

    with pytest.raises(Exception):
        nightly(inputs(tmp_path / "b", 2, "2026-11-30"))

    warehouse = warehouse_for(cfg)
    assert warehouse.query("select run_id from latest_run").rows == [(first.run_id,)]
    statuses = dict(warehouse.query("select run_date::varchar, status from scoring_runs").rows)
    assert statuses == {"2026-11-29": "published", "2026-11-30": "failed"}
    with cache_for(cfg) as cache:
        assert cache.current() == first.run_id
        assert cache.versions() == [first.run_id]  # the failed run's staged version was rolled back too

    blocker.unlink()  # the next night publishes normally
    third = nightly(inputs(tmp_path / "c", 3, "2026-12-01"))
    assert warehouse.query("select run_id from latest_run").rows == [(third.run_id,)]


def test_a_failing_step_after_publish_rolls_back_the_publication_through_its_hook(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = nightly(inputs(tmp_path / "a", 1, "2026-11-29"))
    serving = Path(load_settings().lake_root) / "serving"
    serving.rename(serving.with_name("serving-before"))
    serving.write_text("serving features cannot be written under a file")  # the step after publish fails

    with pytest.raises(Exception):
        nightly(inputs(tmp_path / "b", 2, "2026-11-30"))

    cfg = load_settings()
    warehouse = warehouse_for(cfg)
    assert warehouse.query("select run_id from latest_run").rows == [(first.run_id,)]
    assert dict(warehouse.query("select run_date::varchar, status from scoring_runs").rows)["2026-11-30"] == "failed"
    with cache_for(cfg) as cache:
        assert cache.current() == first.run_id and cache.versions() == [first.run_id]
