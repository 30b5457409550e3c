"""The dataset statistics of the latest published run: what a run's dataset suites compare against.

A run writes each dataset's statistics to ``<run folder>/contracts/<dataset>.stats.json`` (tasks/suites.py); the
next run's suites, and ``nightscore contracts check``, read those of the latest published run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from core.run_context import run_folder
from storage.lake import Lake
from storage.warehouse.base import Warehouse
from storage.warehouse.runs import PublishedRun


@dataclass(frozen=True)
class PublishedStats:
    """The run compared against (None before the first publication) and each dataset's statistics from it."""

    run: PublishedRun | None
    stats: dict[str, dict[str, float] | None]


def published_stats(lake: Lake, warehouse: Warehouse, datasets: Iterable[str]) -> PublishedStats:
    """Return each dataset's stats from the latest published run (None for each before the first publication).

    One warehouse lookup for all of them: every dataset is compared with the same run, even when another run
    publishes meanwhile.
    """
    latest = warehouse.latest_published()
    if latest is None:
        return PublishedStats(None, dict.fromkeys(datasets))
    folder = run_folder(lake.uri, latest.run_date, latest.run_id)
    return PublishedStats(latest, {dataset: lake.read_json(f"{folder}/contracts/{dataset}.stats.json") for dataset in datasets})
