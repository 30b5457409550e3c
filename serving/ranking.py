"""Ranking apart from HTTP: a user's candidates through the cache pointer, scored by the ranker, top n kept."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from models.ranker import AFFINITY_COLUMNS, ITEM_FEATURE_COLUMNS, FeatureIndex, RankerModel, load_ranker, popular_items
from nightscore.errors import CacheUnavailable, ModelLoadError, NightscoreError
from serving.config import MAX_N, ServingConfig
from storage.artifacts import current_ranker, fetch_ranker, latest_features_run, read_features, scratch_dir
from storage.cache import CandidateCache
from storage.candidate_payload import decode_candidates
from storage.lake import Lake

log = logging.getLogger(__name__)

WARM_UP_ROWS = 100
POPULAR = "popular"


@dataclass(frozen=True)
class Recommendation:
    """One answer: items with scores, where they came from, and why it is a fallback if it is one."""

    user_id: str
    item_ids: list[str]
    scores: list[float]
    run_id: str | None
    model_version: str | None
    fallback: str | None = None
    reason: str | None = None

    def as_json(self) -> dict[str, object]:
        """Return the response body."""
        items = [{"item_id": i, "score": s} for i, s in zip(self.item_ids, self.scores, strict=True)]
        return {"user_id": self.user_id, "items": items, "run_id": self.run_id, "model_version": self.model_version,
                "fallback": self.fallback, "reason": self.reason}


@dataclass(frozen=True)
class FeatureSnapshot:
    """Feature tables of one published run, with the popular items derived from them."""

    run_id: str
    index: FeatureIndex
    popular_ids: list[str]
    popular_scores: np.ndarray


def load_features(lake: Lake, run_id: str) -> FeatureSnapshot:
    """Return a published run's feature tables, read from the lake.

    Raises:
        ModelLoadError: the run has no feature tables, or they cannot be read.
    """
    try:
        items, users = read_features(lake, run_id, list(ITEM_FEATURE_COLUMNS), list(AFFINITY_COLUMNS))
    except (NightscoreError, OSError) as exc:
        raise ModelLoadError(f"cannot load the feature tables of run {run_id}: {exc}") from exc
    ids, scores = popular_items(items, MAX_N)
    return FeatureSnapshot(run_id, FeatureIndex(items, users), ids, scores)


class FeatureStore:
    """The feature tables of the runs the cache pointer names, loaded once per run (the last two kept)."""

    def __init__(self, lake: Lake, first_run: str) -> None:
        self._lake = lake
        self._lock = threading.Lock()
        self._snapshots: dict[str, FeatureSnapshot] = {}
        self.latest = self._load(first_run)

    def for_run(self, run_id: str) -> FeatureSnapshot:
        """Return a run's features, loading them on first use; the latest loaded ones if the run has none."""
        with self._lock:
            if run_id in self._snapshots:
                return self._snapshots[run_id]
        try:
            return self._load(run_id)
        except ModelLoadError as exc:
            log.error("serving run %s with the features of run %s: %s", run_id, self.latest.run_id, exc)
            return self.latest

    def _load(self, run_id: str) -> FeatureSnapshot:
        snapshot = load_features(self._lake, run_id)
        with self._lock:
            self._snapshots[run_id] = snapshot
            for old in list(self._snapshots)[:-2]:
                del self._snapshots[old]
            self.latest = snapshot
        log.info("loaded the feature tables of run %s (%d items)", run_id, snapshot.index.n_items)
        return snapshot


class RankerFiles:
    """The lake's current ranker, reloaded when a newer one becomes current (checked at most every refresh_s)."""

    def __init__(self, lake: Lake, refresh_s: float) -> None:
        self._lake, self._refresh_s = lake, refresh_s
        self._lock = threading.Lock()
        self.model = self._load()
        self._checked = time.monotonic()

    def _load(self) -> RankerModel:
        version = current_ranker(self._lake)
        if version is None:
            raise ModelLoadError(f"no trained ranker in {self._lake.uri('models', 'ranker')}: run `nightscore run train-ranker`")
        with scratch_dir("nightscore-serving-") as local:
            try:
                return load_ranker(fetch_ranker(self._lake, version, Path(local)))
            except NightscoreError as exc:
                raise ModelLoadError(f"cannot load ranker {version}: {exc}") from exc

    def current(self) -> RankerModel:
        """Return the loaded ranker, swapping in the lake's current one first when due and changed."""
        due = self._refresh_s > 0 and time.monotonic() - self._checked >= self._refresh_s
        if due and self._lock.acquire(blocking=False):  # one thread reloads; the others keep serving
            try:
                self._checked = time.monotonic()
                if current_ranker(self._lake) != self.model.version:
                    self.model = self._load()
                    log.info("now serving ranker %s", self.model.version)
            except (OSError, NightscoreError) as exc:
                log.error("keeping ranker %s: %s", self.model.version, exc)
            finally:
                self._lock.release()
        return self.model


class Recommender:
    """Ranks a user's cached candidates with the ranker; answers popular items when it cannot."""

    def __init__(self, cache: CandidateCache, ranker: RankerFiles, features: FeatureStore,
                 fallback_on_cache_error: bool = True, on_fallback: Callable[[str], None] = lambda reason: None) -> None:
        self.cache, self.ranker, self.features = cache, ranker, features
        self.fallback_on_cache_error = fallback_on_cache_error
        self._on_fallback = on_fallback

    @property
    def model(self) -> RankerModel:
        """Return the ranker in use."""
        return self.ranker.current()

    def recommend(self, user_id: str, n: int) -> Recommendation:
        """Return the top n of the user's candidates of the current run, or popular items.

        Raises:
            CacheUnavailable: the cache is down and fallback_on_cache_error is off.
        """
        try:
            entry = self.cache.read(user_id)  # resolves the pointer on every request: switches apply at once
        except CacheUnavailable as exc:
            if not self.fallback_on_cache_error:
                raise
            log.warning("popular fallback: %s", exc)
            return self.popular(user_id, n, "cache_unavailable")
        if entry is None:
            return self.popular(user_id, n, "unknown_user")
        return self.rank(user_id, n, *entry)

    def rank(self, user_id: str, n: int, run_id: str, blob: bytes) -> Recommendation:
        """Return the top n of one run's candidate payload by model score (ties keep retrieval order)."""
        try:
            item_ids, retrieval = decode_candidates(blob)
        except ValueError as exc:
            log.error("popular fallback: bad payload of %s in run %s: %s", user_id, run_id, exc)
            return self.popular(user_id, n, "bad_payload")
        if not item_ids:
            return self.popular(user_id, n, "no_candidates")
        model = self.model
        scores = model.score(self.features.for_run(run_id).index.features(user_id, item_ids, retrieval))
        top = np.lexsort((np.arange(len(scores)), -scores))[:n]
        return Recommendation(user_id, [item_ids[i] for i in top], scores[top].tolist(), run_id, model.version)

    def popular(self, user_id: str, n: int, reason: str) -> Recommendation:
        """Return the n most popular items of the latest loaded run, marked as a fallback with its reason."""
        self._on_fallback(reason)
        snapshot = self.features.latest
        ids, scores = snapshot.popular_ids[:n], snapshot.popular_scores[:n].tolist()
        return Recommendation(user_id, ids, scores, None, None, POPULAR, reason)

    def warm_up(self) -> None:
        """Score a dummy batch once, so the first request does not pay for lazy initialisation."""
        self.model.score(np.zeros((WARM_UP_ROWS, len(self.model.feature_names)), dtype=np.float32))

    def ready(self) -> bool:
        """Return True when the cache answers (the model and features are loaded at construction)."""
        return self.cache.ping()


def first_run(cache: CandidateCache, lake: Lake) -> str:
    """Return the run whose features the service starts with: the cache's current one, else the lake's latest.

    Raises:
        ModelLoadError: no run was ever published.
    """
    try:
        current = cache.current()
    except CacheUnavailable:
        current = None
    latest = current or latest_features_run(lake)
    if latest is None:
        raise ModelLoadError("no published run to serve: run the nightly flow first")
    return latest


def build_recommender(config: ServingConfig, cache: CandidateCache, on_fallback: Callable[[str], None]) -> Recommender:
    """Return a warmed-up Recommender: the lake's current ranker and the current run's feature tables.

    Raises:
        ModelLoadError: no ranker, or no feature tables of a published run.
    """
    lake = Lake(config.lake_root, config.lake_options)
    ranker = RankerFiles(lake, config.model_refresh_s)
    features = FeatureStore(lake, first_run(cache, lake))
    recommender = Recommender(cache, ranker, features, config.fallback, on_fallback)
    recommender.warm_up()
    log.info("ranker %s ready with %d items' features", ranker.model.version, features.latest.index.n_items)
    return recommender
