"""The data behind a run's report: its plots, from the run folder and the previous published run."""

from __future__ import annotations

import logging

import numpy as np

from nightscore import plots as draw
from nightscore.errors import NightscoreError
from nightscore.run_context import RunContext, run_folder
from nightscore.settings import Settings
from storage.lake import Lake
from storage.warehouse import Warehouse

log = logging.getLogger(__name__)

PREVIOUS_RUN = ("SELECT run_id, CAST(run_date AS VARCHAR) FROM scoring_runs WHERE status IN ('published', 'replaced', 'rolled_back') "
                "AND run_id <> ? AND published_at IS NOT NULL ORDER BY published_at DESC LIMIT 1")


def previous_scores(lake: Lake, warehouse: Warehouse, run: RunContext) -> tuple[str, np.ndarray] | None:
    """Return (run_id, topic_scores) of the run published before this one, or None."""
    try:
        rows = warehouse.query(PREVIOUS_RUN, [run.run_id]).rows
    except NightscoreError:
        return None
    if not rows:
        return None
    uri = f"{run_folder(lake.uri, rows[0][1], rows[0][0])}/item_scores.parquet"
    if not lake.exists(uri):
        return None
    return rows[0][0], lake.read_parquet(uri, "item_scores", columns=["topic_score"]).get_column("topic_score").to_numpy()


def plots(lake: Lake, warehouse: Warehouse, run: RunContext, settings: Settings) -> dict[str, bytes]:
    """Return the run's PNG plots by title: topic distribution, token lengths, topic_score vs the previous run."""
    scores = lake.read_parquet(run.path("item_scores.parquet"), "item_scores", columns=["topic", "topic_score"])
    shares = scores.group_by("topic").len().sort("len", descending=True)
    lengths = lake.read_parquet(run.path("plan.parquet"), "plan", columns=["token_count"]).get_column("token_count").to_numpy()
    previous = previous_scores(lake, warehouse, run)
    return {
        "Topic distribution": draw.topic_distribution(shares.get_column("topic").to_list(), shares.get_column("len").to_list()),
        "Token lengths and bucket boundaries": draw.token_lengths(lengths, settings.bucket_boundaries),
        "topic_score vs the previous run": draw.score_distributions(
            scores.get_column("topic_score").to_numpy(), previous[1] if previous else None, previous[0] if previous else None),
    }


def save_plots(lake: Lake, run: RunContext, pngs: dict[str, bytes]) -> dict[str, str]:
    """Write the plots to <run>/report/<name>.png in the lake; return their URIs by title."""
    uris = {}
    for title, png in pngs.items():
        name = "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")
        uris[title] = lake.write_bytes(png, run.path(f"report/{name}.png"))
    return uris
