"""Ranking apart from HTTP: a user's cache entry through the cache pointer, scored by the run's ranker, top n kept.

Each published run serves with its own ranker (``serving/<run_id>/serving.json`` in the lake names the version, the
feature set of its entries and its trending items), so a pointer switch or a rollback changes candidates and ranker
together. A cache entry carries the candidates' feature rows: the service only scores them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from models.ranker_models import Scorer, scorer_from_bytes
from nightscore.errors import CacheUnavailable, ModelLoadError, NightscoreError
from serving.config import ServingConfig
from storage.artifacts import latest_serving_run, read_scorer_bytes, read_serving
from storage.cache import CandidateCache
from storage.candidate_payload import CandidateEntry, decode_entry
from storage.lake import Lake

log = logging.getLogger(__name__)

POPULAR = "popular"
RUNS_KEPT = 2  # the current run and the one before (a rollback target)


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
class RunServing:
    """What one published run serves with: its ranker, the feature set of its entries, its trending items."""

    run_id: str
    scorer: Scorer | None
    version: str | None
    feature_set: str | None
    fallback_ids: list[str]
    fallback_scores: list[float]
    loaded_at: float


def load_run(lake: Lake, run_id: str) -> RunServing:
    """Return a published run's serving artifacts, read from the lake.

    Raises:
        ModelLoadError: the run has no serving.json, or its ranker cannot be read.
    """
    try:
        serving = read_serving(lake, run_id)
        if serving is None:
            raise ModelLoadError(f"run {run_id} has no serving.json in the lake")
        version = serving.get("ranker_version")
        scorer = scorer_from_bytes(*read_scorer_bytes(lake, version)) if version else None
    except (NightscoreError, OSError) as exc:
        raise ModelLoadError(f"cannot load what run {run_id} serves with: {exc}") from exc
    return RunServing(run_id, scorer, version, serving.get("feature_set"), list(serving.get("fallback_items") or []),
                      [float(v) for v in serving.get("fallback_scores") or []], time.monotonic())


class RunStore:
    """The serving artifacts of the runs the cache pointer names, loaded once per run and re-read every refresh_s."""

    def __init__(self, lake: Lake, first_run: str, refresh_s: float) -> None:
        self._lake, self._refresh_s = lake, refresh_s
        self._lock = threading.Lock()
        self._runs: dict[str, RunServing] = {}
        self.latest = self._load(first_run)

    def for_run(self, run_id: str) -> RunServing:
        """Return a run's artifacts (re-read when stale: train-ranker may rebind its ranker); the latest if it has none."""
        with self._lock:
            known = self._runs.get(run_id)
        if known is not None and (self._refresh_s <= 0 or time.monotonic() - known.loaded_at < self._refresh_s):
            return known
        try:
            return self._load(run_id)
        except ModelLoadError as exc:
            log.error("serving run %s with what run %s serves with: %s", run_id, (known or self.latest).run_id, exc)
            return known or self.latest

    def _load(self, run_id: str) -> RunServing:
        run = load_run(self._lake, run_id)
        with self._lock:
            self._runs[run_id] = run
            for old in list(self._runs)[:-RUNS_KEPT]:
                del self._runs[old]
            self.latest = run
        return run


class Recommender:
    """Ranks a user's cached candidates with the run's ranker; answers the run's trending items when it cannot."""

    def __init__(self, cache: CandidateCache, runs: RunStore, fallback_on_cache_error: bool = True,
                 on_fallback: Callable[[str], None] = lambda reason: None) -> None:
        self.cache, self.runs = cache, runs
        self.fallback_on_cache_error = fallback_on_cache_error
        self._on_fallback = on_fallback

    @property
    def model_version(self) -> str | None:
        """Return the version of the ranker of the latest run loaded."""
        return self.runs.latest.version

    def recommend(self, user_id: str, n: int) -> Recommendation:
        """Return the top n of the user's candidates of the current run, or popular items.

        Raises:
            CacheUnavailable: the cache is down and fallback_on_cache_error is off.
        """
        try:
            found = self.cache.read(user_id)  # pointer and entry of one run: a switch applies at once
        except CacheUnavailable as exc:
            if not self.fallback_on_cache_error:
                raise
            log.warning("popular fallback: %s", exc)
            return self.popular(user_id, n, "cache_unavailable", self.runs.latest)
        if found is None:
            run_id = self._current()
            return self.popular(user_id, n, "unknown_user", self.runs.for_run(run_id) if run_id else self.runs.latest)
        return self.rank(user_id, n, *found)

    def _current(self) -> str | None:
        try:
            return self.cache.current()
        except CacheUnavailable:
            return None

    def rank(self, user_id: str, n: int, run_id: str, blob: bytes) -> Recommendation:
        """Return the top n of one run's cache entry by its ranker's score (ties keep the candidates' order)."""
        run = self.runs.for_run(run_id)
        try:
            entry = decode_entry(blob)
        except ValueError as exc:
            log.error("popular fallback: bad payload of %s in run %s: %s", user_id, run_id, exc)
            return self.popular(user_id, n, "bad_payload", run)
        if not entry.item_ids:
            return self.popular(user_id, n, "no_candidates", run)
        scores = self.scores(run, entry)
        top = np.lexsort((np.arange(len(scores)), -scores))[:n]
        return Recommendation(user_id, [entry.item_ids[i] for i in top], scores[top].tolist(), run_id, run.version)

    def scores(self, run: RunServing, entry: CandidateEntry) -> np.ndarray:
        """Return the ranker's scores of an entry's candidates (their own order, descending, without a usable ranker)."""
        if run.scorer is None or entry.feature_set != run.feature_set:
            if run.scorer is not None:
                log.error("run %s: entry feature set %s is not its ranker's %s", run.run_id, entry.feature_set, run.feature_set)
            return -np.arange(len(entry.item_ids), dtype=np.float32)
        return run.scorer.predict(entry.features)

    def popular(self, user_id: str, n: int, reason: str, run: RunServing) -> Recommendation:
        """Return a run's n trending items, marked as a fallback with its reason."""
        self._on_fallback(reason)
        return Recommendation(user_id, run.fallback_ids[:n], run.fallback_scores[:n], None, None, POPULAR, reason)

    def warm_up(self) -> None:
        """Score a dummy batch once, so the first request does not pay for lazy initialisation."""
        scorer = self.runs.latest.scorer
        if scorer is not None:
            scorer.predict(np.zeros((8, len(scorer.feature_names)), dtype=np.float32))

    def ready(self) -> bool:
        """Return True when the cache answers (the ranker is loaded at construction)."""
        return self.cache.ping()


def first_run(cache: CandidateCache, lake: Lake) -> str:
    """Return the run the service starts with: the cache's current one, else the lake's latest published one.

    Raises:
        ModelLoadError: no run was ever published.
    """
    try:
        current = cache.current()
    except CacheUnavailable:
        current = None
    latest = current or latest_serving_run(lake)
    if latest is None:
        raise ModelLoadError("no published run to serve: run the nightly flow first")
    return latest


def build_recommender(config: ServingConfig, cache: CandidateCache, on_fallback: Callable[[str], None]) -> Recommender:
    """Return a warmed-up Recommender over the current run's ranker and trending items.

    Raises:
        ModelLoadError: no published run, or its serving artifacts cannot be loaded.
    """
    lake = Lake(config.lake_root, config.lake_options)
    runs = RunStore(lake, first_run(cache, lake), config.model_refresh_s)
    recommender = Recommender(cache, runs, config.fallback, on_fallback)
    recommender.warm_up()
    log.info("serving run %s with ranker %s", runs.latest.run_id, runs.latest.version)
    return recommender
