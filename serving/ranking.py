"""Ranking apart from HTTP: a user's cache entry through the cache pointer, scored by the run's ranker, top n kept.

Async end to end: one cache read per request (storage/cache_async.py), the rows scored by serving/batcher.py;
the only thread hop is loading a run's artifacts from the lake (once per run, and a background refresh).

Each published run serves with its own ranker (``serving/<run_id>/serving.json`` in the lake names the version, the
feature set of its entries and its trending items), so a pointer switch or a rollback changes candidates and ranker
together. A cache entry carries the candidates' feature rows: the service only scores them. With ``cooc_boost`` on,
the run's co-visitation neighbours (loaded once per run) lift the candidates that co-occur with the user's fresh
events (serving/boost.py). The run's catalogue (``items.parquet``, held as hashes) says which items events may name.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from core.errors import CacheUnavailable, ModelLoadError, NightscoreError
from models.recommender.ranker_models import Scorer, scorer_from_bytes
from serving.batcher import Scoring
from serving.boost import Neighbours, boost_scores, neighbours_from_frame
from serving.breaker import Breaker
from serving.config import ServingConfig
from storage.artifacts import latest_serving_run, read_items, read_neighbours, read_scorer_bytes, read_serving
from storage.cache import CandidateCache
from storage.cache_async import CacheReader, Found
from storage.candidate_payload import CandidateEntry, decode_entry
from storage.lake import Lake
from storage.resources import lake_for

log = logging.getLogger(__name__)

POPULAR = "popular"
CACHE_OK, CACHE_DOWN, NO_VERSION = "ok", "unavailable", "no_candidates_version"  # readiness's cache states
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
        return {
            "user_id": self.user_id,
            "items": items,
            "run_id": self.run_id,
            "model_version": self.model_version,
            "fallback": self.fallback,
            "reason": self.reason,
        }


def first_kept(order: np.ndarray, item_ids: list[str], excluded: set[str], n: int) -> list[int]:
    """Return the first n positions of order whose item is not excluded (a walk that stops at the n-th kept one)."""
    if not excluded:
        return order[:n].tolist()
    kept: list[int] = []
    for i in order.tolist():
        if item_ids[i] not in excluded:
            kept.append(i)
            if len(kept) == n:
                break
    return kept


class ItemSet:
    """A run's catalogue as the sorted 64-bit hashes of its item ids (8 bytes an item; this process's str hash)."""

    def __init__(self, item_ids: Iterable[str]) -> None:
        self._hashes = np.unique(np.fromiter((hash(i) for i in item_ids), dtype=np.int64))

    def __len__(self) -> int:
        return len(self._hashes)

    def __contains__(self, item_id: object) -> bool:
        at = int(np.searchsorted(self._hashes, hash(item_id)))
        return at < len(self._hashes) and int(self._hashes[at]) == hash(item_id)  # a false hit: about n / 2**64


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
    computed_at: float = 0.0  # epoch s of the latest interaction the run read: events from then on are new to it
    neighbours: Neighbours | None = None  # loaded only when boosting, and when the run published them
    neighbours_path: str | None = None
    items: ItemSet | None = None  # the run's catalogue; None: the run published none (every item accepted)
    items_path: str | None = None


def load_neighbours(lake: Lake, run_id: str, path: str | None, known: dict[str, Neighbours]) -> Neighbours | None:
    """Return a run's neighbours (known ones are not re-read); None without them, or when unreadable (logged)."""
    if path is None or path in known:
        return known.get(path or "")
    try:
        neighbours = neighbours_from_frame(read_neighbours(lake, path))
    except (NightscoreError, OSError) as exc:
        log.error("run %s serves without its co-visitation boost: %s", run_id, exc)
        return None
    log.info("run %s: %d co-visitation neighbour pairs loaded", run_id, neighbours.size)
    return neighbours


def load_items(lake: Lake, run_id: str, path: str | None, known: dict[str, ItemSet]) -> ItemSet | None:
    """Return a run's catalogue (known ones are not re-read); None without one, or when unreadable (logged)."""
    if path is None or path in known:
        return known.get(path or "")
    try:
        items = ItemSet(read_items(lake, path))
    except (NightscoreError, OSError) as exc:
        log.error("run %s: catalogue unreadable, events of any item are accepted: %s", run_id, exc)
        return None
    log.info("run %s: %d catalogue items loaded", run_id, len(items))
    return items


def load_run(
    lake: Lake,
    run_id: str,
    scorers: dict[str, Scorer] | None = None,
    neighbours: dict[str, Neighbours] | None = None,
    items: dict[str, ItemSet] | None = None,
) -> RunServing:
    """Return a published run's serving artifacts, read from the lake (a ranker version in scorers is not re-read).

    Neighbours are loaded only when ``neighbours`` is given (the boost is on); those in it, by path, are not re-read;
    nor are catalogues in ``items``.

    Raises:
        ModelLoadError: the run has no serving.json, or its ranker cannot be read.
    """
    try:
        serving = read_serving(lake, run_id)
        if serving is None:
            raise ModelLoadError(f"run {run_id} has no serving.json in the lake")
        version = serving.get("ranker_version")
        known = (scorers or {}).get(version or "")
        scorer = known or (scorer_from_bytes(*read_scorer_bytes(lake, version)) if version else None)
    except (NightscoreError, OSError) as exc:
        raise ModelLoadError(f"cannot load what run {run_id} serves with: {exc}") from exc
    computed, path, items_path = serving.get("computed_at"), serving.get("neighbours"), serving.get("items")
    return RunServing(
        run_id,
        scorer,
        version,
        serving.get("feature_set"),
        list(serving.get("fallback_items") or []),
        [float(v) for v in serving.get("fallback_scores") or []],
        time.monotonic(),
        datetime.fromisoformat(computed).timestamp() if computed else 0.0,
        None if neighbours is None else load_neighbours(lake, run_id, path, neighbours),
        path,
        load_items(lake, run_id, items_path, items or {}),
        items_path,
    )


class RunStore:
    """The serving artifacts of the runs the cache pointer names, loaded once per run and refreshed in the background."""

    def __init__(self, lake: Lake, first_run: str, refresh_s: float, with_neighbours: bool = False) -> None:
        self._lake, self._refresh_s, self._with_neighbours = lake, refresh_s, with_neighbours
        self._lock = threading.Lock()  # _load also runs in worker threads
        self._runs: dict[str, RunServing] = {}
        self._refreshing: set[str] = set()
        self.latest = self._load(first_run)

    async def for_run(self, run_id: str) -> RunServing:
        """Return a run's artifacts; a stale one is returned at once and re-read in a thread (train-ranker may rebind)."""
        known = self._runs.get(run_id)
        if known is None:
            return await asyncio.to_thread(self._load_or_keep, run_id, self.latest)
        if self._refresh_s > 0 and time.monotonic() - known.loaded_at >= self._refresh_s and run_id not in self._refreshing:
            self._refreshing.add(run_id)
            task = asyncio.get_running_loop().run_in_executor(None, self._load_or_keep, run_id, known)
            task.add_done_callback(lambda _: self._refreshing.discard(run_id))
        return known

    def _load_or_keep(self, run_id: str, keep: RunServing) -> RunServing:
        """Return the run's artifacts read now, or keep when they cannot be read (logged)."""
        try:
            return self._load(run_id)
        except ModelLoadError as exc:
            log.error("serving run %s with what run %s serves with: %s", run_id, keep.run_id, exc)
            return keep

    def _load(self, run_id: str) -> RunServing:
        with self._lock:  # a refresh re-reads serving.json only: rebuilding a booster would hold the GIL for ms
            scorers = {r.version: r.scorer for r in self._runs.values() if r.version and r.scorer is not None}
            known = {r.neighbours_path: r.neighbours for r in self._runs.values() if r.neighbours_path and r.neighbours}
            items = {r.items_path: r.items for r in self._runs.values() if r.items_path and r.items is not None}
        run = load_run(self._lake, run_id, scorers, known if self._with_neighbours else None, items)
        with self._lock:
            self._runs[run_id] = run
            for old in list(self._runs)[:-RUNS_KEPT]:
                del self._runs[old]
            self.latest = run
        return run


class Recommender:
    """Ranks a user's cached candidates with the run's ranker; answers the run's trending items when it cannot."""

    def __init__(
        self,
        runs: RunStore,
        scoring: Scoring,
        fallback_on_cache_error: bool = True,
        on_fallback: Callable[[str], None] = lambda reason: None,
        exclude_recent: bool = True,
        breaker_open_s: float = 1.0,
        cooc_boost: float = 0.0,
    ) -> None:
        self.runs, self.scoring, self.exclude_recent, self.cooc_boost = runs, scoring, exclude_recent, cooc_boost
        self.reader: CacheReader | None = None  # opened in the worker's event loop (serving.app's lifespan)
        self.breaker = Breaker(breaker_open_s)
        self.fallback_on_cache_error = fallback_on_cache_error
        self._on_fallback = on_fallback

    @property
    def model_version(self) -> str | None:
        """Return the version of the ranker of the latest run loaded."""
        return self.runs.latest.version

    async def recommend(self, user_id: str, n: int) -> Recommendation:
        """Return the top n of the user's candidates of the current run, or popular items.

        Raises:
            CacheUnavailable: the cache is down and fallback_on_cache_error is off.
        """
        try:
            found = await self._read(user_id)
        except CacheUnavailable as exc:
            if not self.fallback_on_cache_error:
                raise
            log.warning("popular fallback: %s", exc)
            return self.popular(user_id, n, "cache_unavailable", self.runs.latest)
        if found.run_id is None:
            return self.popular(user_id, n, "no_candidates_version", self.runs.latest)
        run = await self.runs.for_run(found.run_id)
        if found.entry is None:
            return self.popular(user_id, n, "unknown_user", run)
        return await self.rank(user_id, n, run, found)

    async def _read(self, user_id: str) -> Found:
        """Return the user's read through the circuit breaker (pointer and entry of one run: a switch applies at once).

        Raises:
            CacheUnavailable: the cache failed, or failed recently (the circuit is open).
        """
        if self.reader is None or not self.breaker.allow():
            raise CacheUnavailable("candidate cache skipped: it failed recently (circuit open) or is not open yet")
        try:
            with self.scoring.arriving():
                found = await self.reader.read(user_id)
        except CacheUnavailable:
            self.breaker.failed()
            raise
        self.breaker.succeeded()
        return found

    async def rank(self, user_id: str, n: int, run: RunServing, found: Found) -> Recommendation:
        """Return the top n of one run's cache entry by its ranker's score (ties keep the candidates' order)."""
        try:
            entry = decode_entry(found.entry or b"")
        except ValueError as exc:
            log.error("popular fallback: bad payload of %s in run %s: %s", user_id, run.run_id, exc)
            return self.popular(user_id, n, "bad_payload", run)
        if not entry.item_ids:
            return self.popular(user_id, n, "no_candidates", run)
        fresh = self._fresh(found, run)
        scores = self._boosted(await self.scores(run, entry), run, entry, fresh)
        order = np.argsort(-scores, kind="stable")  # stable: ties keep the candidates' order
        top = first_kept(order, entry.item_ids, fresh if self.exclude_recent else set(), n)
        return Recommendation(user_id, [entry.item_ids[i] for i in top], scores[top].tolist(), run.run_id, run.version)

    @staticmethod
    def _fresh(found: Found, run: RunServing) -> set[str]:
        """Return the items the user interacted with after the run's candidates were computed."""
        return {item for item, ts in found.recent.items() if ts >= run.computed_at}

    def _boosted(self, scores: np.ndarray, run: RunServing, entry: CandidateEntry, fresh: set[str]) -> np.ndarray:
        """Return the scores plus cooc_boost x each candidate's co-visitation with the fresh items (as is when off)."""
        if self.cooc_boost <= 0 or run.neighbours is None or not fresh:
            return scores
        return scores + np.float32(self.cooc_boost) * boost_scores(run.neighbours, fresh, entry.item_ids)

    async def scores(self, run: RunServing, entry: CandidateEntry) -> np.ndarray:
        """Return the ranker's scores of an entry's candidates (their own order, descending, without a usable ranker)."""
        if run.scorer is None or entry.feature_set != run.feature_set:
            if run.scorer is not None:
                log.error("run %s: entry feature set %s is not its ranker's %s", run.run_id, entry.feature_set, run.feature_set)
            return -np.arange(len(entry.item_ids), dtype=np.float32)
        return await self.scoring.score(run.scorer, entry.features)

    def popular(self, user_id: str, n: int, reason: str, run: RunServing) -> Recommendation:
        """Return a run's n trending items, marked as a fallback with its reason."""
        self._on_fallback(reason)
        return Recommendation(user_id, run.fallback_ids[:n], run.fallback_scores[:n], None, None, POPULAR, reason)

    async def warm_up(self) -> None:
        """Score a dummy batch through the scoring path, so the first request does not pay for lazy initialisation."""
        scorer = self.runs.latest.scorer
        if scorer is not None:
            await self.scoring.score(scorer, np.zeros((8, len(scorer.feature_names)), dtype=np.float32))

    async def serving_run(self) -> RunServing:
        """Return the run the cache serves now (the latest loaded one when the cache does not answer or names none)."""
        try:
            current = await self.reader.current() if self.reader is not None else None
        except CacheUnavailable:
            current = None
        return await self.runs.for_run(current) if current else self.runs.latest

    async def cache_state(self) -> str:
        """Return the cache's state now: ok, unavailable, or no_candidates_version (it answers but serves no run)."""
        if self.reader is None:
            return CACHE_DOWN
        try:
            current = await self.reader.current()
        except CacheUnavailable:
            return CACHE_DOWN
        self.breaker.succeeded()  # it answers: close the circuit
        return CACHE_OK if current is not None else NO_VERSION

    def can_answer(self, cache_state: str) -> bool:
        """Return True when requests get answers: the cache serves a run, or the fallback covers it (degraded)."""
        return cache_state == CACHE_OK or self.fallback_on_cache_error


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


def build_recommender(
    config: ServingConfig, cache: CandidateCache, scoring: Scoring, on_fallback: Callable[[str], None]
) -> Recommender:
    """Return a Recommender over the current run's ranker and trending items (its reader is opened at startup).

    Raises:
        ModelLoadError: no published run, or its serving artifacts cannot be loaded.
    """
    lake, options = lake_for(config.settings), config.options
    runs = RunStore(lake, first_run(cache, lake), options.model_refresh_s, options.cooc_boost > 0)
    log.info("serving run %s with ranker %s", runs.latest.run_id, runs.latest.version)
    return Recommender(
        runs, scoring, options.fallback, on_fallback, options.exclude_recent, options.breaker_open_s, options.cooc_boost
    )
