"""The `build-candidates` node: several retrieval sources fused, a stage-two ranker trained on them, measured and gated.

In order (models/recommender/candidate_stage.py holds the pure functions):
1. the run's interactions are split in time: the latest ``candidate_holdout_share`` held out for evaluation, and the
   same cut inside the rest gives the validation split;
2. tune: sources fitted on the validation training part, the fusion (per-source weights, RRF constant, new-item
   quota) tuned on its held-out part, the first stage and both stage-two rankers trained on its users' candidates;
   a source whose list beats the fused one there with confidence is published instead (the fallback, recorded);
3. evaluate: sources fitted on the evaluation training part; every source, popularity, the fused and the ranked lists
   measured on the held-out interactions (never tuned on) -> ``retrieval_metrics``; the better ranker kind is kept;
4. gate: fused recall@K below popularity's (+ a margin) with confidence (a paired bootstrap over held-out users)
   or cold-item recall under its floor fails the run (exit 3); too few held-out users: "not enough data to gate";
5. publish what serving will read: sources fitted on all the run's interactions, the tuned fusion, each user's K
   candidates with their feature rows (``candidate_entries.parquet``: one cache entry per user) and the ranker.
   Every user gets min(K, catalogue items it has not seen) candidates: short lists are topped up (source ``fill``).

Produces ``user_candidates.parquet``, ``candidate_entries.parquet``, ``retrieval_metrics.parquet``, ``serving.json``
(the ranker version, its feature set, the trending list for users nobody has seen and the neighbours' path), the
ranker's files in ``<lake>/models/ranker/<version>/`` and the co-visitation neighbours the service boosts with
(``<lake>/serving/<run_id>/neighbours.parquet``, top ``cooc_serving_neighbours`` per item).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import numpy as np
import polars as pl
from prefect import task
from prefect.cache_policies import NO_CACHE

from core.errors import ContractViolation
from core.records import Candidates, MethodQuality, RunRef, Scored, Validated
from core.settings import Settings
from models.recommender.candidate_stage import (
    CandidateChunk,
    CandidateConfig,
    Final,
    Timings,
    candidate_chunks,
    evaluate,
    fit_final,
    tune,
)
from models.recommender.evaluation import check_gate, metric_value, time_split
from models.recommender.ranker_models import Scorer, scorer_to_bytes
from models.recommender.retrieval import ITEM_BLOCK, ItemChunks
from models.recommender.sources.base import encode_run
from models.recommender.sources.cooccurrence import CooccurrenceSource, neighbour_frame
from models.recommender.sources.popularity import robust_trending
from storage.artifacts import publish_neighbours, publish_scorer
from storage.candidate_payload import CandidateEntry, encode_entry, feature_set_id
from storage.lake import Lake
from storage.resources import lake_for, warehouse_for
from storage.warehouse.schema import CANDIDATE_COLUMNS, CANDIDATE_LISTS

log = logging.getLogger(__name__)

FALLBACK_ITEMS = 100  # trending items served to users nobody has seen
ENTRY_SCHEMA = pl.Schema({"user_id": pl.String(), "entry": pl.Binary()})
CANDIDATES_SCHEMA = pl.Schema(
    {
        "run_id": pl.String(),
        "run_date": pl.Date(),
        "user_id": pl.String(),
        "rank": pl.Int32(),
        "item_id": pl.String(),
        "score": pl.Float64(),
        "rrf_score": pl.Float64(),
        "sources": pl.String(),
        **{f"rank_{name}": pl.Int32() for name in CANDIDATE_LISTS},
        **{f"score_{name}": pl.Float64() for name in CANDIDATE_LISTS},
    }
)


def candidate_config(settings: Settings) -> CandidateConfig:
    """Return the candidate stage's parameters: the candidate settings, on a GPU where the encoder may use one."""
    return CandidateConfig.from_settings(settings.candidates, "cpu" if settings.encoder.device == "cpu" else "auto")


@task(name="build-candidates", cache_policy=NO_CACHE)
def build_candidates(run: RunRef, validated: Validated, scored: Scored) -> Candidates:
    """Produce the run's candidates, their held-out evaluation (retrieval_metrics) and its ranker; gate their quality."""
    started, lake, config, timings = time.perf_counter(), lake_for(run.settings), candidate_config(run.settings), Timings()
    items = catalogue_items(lake, validated.items_uri, scored.uri)
    interactions = lake.read_parquet(validated.interactions_uri, "interactions", columns=["user_id", "item_id", "event", "ts"])
    catalogue, encoded = encode_run(items, interactions)
    chunks = item_chunks(lake, scored.uri, items.height)
    evaluation = time_split(encoded, config.holdout_share)
    tuned = tune(catalogue, encoded, chunks, config, evaluation, timings)
    report = evaluate(catalogue, encoded, chunks, config, evaluation, tuned, timings)
    metrics = record_metrics(lake, run, report.metrics)
    gated = gate(metrics, report.recall, config)
    final = fit_final(catalogue, encoded, chunks, config, run.reference_time, tuned, report.scorer, timings)
    users, rows = write_candidates(lake, run, final)
    version = publish_ranker(lake, run, final, report.scorer, report.chosen)
    log.info(
        "candidates of %d users (%d rows); ranker %s (%s); seconds per step %s",
        users,
        rows,
        version,
        report.chosen,
        {k: round(v, 1) for k, v in timings.seconds.items()},
    )
    return Candidates(
        run.path("user_candidates.parquet"),
        users,
        rows,
        _finite(metric_value(metrics, "fused", "recall_at_k")),
        _finite(metric_value(metrics, "ranked" if report.scorer else "fused", "ndcg_at_10")),
        _finite(metric_value(metrics, "popularity", "recall_at_k")),
        _finite(metric_value(metrics, "popularity", "ndcg_at_10")),
        int(metric_value(metrics, "split", "users_evaluated")),
        time.perf_counter() - started,
        entries_uri=run.path("candidate_entries.parquet"),
        metrics_uri=run.path("retrieval_metrics.parquet"),
        cold_recall_at_k=_finite(metric_value(metrics, "fused", "cold_recall_at_k")),
        ranker_kind=report.chosen,
        ranker_version=version,
        quality=method_quality(metrics),
        gate=gated,
        fallback=tuned.fallback,
    )


def method_quality(metrics: pl.DataFrame) -> tuple[MethodQuality, ...]:
    """Return each method's held-out figures (retrieval_metrics without the split's own counts), in table order."""
    methods = metrics.filter(pl.col("method") != "split").get_column("method").unique(maintain_order=True).to_list()
    return tuple(
        MethodQuality(
            m,
            *(
                _finite(metric_value(metrics, m, name))
                for name in ("recall_at_k", "ndcg_at_10", "cold_recall_at_k", "coverage_at_k")
            ),
        )
        for m in methods
    )


def catalogue_items(lake: Lake, items_uri: str, scores_uri: str) -> pl.DataFrame:
    """Return the items in item_scores order (the embeddings' row order): item_id, created_at, topic, topic_score."""
    scores = lake.read_parquet(scores_uri, "item_scores", columns=["item_id", "topic", "topic_score"])
    created = lake.read_parquet(items_uri, "items", columns=["item_id", "created_at"])
    return scores.join(created, on="item_id", how="left", maintain_order="left").select(
        "item_id", "created_at", "topic", "topic_score"
    )


def item_chunks(lake: Lake, uri: str, n_items: int) -> ItemChunks:
    """Return item_scores' embeddings as blocks of ITEM_BLOCK rows, read from the lake on each pass (never all at once)."""

    def read() -> Iterator[np.ndarray]:
        for frame in lake.iter_frames(uri, "item_scores", columns=["embedding"], batch_size=ITEM_BLOCK):
            yield frame.get_column("embedding").to_numpy()

    return ItemChunks(n_items, read)


def record_metrics(lake: Lake, run: RunRef, metrics: pl.DataFrame) -> pl.DataFrame:
    """Write the run's retrieval_metrics to its folder and the warehouse (kept when the gate then fails); return them."""
    table = metrics.select(pl.lit(run.run_id).alias("run_id"), "method", "metric", pl.col("value").cast(pl.Float64))
    lake.write_parquet(table, run.path("retrieval_metrics.parquet"))
    warehouse_for(run.settings, run.embedding_dim).record_metrics(run.run_id, table.to_arrow())
    for method in ("popularity", "fused", "ranked"):
        log.info(
            "held-out %s: recall@K %.4f, NDCG@10 %.4f, cold recall@K %.4f",
            method,
            metric_value(table, method, "recall_at_k"),
            metric_value(table, method, "ndcg_at_10"),
            metric_value(table, method, "cold_recall_at_k"),
        )
    return table


def gate(metrics: pl.DataFrame, recall: dict[str, np.ndarray], config: CandidateConfig) -> str:
    """Return the gate's outcome; fail the run (ContractViolation, exit 3, nothing published) on worse-with-confidence."""
    try:
        outcome = check_gate(metrics, recall, config.gate)
    except ContractViolation as exc:
        raise ContractViolation(f"{exc} (retrieval_metrics of the run hold every method's figures)") from exc
    log.info("candidate gate %s", outcome)
    return outcome


def write_candidates(lake: Lake, run: RunRef, final: Final) -> tuple[int, int]:
    """Write user_candidates.parquet and candidate_entries.parquet in one pass, user chunk by chunk; return (users, rows)."""
    counts = {"users": 0, "rows": 0}

    def rows() -> Iterator[tuple[pl.DataFrame, pl.DataFrame]]:
        for chunk in candidate_chunks(final):
            counts["users"] += chunk.frame.get_column("user_id").n_unique()
            counts["rows"] += chunk.frame.height
            yield candidate_rows(run, chunk.frame), entry_frame(chunk, final)

    lake.write_parquet_streams(
        rows(), [run.path("user_candidates.parquet"), run.path("candidate_entries.parquet")], [CANDIDATES_SCHEMA, ENTRY_SCHEMA]
    )
    return counts["users"], counts["rows"]


def entry_frame(chunk: CandidateChunk, final: Final) -> pl.DataFrame:
    """Return one chunk's cache entries (user_id, encoded payload: candidate ids in order and their feature rows)."""
    feature_set = feature_set_id(chunk.feature_names)
    users, blobs = [], []
    for user_id, item_ids, features in chunk.payloads(final.catalogue.item_ids, final.catalogue.user_ids):
        if item_ids:
            users.append(user_id)
            blobs.append(encode_entry(CandidateEntry(item_ids, features, feature_set)))
    return pl.DataFrame({"user_id": users, "entry": blobs}, schema=ENTRY_SCHEMA)


def candidate_rows(run: RunRef, frame: pl.DataFrame) -> pl.DataFrame:
    """Return a chunk's long candidates in the user_candidates table's columns (a source not run: nulls)."""
    out = frame.with_columns(pl.col("sources").list.join(",").alias("sources"))
    for name in CANDIDATE_LISTS:
        for column, dtype in ((f"rank_{name}", pl.Int32), (f"score_{name}", pl.Float64)):
            out = out.with_columns(
                pl.col(column).cast(dtype) if column in out.columns else pl.lit(None, dtype=dtype).alias(column)
            )
    out = out.with_columns(pl.lit(run.run_id).alias("run_id"), pl.lit(run.date).alias("run_date"))
    return out.select(CANDIDATE_COLUMNS).cast(CANDIDATES_SCHEMA)


def publish_ranker(lake: Lake, run: RunRef, final: Final, scorer: Scorer | None, kind: str) -> str | None:
    """Write the ranker to the lake (content-addressed) and the run's serving.json; return the ranker version."""
    version = publish_scorer(lake, *scorer_to_bytes(scorer, {"trained_on": run.run_id})) if scorer is not None else None
    names = tuple(scorer.feature_names) if scorer is not None else ()
    trending = robust_trending(final.history, final.config.popularity)  # served to users the run has not seen
    top = np.argsort(-trending, kind="stable")[:FALLBACK_ITEMS]
    lake.write_json(
        {
            "run_id": run.run_id,
            "ranker_version": version,
            "ranker_kind": kind,
            "feature_names": list(names),
            "feature_set": feature_set_id(names) if names else None,
            "fallback_items": final.catalogue.item_ids.gather(top).to_list(),
            "fallback_scores": [float(v) for v in trending[top]],
            "computed_at": interactions_cutoff(final),
            "neighbours": publish_run_neighbours(lake, run, final),
        },
        run.path("serving.json"),
    )  # events after it are new
    return version


def interactions_cutoff(final: Final) -> str | None:
    """Return the time of the latest interaction the run read (ISO 8601 UTC; None: it read none): events after it are new."""
    if len(final.history.ts_us) == 0:
        return None
    return datetime.fromtimestamp(int(final.history.ts_us.max()) / 1_000_000, UTC).isoformat()


def publish_run_neighbours(lake: Lake, run: RunRef, final: Final) -> str | None:
    """Write the co-visitation neighbours the service boosts with; return their lake path (None: no such source, or 0 kept)."""
    top = run.settings.candidates.cooc_serving_neighbours
    fitted = next((s for s in final.sources if isinstance(s, CooccurrenceSource)), None)
    if fitted is None or top == 0:
        return None
    frame = neighbour_frame(fitted, final.catalogue.item_ids, top)
    log.info("serving neighbours: %d rows (%d per item at most)", frame.height, top)
    return publish_neighbours(lake, run.run_id, frame)


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else float(value)  # NaN (no user to evaluate) is stored as NULL
