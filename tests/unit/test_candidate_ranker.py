"""Unit tests of the stage-two features, both ranker kinds, their bytes, and the candidate stage on demo data."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
import torch

from core.errors import ContractViolation, ModelLoadError
from models.recommender.candidate_stage import (
    CandidateConfig,
    Tuned,
    candidate_chunks,
    evaluate,
    fit_final,
    sample_split,
    tune,
)
from models.recommender.evaluation import GateRule, check_gate, metric_value, time_split, user_recall
from models.recommender.fusion import Fused, TuningGrid
from models.recommender.ranker_features import candidate_features, feature_context, feature_names
from models.recommender.ranker_models import mlp_from_net, scorer_from_bytes, scorer_to_bytes, scorer_version
from models.recommender.ranker_net import TrainConfig, fit_net
from models.recommender.ranker_training import (
    ROWS_PER_THREAD,
    RankerParams,
    Rows,
    rerank,
    train_lambdarank,
    train_mlp,
    training_threads,
)
from models.recommender.retrieval import ItemChunks
from models.recommender.sources.base import encode_run, history_of
from nightscore.demo import DEMO_BASE_TIME, generate_demo_data
from tests.helpers import auc, hashed_text_vectors

NAMES = tuple(f"f{i}" for i in range(4))


@pytest.fixture(scope="module")
def rows() -> Rows:
    """40 users x 10 candidates; the label follows f0 + f1 with noise, so both kinds can learn it."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] + 0.3 * rng.standard_normal(400) > 1.2).astype(np.int32)
    return Rows(x, y, np.repeat(np.arange(40), 10))


def test_mlp_numpy_forward_equals_the_torch_module(rows: Rows) -> None:
    net = fit_net(rows.x, rows.y.astype(np.float32), TrainConfig(hidden=8, epochs=2, batch_size=32))
    with torch.inference_mode():
        expected = net(torch.from_numpy(rows.x)).numpy()
    np.testing.assert_allclose(mlp_from_net(net, NAMES).predict(rows.x), expected, rtol=1e-5, atol=1e-5)


def test_an_mlp_trained_on_a_single_row_scores_finite() -> None:
    """A catalogue of a few items can leave one labelled candidate: its spread is 0, not NaN."""
    net = fit_net(np.array([[0.5, 2.0]], np.float32), np.ones(1, np.float32), TrainConfig(hidden=4, epochs=2))
    scores = mlp_from_net(net, ("a", "b")).predict(np.array([[0.5, 2.0], [1.0, -1.0]], np.float32))
    assert np.isfinite(scores).all()


@pytest.mark.parametrize("train", [train_lambdarank, train_mlp])
def test_both_kinds_learn_round_trip_as_bytes_and_refuse_tampering(rows: Rows, train: object) -> None:
    params = RankerParams(rounds=30, threads=1, mlp=TrainConfig(hidden=8, epochs=10, batch_size=32))
    scorer = train(rows, NAMES, params)  # type: ignore[operator]
    scores = scorer.predict(rows.x)
    assert auc(rows.y, scores) > 0.85
    model, meta = scorer_to_bytes(scorer)
    loaded = scorer_from_bytes(model, meta)
    assert loaded.kind == scorer.kind and scorer_version(loaded) == scorer_version(scorer)
    np.testing.assert_array_equal(loaded.predict(rows.x), scores)
    with pytest.raises(ModelLoadError):
        scorer_from_bytes(model[:-8] + b"\x00" * 8, meta)
    with pytest.raises(ValueError):
        loaded.predict(rows.x[:, :3])


def test_lightgbm_is_deterministic_for_a_seed(rows: Rows) -> None:
    a, b = (train_lambdarank(rows, NAMES, RankerParams(rounds=20, threads=1, seed=4)) for _ in range(2))
    assert scorer_version(a) == scorer_version(b)


def test_rerank_orders_by_score_and_keeps_empty_slots_last() -> None:
    class ByFirst:
        def __init__(self) -> None:
            self.kind = "test"
            self.feature_names: tuple[str, ...] = ("f",)
            self.metrics: dict[str, float] = {}

        def predict(self, x: np.ndarray) -> np.ndarray:
            return x[:, 0]

        def model_bytes(self) -> bytes:
            return b""

    fused_rows = np.array([[5, 6, 7, -1]])
    features = np.array([[[0.1], [0.9], [0.1], [0.0]]], dtype=np.float32)
    assert rerank(fused_rows, features, ByFirst()).tolist() == [[6, 5, 7, -1]]  # tie 5 / 7 keeps fused order


@pytest.fixture(scope="module")
def demo_stage() -> tuple[object, ...]:
    """The candidate stage on the default demo data, with hashed-text embeddings and a small tuning grid."""
    items, interactions = generate_demo_data(2000, 500, seed=0)
    catalogue, log = encode_run(items, interactions)
    vectors = np.stack(hashed_text_vectors(items)["embedding"].to_list()).astype(np.float32)
    chunks = ItemChunks.of(vectors, 512)
    config = CandidateConfig(
        grid=TuningGrid(weights=(0.25, 1.0, 4.0), rrf_k=(20.0, 60.0), rounds=1), ranker=RankerParams(rounds=100, threads=1)
    )
    evaluation = time_split(log, config.holdout_share)
    tuned = tune(catalogue, log, chunks, config, evaluation)
    report = evaluate(catalogue, log, chunks, config, evaluation, tuned)
    return catalogue, log, chunks, config, tuned, report


def test_fused_beats_popularity_on_held_out_demo_data(demo_stage: tuple[object, ...]) -> None:
    report = demo_stage[5]
    table = report.metrics  # type: ignore[attr-defined]
    fused, popular = metric_value(table, "fused", "recall_at_k"), metric_value(table, "popularity", "recall_at_k")
    assert fused >= 1.1 * popular
    assert metric_value(table, "ranked", "ndcg_at_10") > metric_value(table, "popularity", "ndcg_at_10")
    assert metric_value(table, "fused", "cold_recall_at_k") > 0.0
    assert metric_value(table, "split", "users_evaluated") > 150
    assert check_gate(table, report.recall, GateRule()).startswith("passed")  # type: ignore[attr-defined]
    with pytest.raises(ContractViolation, match="below popularity"):
        check_gate(table, report.recall, GateRule(recall_margin=1.0))  # type: ignore[attr-defined]  # a margin no list can reach


def test_a_broken_fusion_on_a_catalogue_with_structure_fails_the_gate(demo_stage: tuple[object, ...]) -> None:
    """Random lists in place of the fused ones, on the demo catalogue's 500 users: worse than popularity with confidence."""
    catalogue, log, _, config, _, report = demo_stage
    split = sample_split(time_split(log, config.holdout_share), config.max_eval_users, config.seed)  # type: ignore[arg-type, attr-defined]
    rows = np.random.default_rng(0).integers(0, catalogue.n_items, (len(split.users), config.k))  # type: ignore[attr-defined]
    broken = {"fused": user_recall(rows, split, catalogue.n_items, config.k), "popularity": report.recall["popularity"]}  # type: ignore[attr-defined]
    assert len(broken["fused"]) == len(broken["popularity"]) >= GateRule().min_users
    with pytest.raises(ContractViolation, match="with confidence"):
        check_gate(report.metrics, broken, GateRule())  # type: ignore[attr-defined]


def test_a_fusion_that_loses_to_a_source_on_validation_publishes_that_source(demo_stage: tuple[object, ...]) -> None:
    """A quota of every slot for new items cripples the fused list: the stage ships the best source instead."""
    catalogue, log, chunks, config, tuned, _ = demo_stage
    assert isinstance(config, CandidateConfig) and isinstance(tuned, Tuned)
    assert tuned.fallback is None  # the tuned fusion is kept when it holds its own
    crippled = replace(config, grid=replace(config.grid, new_quota=(1.0,)))
    evaluation = time_split(log, crippled.holdout_share)  # type: ignore[arg-type]  # the fixture's tuple is untyped
    fell_back = tune(catalogue, log, chunks, crippled, evaluation)  # type: ignore[arg-type]
    assert fell_back.fallback in {"als", "cooccurrence", "content", "trending", "topic_trending"}
    assert fell_back.first_stage is None and fell_back.fusion.weights[fell_back.fallback] == 1.0
    assert sum(fell_back.fusion.weights.values()) == 1.0 and fell_back.fusion.new_quota == 0.0
    report = evaluate(catalogue, log, chunks, crippled, evaluation, fell_back)  # type: ignore[arg-type]
    fused, source = (metric_value(report.metrics, m, "recall_at_k") for m in ("fused", fell_back.fallback))
    assert fused >= source > metric_value(report.metrics, "content_new", "recall_at_k")
    assert check_gate(report.metrics, report.recall, GateRule()).startswith("passed")


def test_published_feature_rows_are_the_training_function_applied_to_the_published_candidates(
    demo_stage: tuple[object, ...],
) -> None:
    catalogue, log, chunks, config, tuned, report = demo_stage
    final = fit_final(catalogue, log, chunks, config, DEMO_BASE_TIME, tuned, report.scorer)  # type: ignore[arg-type, attr-defined]
    chunk = next(candidate_chunks(final, np.arange(50)))
    context = feature_context(final.history, catalogue, config.popularity.trend_half_life_days)  # type: ignore[arg-type, attr-defined]
    np.testing.assert_array_equal(chunk.features, candidate_features(chunk.fused, chunk.users, context))
    assert chunk.feature_names == feature_names(chunk.fused.names) == report.scorer.feature_names  # type: ignore[attr-defined]
    user_id, item_ids, matrix = next(chunk.payloads(catalogue.item_ids, catalogue.user_ids))  # type: ignore[attr-defined]
    frame = chunk.frame.filter(chunk.frame["user_id"] == user_id).sort("rank")
    assert frame["item_id"].to_list() == item_ids and matrix.shape == (len(item_ids), len(chunk.feature_names))
    seen = set(log.item_rows[log.user_rows == 0].tolist())  # type: ignore[attr-defined]
    assert not seen & set(chunk.fused.rows[0].tolist())
    assert {"sources", "rank_cooccurrence", "score_als"} <= set(chunk.frame.columns)


def test_features_by_hand() -> None:
    """One user, two candidates; ranks (list a, list b) = (1, 0) and (2, 1)."""
    items, interactions = generate_demo_data(20, 3, seed=1)
    catalogue, log = encode_run(items, interactions)
    history = history_of(log, catalogue, None, DEMO_BASE_TIME, {"view": 1.0}, 14.0)
    fused = Fused(
        ("a", "b"),
        np.array([[3, 5]], np.int32),
        np.array([[9.0, 8.0]], np.float32),
        np.array([[[1, 0], [2, 1]]], np.int32),
        np.array([[[0.9, np.nan], [0.8, 7.0]]], np.float32),
        np.array([[0.5, 0.25]], np.float32),
        np.array([[1, 2]], np.int32),
    )
    features = candidate_features(fused, np.array([0]), feature_context(history, catalogue, 7.0))
    names = feature_names(("a", "b"))
    row = dict(zip(names, features[0, 1].tolist(), strict=True))
    assert row["fused_score"] == 0.25 and row["fused_rr"] == 0.5 and row["n_lists"] == 2
    assert row["rr_a"] == 0.5 and row["rr_b"] == 1.0 and row["score_b"] == 7.0
    assert features[0, 0, names.index("score_b")] == 0.0 and features[0, 0, names.index("rr_b")] == 0.0
    count = int((log.item_rows == 5).sum())
    assert row["log_popularity"] == pytest.approx(np.log1p(count)) and row["is_new"] == float(count == 0)


def test_lightgbm_threads_follow_the_training_rows_unless_asked() -> None:
    cores = os.cpu_count() or 1
    assert training_threads(3, 10) == 3  # asked for: kept
    assert training_threads(0, 0) == training_threads(0, ROWS_PER_THREAD - 1) == 1  # a small set: one thread
    assert training_threads(0, 2 * ROWS_PER_THREAD) == min(2, cores)
    assert training_threads(0, 10**9) == cores  # never more than the cores
