"""Flow tier: the backfill flow runs one nightly child run per date, oldest first, each published."""

from __future__ import annotations

from pathlib import Path

from core.settings import load_settings
from flows.backfill import backfill
from flows.params import BackfillParams
from storage.resources import warehouse_for
from tests.helpers import demo_inputs


def test_backfill_publishes_one_child_run_per_date(tiny: Path, tmp_path: Path) -> None:
    folder = demo_inputs(tmp_path / "in", items=150, users=30, seed=6)
    summaries = backfill(
        BackfillParams(
            start_date="2026-11-27",
            end_date="2026-11-28",
            items_uri=str(folder / "items.parquet"),
            interactions_uri=str(folder / "interactions.parquet"),
        )
    )

    assert [str(s.record.run_date) for s in summaries] == ["2026-11-27", "2026-11-28"]
    assert summaries[1].record.rows_reused == 150 and summaries[1].record.rows_computed == 0  # same texts: vectors reused
    rows = (
        warehouse_for(load_settings())
        .query(
            "select run_date::varchar, flow_name, status, count(distinct s.item_id) from scoring_runs r "
            "join item_scores s using (run_id, run_date) group by all order by 1"
        )
        .rows
    )
    assert rows == [("2026-11-27", "nightly", "published", 150), ("2026-11-28", "nightly", "published", 150)]
