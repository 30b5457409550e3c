"""Flow tier: after every failure point of a publication, the warehouse's latest run, the cache's current and
previous pointers and the lake's partitions agree, and the failed run leaves no rows (issue 18, items 5 and 6).

Failure points: inside the warehouse transaction just before its commit (injected disk-full error), after the
commit while the lake partitions are written (injected, every table staged, none moved), and in the serving
features step after `publish` (a file where the features folder goes). Each runs without a previous publication,
with two previous ones (so the previous pointer matters), and as a re-publish of the latest run's own date.

The previous runs of a setup are made once per module, in one home folder, and copied back into that same folder
before each test that needs them (their records hold absolute paths, so the folder never moves): 3 runs instead of 15.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import duckdb
import pytest

from core.errors import WarehouseMissing
from core.records import Published
from core.settings import load_settings
from flows.nightly import nightly
from flows.params import NightlyParams
from storage.resources import cache_for, lake_for, warehouse_for
from tests.helpers import demo_inputs, restore_tree

DAYS = ("2026-11-28", "2026-11-29", "2026-11-30")


def run(folder: Path, run_date: str) -> Published:
    """Run the nightly flow on the demo inputs in folder for run_date."""
    return nightly(
        NightlyParams(
            items_uri=str(folder / "items.parquet"), interactions_uri=str(folder / "interactions.parquet"), run_date=run_date
        )
    )


class State(TypedDict):
    """What state() reads: the warehouse's latest run, the cache's pointers, rows and partitions per run."""

    latest: str | None
    pointers: tuple[str | None, str | None, list[str]]
    rows: dict[str, int]
    candidates: set[str]
    partitions: dict[str, str]


def state() -> State:
    """Return what must agree: warehouse latest, cache pointers and versions, rows per run, partitions per date."""
    cfg = load_settings()
    warehouse, lake = warehouse_for(cfg), lake_for(cfg)
    latest = warehouse.latest_published()
    rows: dict[str, int]
    candidates: set[str]
    try:
        rows = dict(warehouse.query("SELECT run_id, count(*) FROM item_scores GROUP BY run_id").rows)
        candidates = {r[0] for r in warehouse.query("SELECT DISTINCT run_id FROM user_candidates").rows}
    except WarehouseMissing:  # before the first run
        rows, candidates = {}, set()
    with cache_for(cfg) as cache:
        pointers = (cache.current(), cache.previous(), cache.versions())
    glob = f"{lake.root}/outputs/item_scores/*/*.parquet"
    written = list(Path(lake.root, "outputs", "item_scores").glob("*/*.parquet"))
    sql = f"SELECT run_date::varchar, min(run_id) FROM read_parquet('{glob}', hive_partitioning = true) GROUP BY 1"
    partitions: dict[str, str] = {}
    if written:
        relation = duckdb.sql(sql)
        assert relation is not None
        partitions = dict(relation.fetchall())
    return {
        "latest": latest.run_id if latest else None,
        "pointers": pointers,
        "rows": rows,
        "candidates": candidates,
        "partitions": partitions,
    }


def block_serving_features() -> Path:
    """Put a file where the serving features of the next run go, so publish-serving-features fails; return it."""
    serving = Path(load_settings().lake_root) / "serving"
    if serving.exists():
        shutil.rmtree(serving)
    serving.parent.mkdir(parents=True, exist_ok=True)
    serving.write_text("serving features cannot be written under a file")
    return serving


@dataclass
class Histories:
    """The previous runs of each setup, made once: a home folder, each setup's copy of it and its runs."""

    home: Path
    inputs: Path
    copies: dict[str, tuple[Path, list[Published]]] = field(default_factory=dict)

    def restore(self, setup: str) -> list[Published]:
        """Put the setup's previous runs into self.home (making them on first use) and return them."""
        if setup not in self.copies:
            base = self.restore("previous") if setup == "same-date" else []
            if setup == "previous":
                shutil.rmtree(self.home, ignore_errors=True)
            days = [DAYS[1]] if setup == "same-date" else list(DAYS[:2])  # same-date: replace the latest date's run
            made = base + [run(self.inputs, day) for day in days]
            shutil.copytree(self.home, self.home.with_name(setup))
            self.copies[setup] = (self.home.with_name(setup), made)
        copy, made = self.copies[setup]
        restore_tree(copy, self.home)
        return made


@pytest.fixture(scope="module")
def histories(tmp_path_factory: pytest.TempPathFactory) -> Histories:
    """Return this module's shared previous runs (made on first use, in the tiny configuration)."""
    root = tmp_path_factory.mktemp("histories")
    return Histories(root / "home", demo_inputs(root / "in", items=120, users=30, seed=5))


@pytest.mark.parametrize("setup", ["first", "previous", "same-date"])
@pytest.mark.parametrize("point", ["publish:before-commit", "publish:partitions", "serving-features"])
def test_every_failure_point_leaves_warehouse_cache_and_lake_agreeing(
    point: str, setup: str, tiny: Path, histories: Histories, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = histories.inputs
    earlier: list[Published] = []
    if setup != "first":
        monkeypatch.setenv("NIGHTSCORE_HOME", str(histories.home))
        earlier = histories.restore(setup)
    before = state()
    if point == "serving-features":
        block_serving_features()
    else:
        monkeypatch.setenv("NIGHTSCORE_FAILPOINTS", json.dumps({point: "enospc"}))

    with pytest.raises(Exception):
        run(folder, DAYS[1] if setup == "same-date" else DAYS[2])

    after = state()
    statuses = dict(warehouse_for(load_settings()).query("SELECT run_id, status FROM scoring_runs").rows)
    failed = [run_id for run_id, status in statuses.items() if status == "failed"]
    assert len(failed) == 1 and failed[0] not in after["rows"] and failed[0] not in after["candidates"]
    assert after == before, f"{point} / {setup}: {after} != {before}"
    latest, (current, previous, versions) = after["latest"], after["pointers"]
    assert current == latest and failed[0] not in versions
    if setup == "previous":
        assert (current, previous) == (earlier[1].run_id, earlier[0].run_id) and previous in versions
    if setup == "same-date":  # the run it replaced is the date's published run again, rows, cache and partition
        assert latest == earlier[2].run_id and after["partitions"][DAYS[1]] == earlier[2].run_id


def test_publishing_an_older_run_date_never_moves_latest_or_the_cache_back(tiny: Path, tmp_path: Path) -> None:
    folder = demo_inputs(tmp_path / "in", items=120, users=30, seed=6)
    newer = run(folder, "2026-12-01")
    older = run(folder, "2026-11-30")  # a backfill of the day before

    cfg = load_settings()
    warehouse = warehouse_for(cfg)
    assert older.record.status == "published"
    assert warehouse.query("SELECT run_id FROM latest_run").rows == [(newer.run_id,)]
    assert warehouse.query("SELECT DISTINCT run_id FROM latest_item_scores").rows == [(newer.run_id,)]
    assert warehouse.query("SELECT count(*) FROM item_scores WHERE run_date = DATE '2026-11-30'").rows == [(120,)]
    with cache_for(cfg) as cache:
        assert cache.current() == newer.run_id and cache.previous() is None
        assert cache.versions() == [newer.run_id]  # the older date's version is not kept for serving
    assert state()["partitions"] == {"2026-11-30": older.run_id, "2026-12-01": newer.run_id}

    again = run(folder, "2026-12-01")  # re-running the newest date makes it latest again, as before
    assert warehouse.query("SELECT run_id FROM latest_run").rows == [(again.run_id,)]
    with cache_for(cfg) as cache:
        assert (cache.current(), cache.previous()) == (again.run_id, newer.run_id)
