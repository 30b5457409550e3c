"""Training the stage-two ranker on fused candidates, and choosing between LightGBM LambdaRank and the MLP.

Rows: every filled slot of the fused candidates of the users of a split, with candidate_features; label 1
when the (user, item) pair is relevant in that split (a held-out item the user had not seen). Both kinds
train on the same rows; a share of the users (by a seeded permutation) is kept aside for LightGBM's early
stopping. The MLP is models.ranker's RankerNet (pointwise binary cross-entropy, standardised features),
exported to numpy. rerank orders each user's candidates by model score (ties: the fused order), and the
kind with the better NDCG@10 on another split is the one to publish (choose_scorer), when it beats the fused
order itself there (models/recommender/candidate_stage.py).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from core.settings import CandidateSettings
from models.recommender.evaluation import Split
from models.recommender.ranker_models import LgbmScorer, MlpScorer, Scorer, lgbm_from_booster, mlp_from_net
from models.recommender.ranker_net import TrainConfig, fit_net

log = logging.getLogger(__name__)


_DEFAULTS = CandidateSettings()


@dataclass(frozen=True)
class RankerParams:
    """Hyper-parameters of both kinds."""

    rounds: int = _DEFAULTS.ranker_rounds
    learning_rate: float = _DEFAULTS.ranker_learning_rate
    leaves: int = _DEFAULTS.ranker_leaves
    min_data_in_leaf: int = 20
    early_stopping_rounds: int = 30
    stopping_share: float = 0.2
    mlp: TrainConfig = TrainConfig(hidden=32, epochs=8, batch_size=1024, learning_rate=5e-3)
    threads: int = 0  # 0: one per ROWS_PER_THREAD training rows, at most one per core (training_threads)
    seed: int = _DEFAULTS.seed


# LightGBM's guidance: no more threads than the data can use ("do not use 64 threads for a dataset with 10,000 rows").
# Below that its per-round thread wake-ups cost more than they share: on 2 cores, 5,000 rows trained in 0.061 s on
# one thread against 0.043 s on two, but 0.27 s on two where OpenMP threads sleep between rounds (OMP_WAIT_POLICY=PASSIVE).
ROWS_PER_THREAD = 10_000


@dataclass(frozen=True)
class Rows:
    """Labelled training rows: features, labels, and each row's user (rows grouped by user, in order)."""

    x: np.ndarray
    y: np.ndarray
    user: np.ndarray


def labelled_rows(fused_rows: np.ndarray, users: np.ndarray, features: np.ndarray, split: Split) -> Rows:
    """Return the filled slots' features with labels from split's relevant pairs."""
    filled = fused_rows >= 0
    n_items = int(max(fused_rows.max(initial=0), split.relevant_items.max(initial=0))) + 1
    keys = users.astype(np.int64)[:, None] * n_items + fused_rows
    relevant = split.relevant_users.astype(np.int64) * n_items + split.relevant_items
    labels = np.isin(keys, relevant) & filled
    user = np.broadcast_to(users[:, None], fused_rows.shape)
    return Rows(features[filled], labels[filled].astype(np.int32), user[filled])


def _stopping_mask(rows: Rows, share: float, seed: int) -> np.ndarray:
    """Return a mask of the rows whose user is among a seeded share of the users (kept for early stopping)."""
    users = np.unique(rows.user)
    held = np.random.default_rng(seed).permutation(users)[: round(len(users) * share)]
    return np.isin(rows.user, held)


def _group_sizes(user: np.ndarray) -> np.ndarray:
    return np.diff(np.r_[np.flatnonzero(np.r_[True, user[1:] != user[:-1]]), len(user)])


def training_threads(asked: int, rows: int) -> int:
    """Return LightGBM's thread count: the one asked for, else one per ROWS_PER_THREAD rows up to the cores."""
    if asked > 0:
        return asked
    return max(1, min(os.cpu_count() or 1, rows // ROWS_PER_THREAD))


def train_lambdarank(rows: Rows, names: tuple[str, ...], params: RankerParams = RankerParams()) -> LgbmScorer:
    """Return a LightGBM LambdaRank scorer (deterministic for a seed and thread count)."""
    import lightgbm

    stop = _stopping_mask(rows, params.stopping_share, params.seed)
    config = {
        "objective": "lambdarank",
        "metric": "ndcg",
        "eval_at": [10],
        "learning_rate": params.learning_rate,
        "num_leaves": params.leaves,
        "min_data_in_leaf": params.min_data_in_leaf,
        "deterministic": True,
        "force_col_wise": True,
        "num_threads": training_threads(params.threads, int((~stop).sum())),
        "seed": params.seed,
        "verbosity": -1,
    }
    train = lightgbm.Dataset(
        rows.x[~stop], rows.y[~stop], group=_group_sizes(rows.user[~stop]), feature_name=list(names), free_raw_data=True
    )
    sets = [lightgbm.Dataset(rows.x[stop], rows.y[stop], group=_group_sizes(rows.user[stop]), reference=train)]
    callbacks: list[Any] = [lightgbm.early_stopping(params.early_stopping_rounds, verbose=False)] if stop.any() else []
    booster = lightgbm.train(config, train, params.rounds, valid_sets=sets if stop.any() else [], callbacks=callbacks)
    return lgbm_from_booster(booster, names)


def train_mlp(rows: Rows, names: tuple[str, ...], params: RankerParams = RankerParams()) -> MlpScorer:
    """Return today's MLP (RankerNet, binary cross-entropy) trained on the rows, as a numpy scorer."""
    net = fit_net(rows.x.astype(np.float32), rows.y.astype(np.float32), replace(params.mlp, seed=params.seed))
    return mlp_from_net(net, names)


def rerank(fused_rows: np.ndarray, features: np.ndarray, scorer: Scorer) -> np.ndarray:
    """Return each user's fused candidates reordered by model score (ties and empty slots keep fused order)."""
    filled = fused_rows >= 0
    scores = np.full(fused_rows.shape, -np.inf, dtype=np.float64)
    if filled.any():
        scores[filled] = scorer.predict(features[filled])
    slot = np.broadcast_to(np.arange(fused_rows.shape[1]), fused_rows.shape)
    order = np.lexsort((slot, -scores), axis=1)
    return np.take_along_axis(fused_rows, order, axis=1)


def choose_scorer(ndcg: dict[str, float]) -> str:
    """Return the kind with the highest NDCG@10 (ties: lightgbm, the first in name order)."""
    return sorted(ndcg, key=lambda kind: (-ndcg[kind], kind))[0]
