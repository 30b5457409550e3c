"""Implicit-feedback matrix factorisation (ALS, the `implicit` library) as a candidate source.

The user x item matrix holds each pair's summed interaction weight w (event x recency, see sources.base);
its confidence is
    linear:  c = 1 + alpha * w            log:  c = 1 + alpha * log(1 + w / log_epsilon)
(implicit multiplies the stored value by alpha; this module stores w or log(1 + w / epsilon)). A user's
score of item j is the dot product of their factors. Items with no interaction in the History and the
user's seen items are never returned; users with no history get nothing.
CPU by default and deterministic for a seed (each row's solve depends only on the other side's factors);
implicit's CUDA path is used when ``use_gpu`` and a GPU are there (not deterministic, and untested here).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from core.settings import CandidateSettings
from models.recommender.sources.base import History, Lists, empty_lists, item_counts, user_item_matrix

log = logging.getLogger(__name__)
_DEFAULTS = CandidateSettings()
_FILTERED = np.finfo(np.float32).min  # the score implicit gives the items it filters out


@dataclass(frozen=True)
class AlsParams:
    """Hyper-parameters of the factorisation (exposed as settings)."""

    factors: int = _DEFAULTS.als_factors
    regularization: float = _DEFAULTS.als_regularization
    alpha: float = _DEFAULTS.als_alpha
    confidence: str = _DEFAULTS.als_confidence
    log_epsilon: float = 1.0
    iterations: int = _DEFAULTS.als_iterations
    seed: int = _DEFAULTS.seed
    threads: int = 0
    use_gpu: bool = False
    score_chunk: int = 4096


def confidence_values(matrix: sp.csr_matrix, params: AlsParams) -> sp.csr_matrix:
    """Return the matrix whose values implicit scales by alpha: w (linear) or log(1 + w / epsilon) (log)."""
    if params.confidence not in ("linear", "log"):
        raise ValueError(f"confidence must be 'linear' or 'log', got {params.confidence!r}")
    out = matrix.copy()
    if params.confidence == "log":
        out.data = np.log1p(out.data / params.log_epsilon).astype(np.float32)
    return out


def _model(params: AlsParams) -> object:
    """Return an unfitted implicit ALS model on the GPU when asked for and present, else on the CPU."""
    import implicit.gpu  # imported here: the library prints a warning and probes CUDA on import

    if params.use_gpu and implicit.gpu.HAS_CUDA:
        from implicit.gpu.als import AlternatingLeastSquares as GpuAls

        return GpuAls(
            factors=params.factors,
            regularization=params.regularization,
            alpha=params.alpha,
            iterations=params.iterations,
            random_state=params.seed,
        )
    from implicit.cpu.als import AlternatingLeastSquares

    return AlternatingLeastSquares(
        factors=params.factors,
        regularization=params.regularization,
        alpha=params.alpha,
        iterations=params.iterations,
        random_state=params.seed,
        num_threads=params.threads,
        calculate_training_loss=False,
    )


class AlsSource:
    """Fitted ALS source: CPU factors, the seen matrix and the items it may return."""

    name = "als"

    def __init__(self, model: Any, seen: sp.csr_matrix, cold_items: np.ndarray, score_chunk: int) -> None:  # implicit's ALS
        self.model, self.seen, self.cold_items, self.score_chunk = model, seen, cold_items, score_chunk
        self.has_history = np.diff(seen.indptr) > 0

    def recommend(self, users: np.ndarray, n: int) -> dict[str, Lists]:
        """Return {als: each user's top-n unseen items by factor dot product}."""
        out = empty_lists(len(users), n)
        width = min(n, self.seen.shape[1] - len(self.cold_items))
        if width <= 0:  # no item has an interaction (a log held out whole): implicit cannot select zero columns
            return {self.name: out}
        for start in range(0, len(users), self.score_chunk):
            part = users[start : start + self.score_chunk]
            ids, scores = self.model.recommend(
                part,
                self.seen[part],
                N=width,
                filter_already_liked_items=True,
                filter_items=self.cold_items if len(self.cold_items) else None,
            )
            # implicit returns filtered (seen, cold) items at the tail with -FLT_MAX, a finite score: they are empty slots
            kept = np.isfinite(scores) & (scores > _FILTERED) & (ids >= 0)
            scores = np.where(kept, scores, -np.inf).astype(np.float32)
            out.rows[start : start + len(part), :width] = np.where(np.isfinite(scores), ids, -1)
            out.scores[start : start + len(part), :width] = scores
        out.rows[~self.has_history[users]] = -1
        out.scores[~self.has_history[users]] = -np.inf
        return {self.name: out}


def fit_als(history: History, params: AlsParams = AlsParams()) -> AlsSource:
    """Return the ALS source fitted on a History."""
    seen = user_item_matrix(history)
    import implicit.cpu.als  # noqa: F401  # loads the OpenBLAS implicit uses, so that the limit below covers it too

    with threadpool_limits(limits=1, user_api="blas"):  # implicit parallelises itself; BLAS threads would fight it
        model = _model(params)
        model.fit(confidence_values(seen, params), show_progress=False)  # type: ignore[attr-defined]
    if hasattr(model, "to_cpu"):
        model = model.to_cpu()
    cold = np.flatnonzero(item_counts(history) == 0).astype(np.int32)
    log.info(
        "ALS: %d factors, %d users x %d items, %d items without interactions",
        params.factors,
        history.n_users,
        history.n_items,
        len(cold),
    )
    return AlsSource(model, seen, cold, params.score_chunk)
