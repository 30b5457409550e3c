"""Flow tier: a warehouse locked by another process makes a run wait (bounded) and then fail clearly, never turn into a
silent "first run" without drift checks or reuse (issue 18, item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import WarehouseBusy
from core.run_context import run_folder
from core.settings import load_settings
from data_contracts.datasets import DATASETS
from flows.nightly import nightly
from flows.params import NightlyParams
from nightscore import cli
from storage.lake import Lake
from storage.published_stats import published_stats
from storage.resources import cache_for, lake_for, warehouse_for
from storage.warehouse.base import Warehouse
from storage.warehouse.runs import PublishedRun
from tasks.on_demand import latest_inputs
from tasks.plan import previous_vectors
from tasks.report import previous_scores
from tasks.start import run_ref, saved_run
from tests.helpers import demo_inputs
from tests.storage.test_warehouse import hold_write_lock


def params(folder: Path, run_date: str) -> NightlyParams:
    """Return nightly parameters on demo inputs in folder."""
    return NightlyParams(
        items_uri=str(folder / "items.parquet"), interactions_uri=str(folder / "interactions.parquet"), run_date=run_date
    )


LOOKUPS = {
    "suites: previous stats": lambda lake, wh, run: published_stats(lake, wh, ["items", "interactions"]),
    "plan: reusable vectors": lambda lake, wh, run: previous_vectors(lake, wh),
    "on-demand: latest inputs": lambda lake, wh, run: latest_inputs(lake, wh),
    "report: previous scores": lambda lake, wh, run: previous_scores(lake, wh, run),
    "latest_published": lambda lake, wh, run: wh.latest_published(),
}


def test_a_held_lock_fails_every_previous_run_lookup_and_the_run_clearly(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = demo_inputs(tmp_path / "in", items=120, users=30, seed=3)
    first = nightly(params(folder, "2026-11-29"))
    monkeypatch.setenv("NIGHTSCORE_WAREHOUSE_LOCK_TIMEOUT_S", "0.5")  # each lookup waits this long, then fails
    cfg = load_settings()
    lake: Lake = lake_for(cfg)
    warehouse: Warehouse = warehouse_for(cfg)
    run = run_ref(saved_run(lake, "2026-11-29", first.run_id), cfg)
    holder = hold_write_lock(Path(cfg.warehouse_location), 120)
    try:
        for name, lookup in LOOKUPS.items():
            with pytest.raises(WarehouseBusy, match="locked by another process"):
                lookup(lake, warehouse, run)
                pytest.fail(f"{name} answered as if there were no previous run")
        with pytest.raises(WarehouseBusy, match="locked by another process"):
            nightly(params(folder, "2026-11-30"))
        assert cli.main(["runs", "--home", str(tiny)]) == 1
        err = capsys.readouterr().err
        failures = [line for line in err.splitlines() if line.startswith("nightscore:")]  # retry warnings may log too
        assert len(failures) == 1 and "locked by another process" in failures[0] and "unexpected" not in err, err
        assert "Traceback" not in err, err
    finally:
        holder.kill()
        holder.wait()
    rows = warehouse.query("SELECT run_id, status FROM scoring_runs ORDER BY started_at").rows
    assert rows == [(first.run_id, "published")]  # the blocked attempt never started as a first run
    with cache_for(cfg) as cache:
        assert cache.current() == first.run_id


def test_a_gate_reads_every_datasets_previous_stats_from_one_lookup(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = nightly(params(demo_inputs(tmp_path / "in", items=120, users=30, seed=3), "2026-11-29"))
    cfg = load_settings()
    lake: Lake = lake_for(cfg)
    warehouse: Warehouse = warehouse_for(cfg)
    lookups: list[str | None] = []
    real = warehouse.latest_published

    def counted(excluding: str | None = None) -> PublishedRun | None:
        lookups.append(excluding)
        return real(excluding)

    monkeypatch.setattr(warehouse, "latest_published", counted)

    stats = published_stats(lake, warehouse, DATASETS).stats
    folder = run_folder(lake.uri, "2026-11-29", first.run_id)
    assert stats == {dataset: lake.read_json(f"{folder}/contracts/{dataset}.stats.json") for dataset in DATASETS}
    assert all(stats.values()) and lookups == [None]  # one lookup: every dataset compared with the same run
