"""Contract tier: the row contracts applied batch by batch quarantine exactly what one whole-frame pass does."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl
import pytest

from data_contracts.inputs import InputRules, duplicate_rows, validate_interactions, validate_items
from nightscore.demo import generate_demo_data

RULES = InputRules(not_after=datetime(2026, 12, 1, tzinfo=UTC), max_text_chars=20_000)
URI = "mem://items.parquet"


@pytest.fixture(scope="module")
def defective() -> tuple[pl.DataFrame, pl.DataFrame]:
    """Demo inputs with duplicate ids far apart and close together, a null id, a blank text and a bad event."""
    items, interactions = generate_demo_data(120, 30, seed=3)
    ids = items["item_id"].to_list()
    ids[100], ids[7], ids[8] = ids[2], ids[50], ids[50]  # item 2 twice (far apart), item 50 three times
    ids[60] = None
    bodies = items["body"].to_list()
    bodies[90] = "   "
    items = items.with_columns(
        pl.Series("item_id", ids),
        pl.Series("body", bodies),
        pl.when(pl.int_range(pl.len()) == 90).then(None).otherwise(pl.col("title")).alias("title"),
    )
    events = interactions["event"].to_list()
    events[5] = "like"
    return items, interactions.with_columns(pl.Series("event", events))


def _batched(
    items: pl.DataFrame, interactions: pl.DataFrame, size: int, rules: InputRules = RULES
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    duplicated = duplicate_rows(items.select("item_id", "created_at"), rules.duplicate_policy)
    parts = [validate_items(items.slice(o, size), rules, URI, o, duplicated) for o in range(0, items.height, size)]
    valid = pl.concat([p[0] for p in parts])
    inter = [
        validate_interactions(interactions.slice(o, size), valid["item_id"], RULES, URI, o)
        for o in range(0, interactions.height, size)
    ]
    quarantine = pl.concat([p[1] for p in parts] + [p[1] for p in inter])
    return valid, pl.concat([p[0] for p in inter]), quarantine


@pytest.mark.parametrize("size", [7, 50, 1000])
def test_batches_quarantine_what_one_pass_does(defective: tuple[pl.DataFrame, pl.DataFrame], size: int) -> None:
    items, interactions = defective
    valid, q_items = validate_items(items, RULES, URI)
    valid_i, q_inter = validate_interactions(interactions, valid["item_id"], RULES, URI)
    b_valid, b_valid_i, b_quarantine = _batched(items, interactions, size)
    assert b_valid.equals(valid) and b_valid_i.equals(valid_i)
    whole = pl.concat([q_items, q_inter])
    assert b_quarantine.sort(pl.all()).equals(whole.sort(pl.all()))
    if size >= items.height:  # one batch: the very same rows in the very same order
        assert b_quarantine.equals(whole)
    rules = set(whole["rule"].to_list())
    assert {"item_id:field_uniqueness", "item_id:not_nullable", "text:not_blank", "item_id:item_exists"} <= rules, rules
    assert whole.filter(pl.col("rule") == "item_id:field_uniqueness").height == 5


@pytest.mark.parametrize("size", [7, 1000])
def test_keep_latest_batches_keep_what_one_pass_keeps(defective: tuple[pl.DataFrame, pl.DataFrame], size: int) -> None:
    items, interactions = defective
    rules = InputRules(not_after=RULES.not_after, max_text_chars=RULES.max_text_chars, duplicate_policy="keep_latest")
    valid, q_items = validate_items(items, rules, URI)
    b_valid, _, b_quarantine = _batched(items, interactions, size, rules)
    assert b_valid.equals(valid)
    assert b_quarantine.filter(pl.col("dataset") == "items").sort(pl.all()).equals(q_items.sort(pl.all()))
    assert q_items.filter(pl.col("rule") == "item_id:duplicate_not_kept").height == 3  # 1 of item 2's copies, 2 of item 50's
