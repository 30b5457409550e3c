"""Row contracts of the outputs, checked before publish: item_scores and user_candidates (pandera on polars).

Every per-row and per-user rule of the outputs lives here: keys present and unique, topics in the label set,
topic_score in [0, 1] and not NaN, scored_by small or large, finite unit-norm embeddings, min(K, unseen) distinct
unseen candidates per user ranked 1..n. Dataset-level properties (sizes and distributions against the previous run,
users served) are the Great Expectations suites' (data_contracts/datasets.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandera.polars as pa
import polars as pl
from pandera.errors import SchemaError, SchemaErrors

from core.errors import ContractViolation
from core.records import SCORED_BY

ITEM_SCORES_CONTRACT = "item_scores/1"
USER_CANDIDATES_CONTRACT = "user_candidates/1"
NORM_TOLERANCE = 1e-3


def item_scores_schema(labels: list[str]) -> pa.DataFrameSchema:
    """Return the pandera row contract of item_scores (embedding checks are numeric, below)."""
    return pa.DataFrameSchema(
        {
            "item_id": pa.Column(str, nullable=False, unique=True),
            "topic": pa.Column(str, nullable=False, checks=pa.Check.isin(labels)),
            "topic_score": pa.Column(float, nullable=False, checks=pa.Check.in_range(0.0, 1.0)),
            "token_count": pa.Column(pl.Int32, nullable=False, coerce=True, checks=pa.Check.ge(1), required=False),
            "content_hash": pa.Column(str, nullable=False, checks=pa.Check.str_length(64, 64), required=False),
            "model_version": pa.Column(str, nullable=False, required=False),
            "scored_by": pa.Column(str, nullable=False, checks=pa.Check.isin(list(SCORED_BY)), required=False),
        },
        name="item_scores",
    )


def user_candidates_schema(k: int) -> pa.DataFrameSchema:
    """Return the pandera row contract of user_candidates: keys present, rank in 1..K, (user, item) unique."""
    return pa.DataFrameSchema(
        {
            "user_id": pa.Column(str, nullable=False),
            "item_id": pa.Column(str, nullable=False),
            "rank": pa.Column(pl.Int32, nullable=False, coerce=True, checks=pa.Check.in_range(1, k)),
            "score": pa.Column(float, nullable=False),
        },
        unique=["user_id", "item_id"],
        name="user_candidates",
    )


def pandera_cases(frame: pl.DataFrame, schema: pa.DataFrameSchema) -> pl.DataFrame | str:
    """Return failing pandera checks as (column, check, n, example) rows, or one line for a schema-level failure."""
    try:
        schema.validate(frame, lazy=True)
    except SchemaErrors as exc:
        return exc.failure_cases.group_by("column", "check", maintain_order=True).agg(
            pl.len().alias("n"), pl.col("failure_case").first().cast(pl.String).alias("example")
        )
    except SchemaError as exc:
        return f"{schema.name}: {' '.join(str(exc).split())[:200]}"
    return pl.DataFrame(schema={"column": pl.String, "check": pl.String, "n": pl.UInt32, "example": pl.String})


def render_cases(cases: list[pl.DataFrame | str], name: str) -> list[str]:
    """Return one line per failing check over one or more frames' cases: counts summed, first example kept."""
    lines = list(dict.fromkeys(c for c in cases if isinstance(c, str)))
    frames = [c.cast({"n": pl.UInt32}) for c in cases if isinstance(c, pl.DataFrame)]
    if frames:
        merged = (
            pl.concat(frames).group_by("column", "check", maintain_order=True).agg(pl.col("n").sum(), pl.col("example").first())
        )
        lines += [f"{name}.{c}: {check} failed for {n} row(s), e.g. {ex}" for c, check, n, ex in merged.iter_rows()]
    return lines


def pandera_failures(frame: pl.DataFrame, schema: pa.DataFrameSchema) -> list[str]:
    """Return one line per failing pandera check: column, check, failing rows and an example value."""
    return render_cases([pandera_cases(frame, schema)], str(schema.name))


@dataclass
class ItemScoreTally:
    """What item_score_failures needs of item_scores, accumulated one batch at a time."""

    cases: list[pl.DataFrame | str] = field(default_factory=list)
    rows: int = 0
    ids: list[pl.Series] = field(default_factory=list)
    all_finite: bool = True
    worst_norm: float = 0.0

    def add(self, batch: pl.DataFrame, labels: list[str]) -> None:
        """Check one batch (row contract and numeric rules) and keep its ids for the global uniqueness check."""
        self.cases.append(
            pandera_cases(batch.drop("embedding", strict=False), item_scores_schema(labels))
        )  # not a contract column
        self.rows += batch.height
        self.ids.append(batch.get_column("item_id"))
        vectors = batch.get_column("embedding").to_numpy() if batch.height else np.zeros((0, 1), np.float32)
        self.all_finite &= bool(np.isfinite(vectors).all())
        norms = np.linalg.norm(vectors, axis=1)
        if norms.size and np.isfinite(norms).any():
            self.worst_norm = max(self.worst_norm, float(np.nanmax(np.abs(norms - 1))))

    def item_ids(self) -> pl.Series:
        """Return the item ids of every batch added, in order."""
        return pl.concat(self.ids) if self.ids else pl.Series("item_id", [], dtype=pl.String)

    def failures(self, expected_rows: int) -> list[str]:
        """Return the failed rules over every batch added, in the order of item_score_failures."""
        failures = render_cases(self.cases, "item_scores")
        if self.rows != expected_rows:
            failures.append(f"item_scores has {self.rows} rows, expected {expected_rows}")
        ids = self.item_ids()
        if ids.n_unique() != self.rows:
            failures.append("item_scores.item_id is not unique")
        if not self.all_finite:
            failures.append("item_scores.embedding has NaN or infinite values")
        if self.worst_norm > NORM_TOLERANCE:
            failures.append(f"item_scores.embedding norm off 1 by {self.worst_norm:.2e}")
        return failures


def item_score_failures(scores: pl.DataFrame | Iterable[pl.DataFrame], labels: list[str], expected_rows: int) -> list[str]:
    """Return the item_scores rules that fail: pandera row contract, row count, finite unit-norm embeddings.

    ``scores`` may be one frame or batches of it (streamed): item_id uniqueness is checked over all ids.
    """
    tally = ItemScoreTally()
    for batch in [scores] if isinstance(scores, pl.DataFrame) else scores:
        tally.add(batch, labels)
    return tally.failures(expected_rows)


def owed_candidates(interactions: pl.DataFrame, n_items: int, k: int, item_ids: pl.Series | None = None) -> pl.DataFrame:
    """Return (user_id, want): every user's min(K, catalogue items the user has not seen); an item seen twice counts once.

    item_ids: the catalogue's items (None: every interaction is of one); items outside it are not counted as seen.
    """
    seen = pl.col("item_id") if item_ids is None else pl.col("item_id").filter(pl.col("item_id").is_in(item_ids.implode()))
    return interactions.group_by("user_id").agg(
        pl.min_horizontal(pl.lit(k), pl.lit(n_items) - seen.n_unique()).cast(pl.Int64).alias("want")
    )


def candidate_failures(
    candidates: pl.DataFrame, interactions: pl.DataFrame, n_items: int, k: int, item_ids: pl.Series | None = None
) -> list[str]:
    """Return the user_candidates rules that fail: pandera row contract, min(K, unseen) unseen catalogue items per user,
    ranks 1..n (item_ids: the catalogue, see owed_candidates)."""
    failures = pandera_failures(candidates, user_candidates_schema(k))
    per_user = candidates.group_by("user_id").agg(
        pl.len().alias("n"),
        pl.col("item_id").n_unique().alias("distinct"),
        pl.col("rank").n_unique().alias("ranks"),
        pl.col("rank").min().alias("lo"),
        pl.col("rank").max().alias("hi"),
    )
    joined = owed_candidates(interactions, n_items, k, item_ids).join(per_user, on="user_id", how="left")
    short = joined.filter(pl.col("n").fill_null(0) != pl.col("want"))
    if short.height:
        failures.append(f"{short.height} users lack their K={k} candidates (e.g. {short.get_column('user_id')[0]})")
    if joined.filter(pl.col("distinct") != pl.col("n")).height:
        failures.append("a user's candidates repeat an item")
    if joined.filter((pl.col("lo") != 1) | (pl.col("hi") != pl.col("n")) | (pl.col("ranks") != pl.col("n"))).height:
        failures.append("candidate ranks are not 1..n per user")
    if candidates.join(interactions.select("user_id", "item_id"), on=["user_id", "item_id"], how="semi").height:
        failures.append("a candidate is an item the user already interacted with")
    if item_ids is not None and not candidates.get_column("item_id").is_in(item_ids.implode()).all():
        failures.append("a candidate is not in the catalogue (item_scores)")
    if not candidates.get_column("score").is_finite().all():
        failures.append("user_candidates.score has non-finite values")
    return failures


def enforce(failures: list[str], stage: str) -> None:
    """Raise ContractViolation listing every failed rule of a stage (nothing is published)."""
    if failures:
        raise ContractViolation(f"output contract {stage} failed: " + "; ".join(failures))
