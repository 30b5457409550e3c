"""Zero-shot topics: cosine of item embeddings to embedded label descriptions, softmax over labels.

Every row is computed alone, in float64 and in a fixed order (numpy's einsum, not a BLAS GEMM): a GEMM's blocking
depends on how many rows it multiplies, and a row scored alone came out a few 1e-7 off the same row scored among 300.
Shards, resumed runs and Ray workers score different groups of rows, so one vector must always get one score.
"""

from __future__ import annotations

import numpy as np


def probabilities(item_vectors: np.ndarray, label_vectors: np.ndarray, temperature: float) -> np.ndarray:
    """Return softmax(cos(item, label_j) / temperature) over the labels j in float64, one row per item (vectors unit-norm)."""
    labels = np.asarray(label_vectors, dtype=np.float64)
    items = np.asarray(item_vectors, dtype=np.float64).reshape(-1, labels.shape[1])
    logits = np.einsum("ij,kj->ik", items, labels) / temperature
    logits -= logits.max(axis=1, keepdims=True)
    weights = np.exp(logits)
    return weights / weights.sum(axis=1, keepdims=True)


def topic_scores(item_vectors: np.ndarray, label_vectors: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """Return (index of the best label, its softmax probability in [0, 1]) for each item."""
    return best_labels(probabilities(item_vectors, label_vectors, temperature))


def best_labels(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (index of each row's most probable label, its probability)."""
    index = probs.argmax(axis=1).astype(np.int32)
    return index, probs[np.arange(len(probs)), index]


def topic_decisions(
    item_vectors: np.ndarray, label_vectors: np.ndarray, temperature: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (best label index, its probability, its margin over the second best probability) for each item.

    The same probabilities as `topic_scores`; the margin (top-1 minus top-2, in [0, 1]) is how sure the decision is.
    """
    probs = probabilities(item_vectors, label_vectors, temperature)
    index, best = best_labels(probs)
    if probs.shape[1] < 2:
        return index, best, np.ones(len(probs))
    return index, best, best - np.partition(probs, -2, axis=1)[:, -2]
