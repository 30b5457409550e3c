"""The `report-run` node: the run's page in the Prefect UI (markdown summary with plots, stage timings) and its plots in the lake.

Also the encode progress artifact, created at planning and moved by each shard.
"""

from __future__ import annotations

import base64
import functools
from typing import Any

import numpy as np
import polars as pl
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import deployment, flow_run

from core.logs import IN_SUMMARY
from core.records import Published, RunRef, Stages
from core.run_context import run_folder
from storage.lake import Lake
from storage.resources import lake_for, warehouse_for
from storage.warehouse.base import Warehouse
from tasks import report_plots as draw
from tasks.report_page import QuarantineRule, contracts_line, contracts_markdown, served_docs, summary_markdown, timing_rows


def artifact_key(kind: str) -> str:
    """Return the artifact key of this deployment (or flow) and kind, e.g. nightly-summary: versions group by it."""
    name = _artifact_owner(flow_run.id)
    return "".join(c if c.isalnum() else "-" for c in f"{name}-{kind}".lower())


@functools.lru_cache(maxsize=64)
def _artifact_owner(flow_run_id: str | None) -> str:
    """Return the deployment (or flow) name of a flow run, looked up once per run: outside the flow's own thread each
    lookup reads the flow run from the API, and a run keys five artifacts."""
    return deployment.name or flow_run.flow_name or "nightscore"


def start_progress(shards: int) -> str:
    """Return the id of this run's encode progress artifact, created at 0% (100% when nothing is left to encode)."""
    return str(
        create_progress_artifact(
            0.0 if shards else 100.0, key=artifact_key("encode-progress"), description=f"Encode: {shards} shard(s) to do"
        )
    )


@task(name="report-run", cache_policy=NO_CACHE)
def report_run(run: RunRef, stages: Stages, published: Published) -> dict[str, str]:
    """Produce the run's plots (report/*.png in the run folder) and its summary and timing artifacts; return the PNG URIs."""
    lake = lake_for(run.settings)
    pngs = plots(lake, warehouse_for(run.settings), run, stages)
    uris = save_plots(lake, run, pngs)
    rules = quarantine_by_rule(lake, run)
    warn_about(published, rules, run.settings.encoder.max_seq_length)
    docs = served_docs(published.data_docs, lake.root, run.settings.contracts.data_docs_base_url)
    contracts = create_markdown_artifact(
        contracts_markdown(run.run_id, contract_results(lake, run, docs), docs),
        key=artifact_key("contracts"),
        description=f"Run {run.run_id}: data contracts",
    )
    markdown = summary_markdown(
        published,
        {"items_uri": run.items_uri, "interactions_uri": run.interactions_uri},
        run.settings,
        {title: _data_uri(png) for title, png in pngs.items()},
        rules,
        contracts_line(str(contracts), docs),
    )
    create_markdown_artifact(markdown, key=artifact_key("summary"), description=f"Run {run.run_id}: summary and plots")
    create_table_artifact(
        timing_rows(published.stage_seconds),
        key=artifact_key("stage-timings"),
        description=f"Run {run.run_id}: seconds per stage",
    )
    create_table_artifact(
        quality_rows(lake, stages),
        key=artifact_key("retrieval-metrics"),
        description=f"Run {run.run_id}: candidates on held-out interactions, per method (retrieval_metrics)",
    )
    return uris


def contract_results(lake: Lake, run: RunRef, datasets: dict[str, str]) -> dict[str, dict[str, Any] | None]:
    """Return each dataset's expectation outcomes as the suites wrote them (contracts/<dataset>.results.json)."""
    return {dataset: lake.read_json(run.path(f"contracts/{dataset}.results.json")) for dataset in datasets}


def quarantine_by_rule(lake: Lake, run: RunRef) -> list[QuarantineRule]:
    """Return (dataset, rule, rows, example row key) of the run's quarantine, most rows first."""
    uri = run.path("quarantine.parquet")
    if not lake.exists(uri):
        return []
    frame = lake.read_parquet(uri, "quarantine", columns=["dataset", "rule", "row_key"])
    counts = frame.group_by("dataset", "rule").agg(pl.len().alias("rows"), pl.col("row_key").min().alias("example"))
    return [tuple(row) for row in counts.sort(["rows", "dataset", "rule"], descending=[True, False, False]).iter_rows()]


def warn_about(published: Published, rules: list[QuarantineRule], max_tokens: int) -> None:
    """Log the run's quarantine per rule and its truncated texts as warnings (the run's log in the UI; a CLI run's
    summary says them on the terminal instead)."""
    record, logger = published.record, get_run_logger()
    for dataset, rule, rows, example in rules:
        logger.warning("quarantined %d %s row(s) by %s (e.g. %s)", rows, dataset, rule, example, extra=IN_SUMMARY)
    if record.truncated_texts and record.rows_scored:
        logger.warning(
            "%d of the run's %d texts (%.1f%%) are truncated at %d tokens",
            record.truncated_texts,
            record.rows_scored,
            100 * record.truncated_texts / record.rows_scored,
            max_tokens,
            extra=IN_SUMMARY,
        )


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def previous_scores(lake: Lake, warehouse: Warehouse, run: RunRef) -> tuple[str, np.ndarray] | None:
    """Return (run_id, topic_scores) of the latest publication before this run, or None."""
    previous = warehouse.latest_published(excluding=run.run_id)
    if previous is None:
        return None
    uri = f"{run_folder(lake.uri, previous.run_date, previous.run_id)}/item_scores.parquet"
    if not lake.exists(uri):
        return None
    return previous.run_id, lake.read_parquet(uri, "item_scores", columns=["topic_score"]).get_column("topic_score").to_numpy()


def plots(lake: Lake, warehouse: Warehouse, run: RunRef, stages: Stages) -> dict[str, bytes]:
    """Return the run's PNG plots by title: the cascade, topics, token lengths, topic_score vs the previous run, candidates."""
    scores = lake.read_parquet(stages.scored.uri, "item_scores", columns=["topic", "topic_score"])
    shares = scores.group_by("topic").len().sort("len", descending=True)
    lengths = lake.read_parquet(stages.plan.plan_uri, "plan", columns=["token_count"]).get_column("token_count").to_numpy()
    previous = previous_scores(lake, warehouse, run)
    return cascade_plot(lake, stages) | {
        "Topic distribution": draw.topic_distribution(shares.get_column("topic").to_list(), shares.get_column("len").to_list()),
        "Token lengths and bucket boundaries": draw.token_lengths(lengths, run.settings.encoder.bucket_boundaries),
        "topic_score vs the previous run": draw.score_distributions(
            scores.get_column("topic_score").to_numpy(), previous[1] if previous else None, previous[0] if previous else None
        ),
        "Candidates on held-out interactions": _quality_plot(quality_rows(lake, stages), run.settings.candidates.top_k),
    }


CASCADE_TITLE = "Cascade: agreement with the all-large topics and encode cost vs share routed"


def cascade_plot(lake: Lake, stages: Stages) -> dict[str, bytes]:
    """Return the cascade's curve on the run's sample by title (nothing when the run drew none)."""
    if stages.routed is None or stages.routed.curve_uri is None:
        return {}
    frame = lake.read_parquet(stages.routed.curve_uri, "cascade_curve")
    curve, mine = frame.filter(pl.col("point") == "curve"), frame.filter(pl.col("point") == "run").row(0, named=True)
    share, agreement, cost = (curve.get_column(c).to_list() for c in ("share_routed", "agreement", "cost_ratio"))
    return {CASCADE_TITLE: draw.cascade_curve(share, agreement, cost, (mine["share_routed"], mine["agreement"]))}


QUALITY_ORDER = (
    "popularity",
    "trending",
    "topic_trending",
    "cooccurrence",
    "als",
    "content",
    "content_new",
    "fused_rrf",
    "fused",
    "ranked_lightgbm",
    "ranked_mlp",
    "ranked",
)


def quality_rows(lake: Lake, stages: Stages) -> list[dict[str, Any]]:
    """Return the run's retrieval_metrics as one row per method (recall@K, NDCG@10, cold recall, coverage), in QUALITY_ORDER."""
    metrics = lake.read_parquet(stages.candidates.metrics_uri, "retrieval_metrics").filter(pl.col("method") != "split")
    wide = metrics.pivot(on="metric", index="method", values="value")
    order = {m: i for i, m in enumerate(QUALITY_ORDER)}
    rows = sorted(wide.iter_rows(named=True), key=lambda r: order.get(r["method"], len(order)))
    return [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()} for row in rows]


def _quality_plot(rows: list[dict[str, Any]], k: int) -> bytes:
    methods = [r["method"] for r in rows]
    return draw.retrieval_quality(
        methods, [r.get("recall_at_k") or 0.0 for r in rows], [r.get("ndcg_at_10") or 0.0 for r in rows], k
    )


def save_plots(lake: Lake, run: RunRef, pngs: dict[str, bytes]) -> dict[str, str]:
    """Write the plots to <run>/report/<name>.png in the lake; return their URIs by title."""
    uris = {}
    for title, png in pngs.items():
        name = "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")
        uris[title] = lake.write_bytes(png, run.path(f"report/{name}.png"))
    return uris
