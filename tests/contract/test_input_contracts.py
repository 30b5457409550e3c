"""Contract tier: input and output contracts on demo batches with one defect each."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import polars as pl
import pytest

from core.errors import InputUnreadable
from data_contracts.inputs import InputRules, validate_interactions, validate_items
from data_contracts.outputs import candidate_failures, item_score_failures
from nightscore.demo import generate_demo_data

RULES = InputRules(not_after=datetime(2026, 12, 1, tzinfo=UTC), max_text_chars=20_000)
URI = "mem://items.parquet"


@pytest.fixture(scope="module")
def demo() -> tuple[pl.DataFrame, pl.DataFrame]:
    return generate_demo_data(200, 40, seed=11)


def with_value(frame: pl.DataFrame, column: str, row: int, value: object) -> pl.DataFrame:
    """Return frame with one cell replaced."""
    dtype = frame.schema[column]
    return frame.with_columns(
        pl.when(pl.int_range(pl.len()) == row).then(pl.lit(value, dtype=dtype)).otherwise(pl.col(column)).alias(column)
    )


def test_clean_demo_batch_passes(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    items, interactions = demo
    valid, quarantine = validate_items(items, RULES, URI)
    assert valid.height == items.height and quarantine.height == 0
    assert valid["text"][0] == f"{items['title'][0]}\n{items['body'][0]}"
    valid_i, q_i = validate_interactions(interactions, valid["item_id"], RULES, URI)
    assert valid_i.height == interactions.height and q_i.height == 0


@pytest.mark.parametrize(
    ("column", "value", "rule"),
    [
        ("item_id", None, "item_id:not_nullable"),
        ("item_id", "", "item_id:valid_id"),
        ("item_id", " ", "item_id:valid_id"),
        ("item_id", "a\nb", "item_id:valid_id"),
        ("item_id", "x" * 10_000, "item_id:valid_id"),
        ("body", None, "body:not_nullable"),
        ("body", "x" * 25_000, "text:str_length(None, 20000)"),
        ("created_at", datetime(2027, 6, 1, tzinfo=UTC), "created_at:less_than_or_equal_to"),
    ],
)
def test_bad_item_value_is_quarantined_with_its_rule(
    demo: tuple[pl.DataFrame, pl.DataFrame], column: str, value: object, rule: str
) -> None:
    items = with_value(demo[0], column, 7, value)
    valid, quarantine = validate_items(items, RULES, URI)
    assert valid.height == items.height - 1
    assert quarantine.height >= 1 and quarantine["rule"][0].startswith(rule)
    assert quarantine["dataset"].to_list() == ["items"] * quarantine.height


def test_blank_text_is_quarantined(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    items = with_value(with_value(demo[0], "body", 3, " \t\n "), "title", 3, None)
    _, quarantine = validate_items(items, RULES, URI)
    assert quarantine.select("row_key", "rule").rows() == [(items["item_id"][3], "text:not_blank")]


def test_every_copy_of_a_duplicate_id_is_quarantined(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    items = with_value(demo[0], "item_id", 9, demo[0]["item_id"][8])
    valid, quarantine = validate_items(items, RULES, URI)
    assert valid.height == items.height - 2
    assert quarantine["row_key"].to_list() == [items["item_id"][8]] * 2


@pytest.mark.parametrize(
    ("column", "value", "rule"),
    [
        ("event", "like", "event:isin"),
        ("user_id", "  ", "user_id:valid_id"),
        ("user_id", "u\u200b1", "user_id:valid_id"),  # a zero-width space: invisible, never typed back
        ("ts", datetime(2030, 1, 1, tzinfo=UTC), "ts:less_than_or_equal_to"),
        ("item_id", "item-999999", "item_id:item_exists"),
    ],
)
def test_bad_interaction_is_quarantined_with_its_rule(
    demo: tuple[pl.DataFrame, pl.DataFrame], column: str, value: object, rule: str
) -> None:
    items, interactions = demo
    bad = with_value(interactions, column, 4, value)
    valid, quarantine = validate_interactions(bad, items["item_id"], RULES, URI)
    assert valid.height == interactions.height - 1
    assert quarantine.height == 1 and quarantine["rule"][0].startswith(rule)


def test_missing_required_column_is_unreadable(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    with pytest.raises(InputUnreadable, match=r"items file mem://items.parquet: missing required column\(s\) body"):
        validate_items(demo[0].drop("body"), RULES, URI)


def test_uncoercible_type_is_unreadable(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    items = demo[0].with_columns(pl.lit(12.5).alias("created_at"))
    with pytest.raises(InputUnreadable, match="column created_at has type Float64"):
        validate_items(items, RULES, URI)


def test_extra_columns_are_ignored_and_safe_types_coerced(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    items = demo[0].with_columns(pl.lit("x").alias("extra"), pl.col("created_at").dt.replace_time_zone(None))
    valid, quarantine = validate_items(items, RULES, URI)
    assert "extra" not in valid.columns and quarantine.height == 0
    assert valid.schema["created_at"] == pl.Datetime("us", "UTC")


def scores_frame(vectors: np.ndarray, topic_score: list[float]) -> pl.DataFrame:
    n = len(vectors)
    return pl.DataFrame(
        {"item_id": [f"i{i}" for i in range(n)], "topic": ["sports"] * n, "topic_score": topic_score}
    ).with_columns(pl.Series("embedding", vectors.astype(np.float32)).cast(pl.Array(pl.Float32, vectors.shape[1])))


def test_output_contract_catches_nan_norms_and_scores() -> None:
    good = np.eye(3, 4)
    assert item_score_failures(scores_frame(good, [0.1, 0.5, 1.0]), ["sports"], 3) == []
    bad = good.copy()
    bad[0, 0] = np.nan
    bad[1] *= 2
    failures = item_score_failures(scores_frame(bad, [0.1, 1.5, 0.2]), ["sports"], 4)
    assert any("4" in f and "rows" in f for f in failures)
    assert any("NaN" in f for f in failures)
    assert any("topic_score" in f for f in failures)


def test_candidate_contract_catches_repeats_seen_items_and_short_lists() -> None:
    interactions = pl.DataFrame({"user_id": ["u1", "u2"], "item_id": ["i0", "i0"]})
    ok = pl.DataFrame(
        {
            "user_id": ["u1", "u1", "u2", "u2"],
            "rank": [1, 2, 1, 2],
            "item_id": ["i1", "i2", "i2", "i1"],
            "score": [0.9, 0.8, 0.7, 0.6],
        }
    )
    assert candidate_failures(ok, interactions, n_items=3, k=2) == []
    repeated = ok.with_columns(
        pl.when(pl.int_range(pl.len()) == 1).then(pl.lit("i1")).otherwise(pl.col("item_id")).alias("item_id")
    )
    assert any("repeat" in f for f in candidate_failures(repeated, interactions, 3, 2))
    seen = ok.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(pl.lit("i0")).otherwise(pl.col("item_id")).alias("item_id"))
    assert any("already interacted" in f for f in candidate_failures(seen, interactions, 3, 2))
    assert any("lack" in f for f in candidate_failures(ok.head(3), interactions, 3, 2))


def test_output_row_contracts_are_pandera_and_catch_bad_values() -> None:
    from data_contracts.outputs import pandera_failures, user_candidates_schema

    good = pl.DataFrame({"user_id": ["u1", "u1"], "item_id": ["a", "b"], "rank": [1, 2], "score": [0.5, 0.4]}).cast(
        {"rank": pl.Int32}
    )
    assert pandera_failures(good, user_candidates_schema(2)) == []
    bad = good.with_columns(pl.Series("rank", [1, 7], dtype=pl.Int32), pl.Series("item_id", ["a", "a"]))
    failures = pandera_failures(bad, user_candidates_schema(2))
    assert any("rank" in f and "in_range" in f and "7" in f for f in failures), failures
    assert any("user_id" in f and "item_id" in f for f in failures), failures
    duplicate_topic = scores_frame(np.eye(2, 4), [0.2, 0.3]).with_columns(pl.Series("topic", ["sports", "gardening"]))
    assert any("topic" in f and "isin" in f for f in item_score_failures(duplicate_topic, ["sports"], 2))
