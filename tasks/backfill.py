"""The `plan-backfill` node: the run dates of a backfill, oldest first."""

from __future__ import annotations

from datetime import date, timedelta

from prefect import task
from prefect.cache_policies import NO_CACHE


@task(name="plan-backfill", cache_policy=NO_CACHE)
def backfill_dates(start: date, end: date) -> list[str]:
    """Return every YYYY-MM-DD from start to end, inclusive, oldest first."""
    return [(start + timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]
