"""Zero-shot topics: cosine of item embeddings to embedded label descriptions, softmax over labels."""

from __future__ import annotations

import numpy as np
import torch


def probabilities(item_vectors: np.ndarray, label_vectors: np.ndarray, temperature: float) -> torch.Tensor:
    """Return softmax(cos(item, label_j) / temperature) over the labels j, one row per item (vectors unit-norm)."""
    items = torch.from_numpy(np.array(item_vectors, dtype=np.float32, copy=True)).reshape(-1, label_vectors.shape[1])
    labels = torch.from_numpy(np.array(label_vectors, dtype=np.float32, copy=True))
    with torch.inference_mode():
        return torch.softmax(items @ labels.T / temperature, dim=1)


def topic_scores(item_vectors: np.ndarray, label_vectors: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """Return (index of the best label, its softmax probability in [0, 1]) for each item."""
    best, index = probabilities(item_vectors, label_vectors, temperature).max(dim=1)
    return index.numpy().astype(np.int32), best.numpy().astype(np.float64)


def topic_decisions(
    item_vectors: np.ndarray, label_vectors: np.ndarray, temperature: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (best label index, its probability, its margin over the second best probability) for each item.

    The same probabilities as `topic_scores`; the margin (top-1 minus top-2, in [0, 1]) is how sure the decision is.
    """
    probs = probabilities(item_vectors, label_vectors, temperature)
    top = probs.topk(min(2, probs.shape[1]), dim=1)
    values, index = top.values.numpy().astype(np.float64), top.indices[:, 0].numpy().astype(np.int32)
    margin = values[:, 0] - values[:, 1] if values.shape[1] > 1 else np.ones(len(values))
    return index, values[:, 0], margin
