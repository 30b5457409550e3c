"""Output contracts checked before publish: item_scores and user_candidates (first version)."""

from __future__ import annotations

import numpy as np
import pandera.polars as pa
import polars as pl
from pandera.errors import SchemaError, SchemaErrors

from nightscore.errors import ContractViolation

ITEM_SCORES_CONTRACT = "item_scores/1"
USER_CANDIDATES_CONTRACT = "user_candidates/1"
NORM_TOLERANCE = 1e-3


def item_scores_schema(labels: list[str]) -> pa.DataFrameSchema:
    """Return the pandera row contract of item_scores (embedding checks are numeric, below)."""
    return pa.DataFrameSchema({
        "item_id": pa.Column(str, nullable=False, unique=True),
        "topic": pa.Column(str, nullable=False, checks=pa.Check.isin(labels)),
        "topic_score": pa.Column(float, nullable=False, checks=pa.Check.in_range(0.0, 1.0)),
        "token_count": pa.Column(pl.Int32, nullable=False, coerce=True, checks=pa.Check.ge(1), required=False),
        "content_hash": pa.Column(str, nullable=False, checks=pa.Check.str_length(64, 64), required=False),
        "model_version": pa.Column(str, nullable=False, required=False),
    }, name="item_scores")


def user_candidates_schema(k: int) -> pa.DataFrameSchema:
    """Return the pandera row contract of user_candidates: keys present, rank in 1..K, (user, item) unique."""
    return pa.DataFrameSchema({
        "user_id": pa.Column(str, nullable=False),
        "item_id": pa.Column(str, nullable=False),
        "rank": pa.Column(pl.Int32, nullable=False, coerce=True, checks=pa.Check.in_range(1, k)),
        "score": pa.Column(float, nullable=False),
    }, unique=["user_id", "item_id"], name="user_candidates")


def pandera_failures(frame: pl.DataFrame, schema: pa.DataFrameSchema) -> list[str]:
    """Return one line per failing pandera check: column, check, failing rows and an example value."""
    try:
        schema.validate(frame, lazy=True)
    except SchemaErrors as exc:
        cases = exc.failure_cases.group_by("column", "check", maintain_order=True).agg(
            pl.len().alias("n"), pl.col("failure_case").first().alias("example"))
        return [f"{schema.name}.{c}: {check} failed for {n} row(s), e.g. {ex}" for c, check, n, ex in cases.iter_rows()]
    except SchemaError as exc:
        return [f"{schema.name}: {' '.join(str(exc).split())[:200]}"]
    return []


def item_score_failures(scores: pl.DataFrame, labels: list[str], expected_rows: int) -> list[str]:
    """Return the item_scores rules that fail: pandera row contract, row count, finite unit-norm embeddings."""
    failures = pandera_failures(scores, item_scores_schema(labels))
    if scores.height != expected_rows:
        failures.append(f"item_scores has {scores.height} rows, expected {expected_rows}")
    if scores.get_column("item_id").n_unique() != scores.height:
        failures.append("item_scores.item_id is not unique")
    vectors = scores.get_column("embedding").to_numpy() if scores.height else np.zeros((0, 1), np.float32)
    if not np.isfinite(vectors).all():
        failures.append("item_scores.embedding has NaN or infinite values")
    norms = np.linalg.norm(vectors, axis=1)
    if norms.size and float(np.abs(norms - 1).max()) > NORM_TOLERANCE:
        failures.append(f"item_scores.embedding norm off 1 by {float(np.abs(norms - 1).max()):.2e}")
    topic_score = scores.get_column("topic_score")
    if topic_score.is_nan().any() or not topic_score.is_between(0.0, 1.0).all():
        failures.append("item_scores.topic_score outside [0, 1]")
    if not scores.get_column("topic").is_in(pl.Series(labels).implode()).all():
        failures.append("item_scores.topic has a value outside the label set")
    return failures


def candidate_failures(candidates: pl.DataFrame, interactions: pl.DataFrame, n_items: int, k: int) -> list[str]:
    """Return the user_candidates rules that fail: pandera row contract, min(K, unseen) unseen items per user, ranks 1..n."""
    failures = pandera_failures(candidates, user_candidates_schema(k))
    seen = interactions.group_by("user_id").agg(pl.col("item_id").n_unique().alias("seen"))
    per_user = candidates.group_by("user_id").agg(
        pl.len().alias("n"), pl.col("item_id").n_unique().alias("distinct"),
        pl.col("rank").min().alias("lo"), pl.col("rank").max().alias("hi"),
    )
    joined = seen.join(per_user, on="user_id", how="left").with_columns(
        pl.min_horizontal(pl.lit(k), pl.lit(n_items) - pl.col("seen")).alias("want")
    )
    short = joined.filter(pl.col("n").fill_null(0) != pl.col("want"))
    if short.height:
        failures.append(f"{short.height} users lack their K={k} candidates (e.g. {short.get_column('user_id')[0]})")
    if joined.filter(pl.col("distinct") != pl.col("n")).height:
        failures.append("a user's candidates repeat an item")
    if joined.filter((pl.col("lo") != 1) | (pl.col("hi") != pl.col("n"))).height:
        failures.append("candidate ranks are not 1..n per user")
    if candidates.join(interactions.select("user_id", "item_id"), on=["user_id", "item_id"], how="semi").height:
        failures.append("a candidate is an item the user already interacted with")
    if not candidates.get_column("score").is_finite().all():
        failures.append("user_candidates.score has non-finite values")
    return failures


def enforce(failures: list[str], stage: str) -> None:
    """Raise ContractViolation listing every failed rule of a stage (nothing is published)."""
    if failures:
        raise ContractViolation(f"output contract {stage} failed: " + "; ".join(failures))
