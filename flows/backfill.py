"""The backfill flow: one nightly child run per run_date of a range, oldest first."""

from __future__ import annotations

from prefect import flow

from core.records import Published
from flows.nightly import nightly
from flows.params import BackfillParams, NightlyParams
from tasks.backfill import backfill_dates


@flow(name="backfill")
def backfill(params: BackfillParams) -> list[Published]:
    """Run the nightly flow as a child run for each date from start_date to end_date; return their summaries."""
    return [
        nightly(NightlyParams(run_date=day, items_uri=params.items_uri, interactions_uri=params.interactions_uri))
        for day in backfill_dates(params.start_date, params.end_date)
    ]
