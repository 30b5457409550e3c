"""Tasks after the model: topic scores, candidates, output contracts."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from nightscore.stages import contracts
from nightscore.stages import publish as publish_stage
from nightscore.stages import scoring as stage
from storage.resources import lake_for, warehouse_for
from tasks.common import context, settings


@task(name="score-items", cache_policy=NO_CACHE)
def score_items(run: dict[str, str], encoded: dict[str, object], shards: list[dict[str, object]]) -> dict[str, object]:
    """Produce item_scores.parquet: embeddings with zero-shot topic and topic_score."""
    cfg = settings()
    return stage.score_items(lake_for(cfg), context(run), cfg, [str(s["uri"]) for s in shards])


@task(name="build-candidates", cache_policy=NO_CACHE)
def build_candidates(run: dict[str, str], scored: dict[str, object]) -> dict[str, object]:
    """Produce user_candidates.parquet: exact top-K unseen items per user."""
    cfg = settings()
    return stage.build_candidates(lake_for(cfg), context(run), cfg)


@task(name="validate-outputs", cache_policy=NO_CACHE)
def validate_outputs(run: dict[str, str], planned: dict[str, object], candidates: dict[str, object],
                     validated: dict[str, object]) -> dict[str, object]:
    """Check item_scores and user_candidates: row contracts, then dataset suites (fails the run if not)."""
    cfg, ctx = settings(), context(run)
    lake = lake_for(cfg)
    checked = publish_stage.validate_outputs(lake, ctx, cfg, int(planned["items"]))
    suites = contracts.gate(lake, warehouse_for(cfg), ctx, cfg, ["item_scores", "user_candidates"], int(validated["users"]))
    return {**checked, "suites": suites, "seconds": checked["seconds"] + suites["seconds"]}
