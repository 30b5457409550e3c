"""Pooling and normalisation of hidden states: shared by every backend, always computed in float32."""

from __future__ import annotations

import numpy as np
import torch


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Return the mean of hidden states over positions where mask is 1."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


def max_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Return the element-wise max of hidden states over real positions (padding never wins)."""
    padded = mask.unsqueeze(-1) == 0
    return hidden.masked_fill(padded, torch.finfo(hidden.dtype).min).amax(dim=1)


def pool(hidden: torch.Tensor | np.ndarray, mask: torch.Tensor | np.ndarray, mode: str, normalize: bool) -> np.ndarray:
    """Return float32 sentence vectors of one batch: pooled by mode (mean, cls, max), then L2-normalised if asked.

    Hidden states that come back as numpy (OpenVINO) are pooled in numpy: a torch op between two OpenVINO
    calls wakes torch's OpenMP threads, whose spinning then competes with OpenVINO's for the same cores.
    """
    if isinstance(hidden, np.ndarray):
        return pool_numpy(hidden, np.asarray(mask), mode, normalize)
    return pool_tensor(hidden, torch.as_tensor(mask), mode, normalize).cpu().numpy().astype(np.float32, copy=False)


def pool_tensor(hidden: torch.Tensor, mask: torch.Tensor, mode: str, normalize: bool) -> torch.Tensor:
    """Return float32 sentence vectors [rows, width] of one padded batch, on the hidden states' device."""
    states = hidden.float()
    weights = torch.as_tensor(mask).to(states.device)
    if weights.shape[1] != states.shape[1]:  # a backend that trims trailing padding returns fewer positions
        weights = weights[:, : states.shape[1]]
    if mode == "mean":
        vectors = mean_pool(states, weights)
    elif mode == "cls":
        vectors = states[:, 0]
    elif mode == "max":
        vectors = max_pool(states, weights)
    else:
        raise ValueError(f"unknown pooling mode {mode!r}")
    if normalize:
        vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
    return vectors


def pool_packed(
    hidden: torch.Tensor, segments: torch.Tensor, offsets: torch.Tensor, rows: int, mode: str, normalize: bool
) -> torch.Tensor:
    """Return float32 sentence vectors [rows, width] of one packed batch (hidden [tokens, width]), on its device.

    Mean pooling is one segment-sum (index_add_ by each token's row) over the row lengths: no padding to mask.
    """
    states = hidden.float()
    index = segments.long()
    if mode == "mean":
        lengths = (offsets[1:] - offsets[:-1]).to(states.dtype).clamp(min=1)
        vectors = states.new_zeros(rows, states.shape[1]).index_add_(0, index, states) / lengths[:, None]
    elif mode == "cls":
        vectors = states[offsets[:-1].long()]
    elif mode == "max":
        spread = index[:, None].expand_as(states)
        vectors = states.new_empty(rows, states.shape[1]).scatter_reduce_(0, spread, states, "amax", include_self=False)
    else:
        raise ValueError(f"unknown pooling mode {mode!r}")
    if normalize:
        vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
    return vectors


def pool_numpy(hidden: np.ndarray, mask: np.ndarray, mode: str, normalize: bool) -> np.ndarray:
    """Return the same vectors as `pool` for numpy hidden states, computed in numpy float32."""
    states = hidden.astype(np.float32, copy=False)
    weights = mask[:, : states.shape[1]].astype(np.float32)
    if mode == "mean":
        vectors = np.einsum("bld,bl->bd", states, weights) / np.maximum(weights.sum(axis=1, keepdims=True), 1e-9)
    elif mode == "cls":
        vectors = states[:, 0].copy()
    elif mode == "max":
        vectors = np.where(weights[:, :, None] > 0, states, np.finfo(np.float32).min).max(axis=1)
    else:
        raise ValueError(f"unknown pooling mode {mode!r}")
    if normalize:
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return vectors.astype(np.float32, copy=False)
