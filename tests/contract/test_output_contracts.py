"""Contract tier: the row contracts of the outputs (pandera), which own every per-row and per-user rule."""

from __future__ import annotations

from datetime import date

import numpy as np
import polars as pl
import pytest

from core.settings import DEFAULT_TOPIC_LABELS
from data_contracts.outputs import candidate_failures, item_score_failures, owed_candidates

K = 10
TOPICS = list(DEFAULT_TOPIC_LABELS)
DIM = 8


def item_scores(n: int = 60, seed: int = 0) -> pl.DataFrame:
    """Return a clean item_scores frame: unit-norm embeddings, known topics, scores in [0, 1]."""
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return pl.DataFrame(
        {
            "run_id": "r1",
            "run_date": date(2026, 11, 1),
            "item_id": [f"i{i:04d}" for i in range(n)],
            "model_version": "m",
            "topic": [TOPICS[i % len(TOPICS)] for i in range(n)],
            "topic_score": rng.uniform(0.2, 0.8, n),
            "token_count": rng.integers(4, 200, n, dtype=np.int32),
            "content_hash": ["h" * 64] * n,
        }
    ).with_columns(pl.Series("embedding", vectors, dtype=pl.Array(pl.Float32, DIM)))


def candidates(n_users: int = 6, k: int = K) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Return (clean candidates: k distinct unseen items per user ranked 1..k, the users' interactions)."""
    rows = [(f"u{u}", rank, f"i{(u * 7 + rank) % 60:04d}", 1.0 - rank / 100) for u in range(n_users) for rank in range(1, k + 1)]
    frame = pl.DataFrame(
        rows, schema={"user_id": pl.String, "rank": pl.Int32, "item_id": pl.String, "score": pl.Float64}, orient="row"
    )
    seen = pl.DataFrame({"user_id": [f"u{u}" for u in range(n_users)], "item_id": ["i0059"] * n_users})
    return frame, seen


def with_value(frame: pl.DataFrame, column: str, row: int, value: object) -> pl.DataFrame:
    """Return frame with one cell replaced."""
    return frame.with_columns(
        pl.when(pl.int_range(pl.len()) == row)
        .then(pl.lit(value, dtype=frame.schema[column]))
        .otherwise(pl.col(column))
        .alias(column)
    )


def test_clean_outputs_pass() -> None:
    assert item_score_failures(item_scores(), TOPICS, 60) == []
    frame, seen = candidates()
    assert candidate_failures(frame, seen, 60, K) == []


@pytest.mark.parametrize(("factor", "expected"), [(1.1, "norm off 1"), (float("nan"), "NaN or infinite")])
def test_embedding_off_the_unit_sphere_fails(factor: float, expected: str) -> None:
    frame = item_scores()
    bad = frame.with_columns(
        pl.when(pl.col("item_id") == "i0007").then(pl.col("embedding") * factor).otherwise(pl.col("embedding")).alias("embedding")
    )
    assert any(expected in failure for failure in item_score_failures(bad, TOPICS, 60))


@pytest.mark.parametrize(
    ("column", "value", "expected"),
    [
        ("topic_score", 1.5, "topic_score: in_range"),
        ("topic_score", float("nan"), "topic_score: in_range"),
        ("topic_score", None, "topic_score: not_nullable"),
        ("topic", "gardening", "topic: isin"),
        ("item_id", "i0001", "item_id is not unique"),
    ],
)
def test_bad_item_score_value_fails_naming_its_rule(column: str, value: object, expected: str) -> None:
    failures = item_score_failures(with_value(item_scores(), column, 3, value), TOPICS, 60)
    assert any(expected in failure for failure in failures), failures


def test_duplicate_pair_repeated_rank_and_rank_above_k_fail() -> None:
    frame, seen = candidates()
    duplicate = with_value(frame, "item_id", 1, frame["item_id"][0])
    assert any("repeat an item" in f for f in candidate_failures(duplicate, seen, 60, K))
    repeated_rank = with_value(frame, "rank", 1, 1)
    assert any("ranks are not 1..n" in f for f in candidate_failures(repeated_rank, seen, 60, K))
    above = with_value(frame, "rank", 9, K + 1)
    assert any("rank: in_range" in f for f in candidate_failures(above, seen, 60, K))


def test_seen_item_and_missing_candidates_fail() -> None:
    frame, seen = candidates()
    seen_again = pl.concat([seen, frame.select("user_id", "item_id").head(1)])
    assert any("already interacted" in f for f in candidate_failures(frame, seen_again, 60, K))
    short = frame.filter(~((pl.col("user_id") == "u0") & (pl.col("rank") == K)))
    assert any("lack their K=10 candidates" in f for f in candidate_failures(short, seen, 60, K))


def _ranked(user: str, items: list[str]) -> pl.DataFrame:
    """Return one user's candidates: the items ranked 1..n."""
    return pl.DataFrame(
        {"user_id": user, "rank": list(range(1, len(items) + 1)), "item_id": items, "score": [1.0] * len(items)},
        schema={"user_id": pl.String, "rank": pl.Int32, "item_id": pl.String, "score": pl.Float64},
    )


def test_a_small_catalogue_owes_min_k_unseen_items_counting_a_seen_item_once_and_catalogue_items_only() -> None:
    """Catalogue i0..i4, K 10: u0 saw i0 twice and an item gone from the catalogue -> owed 4; u1 saw all 5 -> owed 0."""
    catalogue = pl.Series("item_id", [f"i{i}" for i in range(5)])
    seen = pl.DataFrame({"user_id": ["u0", "u0", "u0", *["u1"] * 5], "item_id": ["i0", "i0", "gone", *catalogue.to_list()]})
    frame = _ranked("u0", ["i1", "i2", "i3", "i4"])
    assert candidate_failures(frame, seen, 5, K, item_ids=catalogue) == []
    assert owed_candidates(seen, 5, K, item_ids=catalogue).sort("user_id").rows() == [("u0", 4), ("u1", 0)]
    assert any("lack their K=10 candidates" in f for f in candidate_failures(frame.head(3), seen, 5, K, item_ids=catalogue))
    outside = pl.concat([frame, _ranked("u0", ["i1", "i2", "i3", "i4", "x9"]).tail(1)])
    assert any("not in the catalogue" in f for f in candidate_failures(outside, seen, 5, K, item_ids=catalogue))
