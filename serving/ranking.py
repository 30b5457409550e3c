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
from nightscore.errors import CacheUnavailable, ModelLoadError
from serving.config import MAX_N, ServingConfig
from storage.cache import CandidateCache
from storage.candidate_payload import decode_candidates

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
    """Feature tables of one version of the files, with the popular items derived from them."""

    index: FeatureIndex
    popular_ids: list[str]
    popular_scores: np.ndarray
    stamp: tuple[int, ...]


def _stamp(paths: list[Path]) -> tuple[int, ...]:
    """Return (mtime_ns, size) of each file: what changes when a file is replaced."""
    return tuple(v for p in paths for v in (p.stat().st_mtime_ns, p.stat().st_size))


def load_features(item_path: Path, user_path: Path | None) -> FeatureSnapshot:
    """Return the feature tables read from their Parquet files.

    Raises:
        ModelLoadError: a file is missing, unreadable or lacks a column.
    """
    paths = [item_path] + ([user_path] if user_path else [])
    try:
        stamp = _stamp(paths)
        items = pl.read_parquet(item_path, columns=list(ITEM_FEATURE_COLUMNS))
        empty = pl.DataFrame(schema={"user_id": pl.String, "topic": pl.String, "affinity": pl.Float64})
        users = pl.read_parquet(user_path, columns=list(AFFINITY_COLUMNS)) if user_path else empty
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise ModelLoadError(f"cannot load feature tables {[str(p) for p in paths]}: {exc}") from exc
    ids, scores = popular_items(items, MAX_N)
    return FeatureSnapshot(FeatureIndex(items, users), ids, scores, stamp)


class FeatureFiles:
    """The feature tables, reloaded when their files change (checked at most every refresh_s seconds)."""

    def __init__(self, item_path: Path, user_path: Path | None, refresh_s: float) -> None:
        self._paths = (item_path, user_path)
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        self._snapshot = load_features(item_path, user_path)
        self._checked = time.monotonic()
        if user_path is None:
            log.warning("no user features file: every topic affinity is 0 (the model was trained with them)")

    def current(self) -> FeatureSnapshot:
        """Return the newest loaded snapshot, reloading first when due and a file changed."""
        due = self._refresh_s > 0 and time.monotonic() - self._checked >= self._refresh_s
        if due and self._lock.acquire(blocking=False):  # one thread reloads; the others keep serving
            try:
                self._checked = time.monotonic()
                self._reload_if_changed()
            finally:
                self._lock.release()
        return self._snapshot

    def _reload_if_changed(self) -> None:
        """Swap in the files' new version; keep the old one (and log) when they cannot be read."""
        item_path, user_path = self._paths
        try:
            if _stamp([p for p in self._paths if p]) != self._snapshot.stamp:
                self._snapshot = load_features(item_path, user_path)
                log.info("reloaded feature tables (%d items)", self._snapshot.index.n_items)
        except (OSError, ModelLoadError) as exc:
            log.error("keeping the loaded feature tables: %s", exc)


class Recommender:
    """Ranks a user's cached candidates with the ranker; answers popular items when it cannot."""

    def __init__(self, cache: CandidateCache, model: RankerModel, features: FeatureFiles,
                 fallback_on_cache_error: bool = True, on_fallback: Callable[[str], None] = lambda reason: None) -> None:
        self.cache, self.model, self.features = cache, model, features
        self.fallback_on_cache_error = fallback_on_cache_error
        self._on_fallback = on_fallback

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
        scores = self.model.score(self.features.current().index.features(user_id, item_ids, retrieval))
        top = np.lexsort((np.arange(len(scores)), -scores))[:n]
        return Recommendation(user_id, [item_ids[i] for i in top], scores[top].tolist(), run_id, self.model.version)

    def popular(self, user_id: str, n: int, reason: str) -> Recommendation:
        """Return the n most popular items, marked as a fallback with its reason."""
        self._on_fallback(reason)
        snapshot = self.features.current()
        ids, scores = snapshot.popular_ids[:n], snapshot.popular_scores[:n].tolist()
        return Recommendation(user_id, ids, scores, None, None, POPULAR, reason)

    def warm_up(self) -> None:
        """Score a dummy batch once, so the first request does not pay for lazy initialisation."""
        self.model.score(np.zeros((WARM_UP_ROWS, len(self.model.feature_names)), dtype=np.float32))

    def ready(self) -> bool:
        """Return True when the cache answers (the model and features are loaded at construction)."""
        return self.cache.ping()


def build_recommender(config: ServingConfig, cache: CandidateCache, on_fallback: Callable[[str], None]) -> Recommender:
    """Return a warmed-up Recommender: ranker and feature tables loaded from the configured files.

    Raises:
        ModelLoadError: the model or a feature table cannot be loaded.
    """
    model = load_ranker(config.model_path)
    features = FeatureFiles(config.item_features_path, config.user_features_path, config.features_refresh_s)
    recommender = Recommender(cache, model, features, config.fallback_on_cache_error, on_fallback)
    recommender.warm_up()
    log.info("ranker %s ready with %d items' features", model.version, features.current().index.n_items)
    return recommender
