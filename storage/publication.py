"""The published run across two adapters: the warehouse's latest run and the cache pointer, moved together.

Every function here keeps one rule: after it returns (or raises), the cache's current pointer names the
warehouse's latest published run whenever the cache holds that run's version.
"""

from __future__ import annotations

import logging

from nightscore.errors import PublishError
from storage.cache import CandidateCache
from storage.warehouse import Warehouse

log = logging.getLogger(__name__)


def reconcile_cache(warehouse: Warehouse, cache: CandidateCache) -> str | None:
    """Point the cache at the warehouse's latest published run when a crash left them apart; return the fix."""
    latest = warehouse.latest_published()
    if latest is None or cache.current() == latest.run_id or latest.run_id not in cache.versions():
        return None
    log.warning("cache pointer %s differs from the warehouse's latest run %s: switching back", cache.current(), latest.run_id)
    cache.switch_current(latest.run_id)
    return latest.run_id


def unstage_cache(cache: CandidateCache, run_id: str, old_pointer: str | None) -> None:
    """Undo a staged (or switched, uncommitted) cache version: the pointer back where it was, the run's entries dropped."""
    if old_pointer is not None and cache.current() == run_id:
        cache.switch_current(old_pointer)
    if cache.current() != run_id:
        cache.drop_version(run_id)


def retract(warehouse: Warehouse, cache: CandidateCache, run_id: str, reason: str) -> str | None:
    """Take back a committed publication whose later steps failed: warehouse and cache pointer back to the run before."""
    def point_back(latest: str | None) -> None:
        if latest is not None and latest in cache.versions() and cache.current() == run_id:
            cache.switch_current(latest)

    latest = warehouse.retract(run_id, f"publication retracted: {reason}", before_commit=point_back)
    log.warning("retracted publication of %s (%s); latest is %s", run_id, reason, latest)
    return latest


def rollback(warehouse: Warehouse, cache: CandidateCache) -> tuple[str, str | None]:
    """Point the warehouse's latest_* views and the cache back to the previous published run, together."""
    def switch(run_id: str) -> None:
        if run_id not in cache.versions():
            raise PublishError(f"cache has no entries of run {run_id}: cannot roll the cache back to it")
        cache.switch_current(run_id)

    return warehouse.rollback_latest(before_commit=switch)
