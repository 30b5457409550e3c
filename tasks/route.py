"""The `route-topics` node: the cascade. The items whose small-model topic is uncertain get a large model's topic.

Reads the shards' vectors (the small model's) and the plan, ranks the items by how unsure their topic is
(models/cascade.py), re-encodes as many of the most uncertain as the budget pays for with the large model
(``NIGHTSCORE_LARGE_MODEL``, run by the same engine) and writes their topics to ``routed.parquet``; score-items
takes them from there (``item_scores.scored_by``). A seeded sample of the run's items, encoded by both models,
draws the run's curve (``cascade_curve.parquet``) and times the large model for a budget in seconds.

Vectors never mix: item_scores keeps the small model's embedding of every item; only topic decisions move.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np
import polars as pl
from prefect import task
from prefect.cache_policies import NO_CACHE

from core.records import Plan, Routed, RunRef, ShardResult
from core.settings import Settings
from models.cascade import (
    Budget,
    CurvePoint,
    Routing,
    Sample,
    cascade_curve,
    items_within,
    measure,
    route,
    route_order,
)
from models.encoder.engine import encode_texts
from models.encoder.files import model_info
from models.encoder.loader import choose_mode, get_encoder
from models.encoder.spec import EncoderSpec
from models.encoder.text_encoder import TextEncoder
from models.topics import topic_decisions
from storage.lake import Lake
from storage.resources import lake_for
from tasks.encode import planned_spec

log = logging.getLogger(__name__)

READ_BLOCK = 16_384  # rows per read of vectors and texts (one block of texts in memory at a time)
PROBE_ITEMS = 32  # items timed on the large model when a budget in seconds has no sample to time it on


def large_spec(settings: Settings) -> EncoderSpec | None:
    """Return the large model's spec (the encoder's settings with its folder and length cap), or None without one."""
    if settings.topics.large_model is None:
        return None
    spec = EncoderSpec.from_settings(settings)
    return replace(spec, model_path=settings.topics.large_model, max_seq_length=settings.topics.large_max_seq_length)


def check_large_model(settings: Settings) -> str | None:
    """Return the large model's version read from its folder (ModelLoadError when missing or incomplete), or None."""
    spec = large_spec(settings)
    return None if spec is None else model_info(spec).version


def budget_of(settings: Settings) -> Budget:
    """Return the cascade's budget; none (nothing routed) without a large model."""
    topics = settings.topics
    if topics.large_model is None:
        return Budget()
    return Budget(topics.cascade_budget_share, topics.cascade_budget_s)


@dataclass(frozen=True)
class Decided:
    """One model's topic decisions on some items, and what encoding them cost."""

    frame: pl.DataFrame  # item_id, topic (label index), topic_score, margin
    seconds: float


@dataclass(frozen=True)
class Drawn:
    """The sample both models encoded: its ids (sorted), the large model's decisions on it, and the measured sample."""

    ids: pl.Series
    large: pl.DataFrame
    sample: Sample


DECIDED_SCHEMA = pl.Schema({"item_id": pl.String, "topic": pl.Int32, "topic_score": pl.Float64, "margin": pl.Float64})


@task(name="route-topics", cache_policy=NO_CACHE)
def route_topics(run: RunRef, plan: Plan, shards: Sequence[ShardResult]) -> Routed:
    """Produce routed.parquet (the large model's topics of the routed items) and the run's cascade_curve.parquet."""
    started, cfg = time.perf_counter(), run.settings
    spec, budget, version = large_spec(cfg), budget_of(cfg), check_large_model(cfg)
    if spec is None or not (budget.routes or cfg.topics.cascade_sample):
        return Routed.nothing(plan.items, version, budget.label(), time.perf_counter() - started)
    lake, small_encoder = lake_for(cfg), get_encoder(planned_spec(cfg, plan.engine))
    small = small_decisions(lake, plan, shards, label_vectors(small_encoder, cfg), cfg)
    large = large_encoder(spec, expected_tokens(small.get_column("token_count"), budget, cfg.topics.cascade_sample))
    drawn = draw_sample(lake, run, plan, small, (small_encoder, large), sample_size(cfg, small.height, budget))
    routing = route_all(small, drawn.sample, budget, cfg)
    routed_ids = small.get_column("item_id").filter(pl.Series(routing.routed))
    fresh = decide(lake, plan.plan_uri, routed_ids.filter(~routed_ids.is_in(drawn.ids.implode())), large, cfg)
    uri = write_routed(lake, run, pl.concat([drawn.large.filter(pl.col("item_id").is_in(routed_ids.implode())), fresh.frame]))
    point = (
        measure(drawn.sample, drawn.ids.is_in(routed_ids.implode()).to_numpy(), routing.threshold) if drawn.ids.len() else None
    )
    curve_uri = write_curve(lake, run, drawn.sample, point, cfg) if cfg.topics.cascade_sample and point else None
    large_s = drawn.sample.large_s + fresh.seconds
    log_routing(routing, small.height, version, large_s, point)
    return Routed(
        uri=uri,
        curve_uri=curve_uri,
        large_version=version,
        budget=budget.label(),
        items=small.height,
        routed=routing.count,
        routed_truncated=routing.by_reason["truncated"],
        routed_margin=routing.by_reason["margin"],
        threshold=routing.threshold,
        sample=drawn.ids.len(),
        agreement=point.agreement if point else None,
        cost_ratio=point.cost_ratio if point else None,
        large_seconds=large_s,
        seconds=time.perf_counter() - started,
    )


def label_vectors(encoder: TextEncoder, settings: Settings) -> np.ndarray:
    """Return the topic labels' vectors by an encoder, in the settings' label order."""
    vectors, _ = encode_texts(encoder, list(settings.topics.labels.values()))
    return vectors


def small_decisions(lake: Lake, plan: Plan, shards: Sequence[ShardResult], labels: np.ndarray, cfg: Settings) -> pl.DataFrame:
    """Return every planned item's small-model decision: item_id, topic, margin, token_count, truncated (sorted by id)."""
    parts = [pl.DataFrame(schema={"item_id": pl.String, "topic": pl.Int32, "margin": pl.Float64})]
    for uri in [*sorted(s.uri for s in shards), plan.reused_uri]:
        for frame in lake.iter_frames(uri, "shard", columns=["item_id", "embedding"], batch_size=READ_BLOCK):
            best, _, margin = topic_decisions(frame.get_column("embedding").to_numpy(), labels, cfg.topics.temperature)
            parts.append(frame.select("item_id").with_columns(pl.Series("topic", best), pl.Series("margin", margin)))
    limit = model_info(EncoderSpec.from_settings(cfg)).max_seq_length
    planned = lake.read_parquet(plan.plan_uri, "plan", columns=["item_id", "token_count"])
    return (
        planned.join(pl.concat(parts), on="item_id", how="inner", validate="1:1")
        .with_columns((pl.col("token_count") >= limit).alias("truncated"))
        .sort("item_id")
    )


def expected_tokens(tokens: pl.Series, budget: Budget, sample: int) -> int:
    """Return about how many tokens the large model will encode: the budget's share of the run's, and the sample's."""
    share = budget.share if budget.share is not None else 1.0
    total, count = float(tokens.sum()), max(tokens.len(), 1)
    return int(share * total + sample * total / count)


def large_encoder(spec: EncoderSpec, tokens: int) -> TextEncoder:
    """Return the large model's encoder in the mode auto chooses for (at most) ``tokens`` tokens, or the pinned one."""
    return get_encoder(spec.pinned(choose_mode(spec, tokens).mode))


def sample_size(settings: Settings, items: int, budget: Budget) -> int:
    """Return how many items both models encode: the curve's sample, or a probe timing a budget in seconds."""
    wanted = settings.topics.cascade_sample or (PROBE_ITEMS if budget.seconds else 0)
    return min(wanted, items)


def draw_sample(
    lake: Lake, run: RunRef, plan: Plan, small: pl.DataFrame, encoders: tuple[TextEncoder, TextEncoder], size: int
) -> Drawn:
    """Return the seeded sample of the run's items, encoded by both models (each timed on all of it)."""
    ids = small.get_column("item_id").sample(size, seed=run.settings.candidates.seed).sort()
    by_small = decide(lake, plan.plan_uri, ids, encoders[0], run.settings)
    by_large = decide(lake, plan.plan_uri, ids, encoders[1], run.settings)
    mine = small.join(by_large.frame.select("item_id", pl.col("topic").alias("large")), on="item_id").sort("item_id")
    sample = Sample(
        small=mine.get_column("topic").to_numpy(),
        large=mine.get_column("large").to_numpy(),
        margin=mine.get_column("margin").to_numpy(),
        truncated=mine.get_column("truncated").to_numpy(),
        tokens=mine.get_column("token_count").to_numpy(),
        small_s=by_small.seconds,
        large_s=by_large.seconds,
    )
    return Drawn(mine.get_column("item_id"), by_large.frame, sample)


def decide(lake: Lake, plan_uri: str, ids: pl.Series, encoder: TextEncoder, settings: Settings) -> Decided:
    """Return an encoder's topic decisions on the items ``ids`` names (their texts streamed from the plan), and its seconds."""
    labels, wanted = label_vectors(encoder, settings), pl.DataFrame({"item_id": ids})
    parts, seconds = [pl.DataFrame(schema=DECIDED_SCHEMA)], 0.0
    for frame in lake.iter_frames(plan_uri, "plan", columns=["item_id", "text"], batch_size=READ_BLOCK):
        chosen = frame.join(wanted, on="item_id", how="semi")
        if chosen.height:
            vectors, stats = encode_texts(encoder, chosen.get_column("text").to_list())
            best, prob, margin = topic_decisions(vectors, labels, settings.topics.temperature)
            columns = (pl.Series("topic", best), pl.Series("topic_score", prob), pl.Series("margin", margin))
            parts.append(chosen.select("item_id").with_columns(*columns))
            seconds += stats.seconds
    return Decided(pl.concat(parts), seconds)


def route_all(small: pl.DataFrame, sample: Sample, budget: Budget, cfg: Settings) -> Routing:
    """Return the run's routing: as many items, most uncertain first, as the budget pays for."""
    margin, tokens = small.get_column("margin").to_numpy(), small.get_column("token_count").to_numpy()
    truncated = small.get_column("truncated").to_numpy() & cfg.topics.cascade_route_truncated
    rate = sample.large_s / max(float(np.sum(sample.tokens)), 1.0)  # the large model's seconds per (small-model) token
    count = items_within(budget, tokens[route_order(margin, truncated)], rate, spent_s=sample.large_s)
    return route(margin, truncated, count)


def write_routed(lake: Lake, run: RunRef, decided: pl.DataFrame) -> str | None:
    """Write the routed items' large-model topics (item_id, topic name, topic_score) to routed.parquet; None if none."""
    if not decided.height:
        return None
    names = pl.Series(list(run.settings.topics.labels), dtype=pl.String)
    frame = decided.sort("item_id").select(
        "item_id", names.gather(decided.sort("item_id").get_column("topic")).alias("topic"), "topic_score"
    )
    return lake.write_parquet(frame, run.path("routed.parquet"))


def write_curve(lake: Lake, run: RunRef, sample: Sample, point: CurvePoint, cfg: Settings) -> str:
    """Write the sample's curve (every share in CURVE_SHARES, and the run's own point) to cascade_curve.parquet."""
    rows = [{"point": "curve", **asdict(p)} for p in cascade_curve(sample, route_truncated=cfg.topics.cascade_route_truncated)]
    rows.append({"point": "run", **asdict(point)})
    return lake.write_parquet(pl.DataFrame(rows, schema=CURVE_SCHEMA), run.path("cascade_curve.parquet"))


CURVE_SCHEMA = pl.Schema(
    {
        "point": pl.String,
        "share_routed": pl.Float64,
        "threshold": pl.Float64,
        "agreement": pl.Float64,
        "accuracy": pl.Float64,
        "cost_ratio": pl.Float64,
    }
)


def log_routing(routing: Routing, items: int, version: str | None, large_s: float, point: CurvePoint | None) -> None:
    """Log how many items the cascade routed and why, and what the sample says that kept."""
    log.info(
        "cascade: %d of %d items routed to %s (%d truncated, %d by margin <= %s) in %.1f s of the large model",
        routing.count,
        items,
        version,
        routing.by_reason["truncated"],
        routing.by_reason["margin"],
        "n/a" if routing.threshold is None else f"{routing.threshold:.4f}",
        large_s,
    )
    if point is not None:
        log.info("cascade sample: %.1f%% agreement with all-large at %.2f of its cost", 100 * point.agreement, point.cost_ratio)
