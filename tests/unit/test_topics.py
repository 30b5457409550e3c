"""Unit tests of zero-shot topic scores: argmax label and its softmax probability."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from models.topics import topic_decisions, topic_scores


def _unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _softmax_reference(items: np.ndarray, labels: np.ndarray, temperature: float) -> np.ndarray:
    logits = items.astype(np.float64) @ labels.astype(np.float64).T / temperature
    logits -= logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def vectors() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    return _unit(rng, 200, 32), _unit(rng, 7, 32)


def test_topic_scores_picks_the_nearest_label() -> None:
    labels = np.eye(3, dtype=np.float32)
    items = np.array([[0.1, 0.9, 0.1], [0.0, 0.2, 0.98], [0.99, 0.1, 0.0]], dtype=np.float32)
    items /= np.linalg.norm(items, axis=1, keepdims=True)
    index, prob = topic_scores(items, labels, temperature=0.05)
    assert index.tolist() == [1, 2, 0]
    assert index.dtype == np.int32 and prob.dtype == np.float64
    assert np.all(prob > 1 / 3) and np.all(prob <= 1.0)


@pytest.mark.parametrize("temperature", [0.01, 0.05, 0.5, 1.0, 10.0])
def test_topic_scores_match_numpy_softmax(vectors: tuple[np.ndarray, np.ndarray], temperature: float) -> None:
    items, labels = vectors
    index, prob = topic_scores(items, labels, temperature)
    ref = _softmax_reference(items, labels, temperature)
    assert np.array_equal(index, ref.argmax(axis=1))
    np.testing.assert_allclose(prob, ref.max(axis=1), rtol=1e-12, atol=1e-15)  # float64 throughout
    assert np.all((prob >= 0) & (prob <= 1))
    assert np.all(prob >= 1 / labels.shape[0] - 1e-6)  # the max of a distribution over 7 labels


def test_lower_temperature_sharpens(vectors: tuple[np.ndarray, np.ndarray]) -> None:
    items, labels = vectors
    probs = [topic_scores(items, labels, t)[1] for t in (2.0, 0.5, 0.1, 0.02)]
    indices = [topic_scores(items, labels, t)[0] for t in (2.0, 0.5, 0.1, 0.02)]
    for warm, cold in itertools.pairwise(probs):
        assert np.all(cold >= warm)
        assert cold.mean() > warm.mean()
    # Temperature rescales the logits only: the winning label never changes.
    for index in indices[1:]:
        assert np.array_equal(index, indices[0])


def test_topic_scores_does_not_modify_inputs(vectors: tuple[np.ndarray, np.ndarray]) -> None:
    items, labels = vectors
    items_before, labels_before = items.copy(), labels.copy()
    topic_scores(items, labels, 0.1)
    assert np.array_equal(items, items_before) and np.array_equal(labels, labels_before)


def test_topic_scores_accepts_float64_and_single_label() -> None:
    rng = np.random.default_rng(12)
    items = _unit(rng, 5, 4).astype(np.float64)
    index, prob = topic_scores(items, _unit(rng, 1, 4), 0.1)
    assert index.tolist() == [0] * 5
    np.testing.assert_allclose(prob, 1.0, atol=1e-6)


def test_a_rows_topic_is_the_same_bits_whatever_rows_are_scored_with_it() -> None:
    """Shards, resumed runs and Ray workers score different groups of rows; one vector always gets one score."""
    rng = np.random.default_rng(13)
    items, labels = _unit(rng, 300, 384), _unit(rng, 8, 384)  # MiniLM's width; the demo's catalogue and topics
    whole = topic_decisions(items, labels, 0.05)
    groups = {
        "one row each": [np.arange(i, i + 1) for i in range(len(items))],
        "shards of 40": np.array_split(np.arange(len(items)), range(40, len(items), 40)),
        "reversed": [np.arange(len(items))[::-1]],
    }
    for name, parts in groups.items():
        apart = [np.empty_like(values) for values in whole]
        for rows in parts:
            for column, values in zip(apart, topic_decisions(items[rows], labels, 0.05), strict=True):
                column[rows] = values
        for field, alone, together in zip(("topic", "score", "margin"), apart, whole, strict=True):
            assert np.array_equal(alone, together), f"{field} differs when scored {name}"
    assert all(np.array_equal(a, b) for a, b in zip(topic_scores(items, labels, 0.05), whole[:2], strict=True))
