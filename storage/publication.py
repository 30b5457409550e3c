"""The published run across two adapters: the warehouse's latest run and the cache pointers, moved together.

Every function here keeps one rule: after it returns (or raises), the cache's current pointer names the
warehouse's latest published run (none when nothing is published) whenever the cache holds that run's version,
and the previous pointer never names a version a failed publication left behind.

A publication's cache switch happens inside its warehouse transaction (`switch_in_transaction`), only when the
run becomes the latest (an older run_date does not move the pointer backwards). Each failure point undoes it:
before the warehouse commit with `unstage_cache`, after it with `retract`; both restore the pointers exactly as
they were before the switch (`Pointers`), and drop the failed run's version only once the warehouse agrees.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from core.errors import PublishError
from storage.cache import CandidateCache
from storage.warehouse.base import Warehouse

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pointers:
    """The cache's current and previous pointers at one moment (what a failed publication restores)."""

    current: str | None
    previous: str | None


def pointers(cache: CandidateCache) -> Pointers:
    """Return the cache's pointers now."""
    return Pointers(cache.current(), cache.previous())


def switch_in_transaction(cache: CandidateCache, run_id: str, latest: str) -> Pointers:
    """Switch the cache to run_id when the warehouse transaction makes it the latest run; return the pointers before."""
    before = pointers(cache)
    if latest == run_id:
        cache.switch_current(run_id)
    else:
        log.info("run %s published for an older run_date than %s: the cache pointer stays on %s", run_id, latest, before.current)
    return before


def take_back(cache: CandidateCache, run_id: str, before: Pointers) -> None:
    """Take run_id out of the pointer chain: both pointers back to before when it is current, previous fixed if previous."""
    now = pointers(cache)
    if now.current == run_id:
        cache.set_pointers(before.current, before.previous)
    elif now.previous == run_id:  # another run switched after it: only the previous pointer named it
        cache.set_pointers(now.current, before.current)


def drop_unless_current(cache: CandidateCache, run_id: str) -> None:
    """Drop a failed (or not served) run's version unless the cache still points at it."""
    if cache.current() != run_id:
        cache.drop_version(run_id)


def align_pointers(cache: CandidateCache, newest: list[str]) -> str | None:
    """Point the cache at the warehouse's latest run (newest: latest first, then the one before); return the fix.

    Used when a crash left them apart: with nothing published the current pointer goes; a latest run whose version
    the cache lacks is left alone (logged), since there is nothing whole to switch to.
    """
    latest = newest[0] if newest else None
    current = cache.current()
    if current == latest:
        return None
    if latest is not None and latest not in cache.versions():
        log.warning("cache pointer %s differs from the warehouse's latest run %s, whose version the cache lacks", current, latest)
        return None
    versions = set(cache.versions())
    previous = next((run_id for run_id in newest[1:2] if run_id in versions), None)
    log.warning(
        "cache pointer %s differs from the warehouse's latest run %s: pointers set to (%s, %s)", current, latest, latest, previous
    )
    cache.set_pointers(latest, previous if latest is not None else None)
    return latest or "none"


def reconcile_cache(warehouse: Warehouse, cache: CandidateCache) -> str | None:
    """Put the cache pointers back in line with the warehouse after a crash; return the run switched to ('none': cleared).

    Runs inside a warehouse write transaction, so no publication switches the cache while it looks.
    """
    fixed: list[str | None] = []
    warehouse.with_newest(lambda newest: fixed.append(align_pointers(cache, newest)))
    return fixed[0] if fixed else None


def unstage_cache(cache: CandidateCache, run_id: str, before: Pointers | None) -> None:
    """Undo a staged (or switched, uncommitted) cache version: the pointers back to before, the run's entries dropped."""
    if before is not None:
        take_back(cache, run_id, before)
    drop_unless_current(cache, run_id)


def retract(warehouse: Warehouse, cache: CandidateCache, run_id: str, reason: str, before: Pointers | None) -> str | None:
    """Take back a committed publication whose later steps failed: warehouse, cache pointers and rows back to the run before.

    Returns the run that is latest again. The failed run's rows go with its warehouse retraction; its cache version
    goes once the warehouse has committed (a failed retraction leaves a version the warehouse still names).
    """

    def point_back(latest: str | None) -> None:
        if before is not None:
            take_back(cache, run_id, before)
        if cache.current() != latest:
            align_pointers(cache, [latest] if latest else [])

    latest = warehouse.retract(run_id, f"publication retracted: {reason}", before_commit=point_back)
    drop_unless_current(cache, run_id)
    log.warning("retracted publication of %s (%s); latest is %s", run_id, reason, latest)
    return latest


def rollback(warehouse: Warehouse, cache: CandidateCache) -> tuple[str, str | None]:
    """Point the warehouse's latest_* views and the cache back to the previous published run, together."""

    def switch(run_id: str) -> None:
        if run_id not in cache.versions():
            raise PublishError(f"cache has no entries of run {run_id}: cannot roll the cache back to it")
        cache.switch_current(run_id)

    return warehouse.rollback_latest(before_commit=switch)
