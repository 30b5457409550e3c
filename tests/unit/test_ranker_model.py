"""Unit tests of the stage-two ranker: feature tables on inline frames, metrics, training and the model file."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from models.ranker import (
    FEATURE_NAMES,
    FeatureIndex,
    RankerModel,
    TrainConfig,
    auc,
    build_features,
    default_cutoff,
    embedding_retrieval,
    feature_matrix,
    hashed_text_vectors,
    item_features,
    load_ranker,
    mean_ndcg,
    metadata_path,
    popular_items,
    save_ranker,
    train_ranker,
    training_examples,
    user_topic_affinity,
)
from nightscore.demo_data import generate_demo_data
from nightscore.errors import ModelLoadError
from nightscore.settings import DEFAULT_EVENT_WEIGHTS

NOW = datetime(2026, 11, 1, tzinfo=timezone.utc)
Frames = tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]


def _ts(days_ago: float) -> datetime:
    return NOW - timedelta(days=days_ago)


@pytest.fixture
def frames() -> Frames:
    """Return inline (items, interactions, item_scores): three items, two users, one future interaction."""
    items = pl.DataFrame({"item_id": ["a", "b", "c"], "created_at": [_ts(10), _ts(1), _ts(-1)]})
    interactions = pl.DataFrame({
        "user_id": ["u1", "u1", "u1", "u2", "u2"],
        "item_id": ["a", "a", "b", "a", "c"],
        "event": ["view", "click", "view", "view", "view"],
        "ts": [_ts(5), _ts(4), _ts(3), _ts(2), _ts(-0.5)],  # the last one lies after NOW
    })
    scores = pl.DataFrame({"item_id": ["a", "b"], "topic": ["sports", "music"], "topic_score": [0.9, 0.6]})
    return items, interactions, scores


@pytest.fixture(scope="module")
def demo() -> Frames:
    """Return the small demo (items, interactions, item_scores with seeded topic scores)."""
    items, interactions = generate_demo_data(300, 60)
    topic_score = pl.Series("topic_score", np.random.default_rng(0).uniform(0.4, 1.0, items.height))
    return items, interactions, items.select("item_id", "topic", topic_score)


@pytest.fixture(scope="module")
def retrieval(demo: Frames) -> object:
    return embedding_retrieval(hashed_text_vectors(demo[0]), DEFAULT_EVENT_WEIGHTS, 14.0)


@pytest.fixture(scope="module")
def trained(demo: Frames, retrieval: object) -> RankerModel:
    return train_ranker(*demo, retrieval, config=TrainConfig())  # type: ignore[arg-type]


# --- feature tables ---------------------------------------------------------------------------


def test_item_features_count_only_the_past(frames: Frames) -> None:
    table = item_features(*frames, NOW)
    assert table.columns == ["item_id", "topic", "topic_score", "log_popularity", "freshness_days"]
    rows = {r["item_id"]: r for r in table.iter_rows(named=True)}
    assert rows["a"]["log_popularity"] == pytest.approx(math.log1p(3))
    assert rows["b"]["log_popularity"] == pytest.approx(math.log1p(1))
    assert rows["c"]["log_popularity"] == 0.0  # its only interaction is in the future
    assert rows["a"]["freshness_days"] == pytest.approx(10.0)
    assert rows["c"]["freshness_days"] == 0.0  # created after NOW: clipped
    assert rows["c"]["topic"] is None and rows["c"]["topic_score"] == 0.0


def test_user_topic_affinity_is_a_share_per_user(frames: Frames) -> None:
    items, interactions, scores = frames
    affinity = user_topic_affinity(interactions, item_features(items, interactions, scores, NOW), NOW)
    expected = [("u1", "music", pytest.approx(1 / 3)), ("u1", "sports", pytest.approx(2 / 3)), ("u2", "sports", 1.0)]
    assert affinity.rows() == expected


@pytest.mark.parametrize(
    ("user_id", "item_id", "expected"),
    [
        ("u1", "a", [0.5, math.log1p(3), 10.0, 2 / 3, 0.9]),
        ("u1", "b", [0.5, math.log1p(1), 1.0, 1 / 3, 0.6]),
        ("u2", "b", [0.5, math.log1p(1), 1.0, 0.0, 0.6]),  # u2 never touched music
        ("nobody", "a", [0.5, math.log1p(3), 10.0, 0.0, 0.9]),  # unknown user
        ("u1", "zzz", [0.5, 0.0, 0.0, 0.0, 0.0]),  # unknown item
    ],
)
def test_build_features_and_the_serving_index_agree(
    frames: Frames, user_id: str, item_id: str, expected: list[float]
) -> None:
    items, interactions, scores = frames
    table = item_features(items, interactions, scores, NOW)
    affinity = user_topic_affinity(interactions, table, NOW)
    pairs = pl.DataFrame({"user_id": [user_id], "item_id": [item_id], "retrieval_score": [0.5]})
    built = feature_matrix(build_features(pairs, table, affinity))
    np.testing.assert_allclose(built[0], expected, rtol=1e-6)
    served = FeatureIndex(table, affinity).features(user_id, [item_id], np.array([0.5], dtype=np.float32))
    np.testing.assert_array_equal(served, built)


def test_build_features_keeps_the_pair_order(frames: Frames) -> None:
    items, interactions, scores = frames
    table = item_features(items, interactions, scores, NOW)
    pairs = pl.DataFrame({"user_id": ["u2", "u1", "u1"], "item_id": ["c", "b", "a"], "retrieval_score": [0.1, 0.2, 0.3]})
    built = build_features(pairs, table, user_topic_affinity(interactions, table, NOW))
    assert built.select("user_id", "item_id").rows() == pairs.select("user_id", "item_id").rows()
    assert list(FEATURE_NAMES) == [c for c in built.columns if c in FEATURE_NAMES]


def test_popular_items_break_ties_by_id(frames: Frames) -> None:
    ids, scores = popular_items(item_features(*frames, NOW), 3)
    assert ids == ["a", "b", "c"] and scores.dtype == np.float32


# --- metrics ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "scores", "expected"),
    [([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4], 1.0), ([1, 1, 0, 0], [0.1, 0.2, 0.3, 0.4], 0.0), ([0, 1, 0, 1], [1, 1, 1, 1], 0.5)],
)
def test_auc(labels: list[int], scores: list[float], expected: float) -> None:
    assert auc(np.array(labels), np.array(scores)) == pytest.approx(expected)


def test_ndcg_of_perfect_and_reversed_lists() -> None:
    users = np.array(["u"] * 4 + ["v"] * 2)
    labels = np.array([1, 0, 0, 0, 0, 1])
    assert mean_ndcg(users, labels, np.array([4, 3, 2, 1, 1, 2])) == pytest.approx(1.0)
    reversed_u = 1 / math.log2(5)  # u's positive ranked 4th; v's positive first
    assert mean_ndcg(users, labels, np.array([1, 2, 3, 4, 1, 2])) == pytest.approx((reversed_u + 1.0) / 2)


# --- training ----------------------------------------------------------------------------------


def test_training_examples_respect_the_time_split(demo: Frames, retrieval: object) -> None:
    items, interactions, scores = demo
    cutoff = default_cutoff(interactions)
    examples = training_examples(items, interactions, scores, cutoff, retrieval, negatives_per_positive=3)  # type: ignore[arg-type]
    seen_before = interactions.filter(pl.col("ts") < cutoff).select("user_id", "item_id").unique()
    ever = interactions.select("user_id", "item_id").unique()
    positives, negatives = examples.filter(pl.col("label") == 1), examples.filter(pl.col("label") == 0)
    assert positives.join(seen_before, on=["user_id", "item_id"], how="semi").is_empty()
    assert negatives.join(ever, on=["user_id", "item_id"], how="semi").is_empty()
    assert negatives.height == 3 * positives.height
    assert examples.select(FEATURE_NAMES).null_count().sum_horizontal().item() == 0


def test_training_is_deterministic_with_the_seed(demo: Frames, retrieval: object, trained: RankerModel) -> None:
    again = train_ranker(*demo, retrieval, config=TrainConfig())  # type: ignore[arg-type]
    assert again.version == trained.version and again.metrics == trained.metrics
    other = train_ranker(*demo, retrieval, config=TrainConfig(seed=1))  # type: ignore[arg-type]
    assert other.version != trained.version


def test_held_out_auc_beats_chance(trained: RankerModel) -> None:
    assert trained.metrics["held_out_users"] > 0
    assert trained.metrics["auc"] > 0.5
    assert trained.metrics["ndcg_at_10"] > 0.0


def test_score_checks_the_feature_shape(trained: RankerModel) -> None:
    assert trained.score(np.zeros((3, len(FEATURE_NAMES)))).shape == (3,)
    with pytest.raises(ValueError, match="feature matrix"):
        trained.score(np.zeros((3, 2)))


# --- file ------------------------------------------------------------------------------------


def test_save_load_round_trip(trained: RankerModel, tmp_path: Path) -> None:
    path = save_ranker(trained, tmp_path / "m" / "ranker.pt")
    meta = json.loads(metadata_path(path).read_text())
    assert meta["version"] == trained.version and meta["feature_names"] == list(FEATURE_NAMES)
    assert meta["metrics"]["auc"] == trained.metrics["auc"] and "cutoff" in meta["training"]
    loaded = load_ranker(path)
    x = np.random.default_rng(0).normal(size=(50, len(FEATURE_NAMES))).astype(np.float32)
    assert loaded.version == trained.version
    np.testing.assert_array_equal(loaded.score(x), trained.score(x))


def test_load_refuses_a_tampered_or_missing_file(trained: RankerModel, tmp_path: Path) -> None:
    path = save_ranker(trained, tmp_path / "ranker.pt")
    meta = json.loads(metadata_path(path).read_text())
    metadata_path(path).write_text(json.dumps({**meta, "version": "ranker-0000"}))
    with pytest.raises(ModelLoadError, match="content hash"):
        load_ranker(path)
    with pytest.raises(ModelLoadError):
        load_ranker(tmp_path / "missing.pt")
