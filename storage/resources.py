"""The one place that builds the adapters in use (lake, warehouse, cache) from settings."""

from __future__ import annotations

from nightscore.settings import Settings
from storage.cache import CandidateCache, open_cache
from storage.lake import Lake
from storage.warehouse import Warehouse, open_warehouse

EMBEDDING_DIM = 384


def lake_for(settings: Settings) -> Lake:
    """Return the lake adapter for settings.lake_root."""
    return Lake(settings.lake_root)


def warehouse_for(settings: Settings) -> Warehouse:
    """Return the warehouse adapter for settings.warehouse_location."""
    return open_warehouse(settings.warehouse_location, embedding_dim=EMBEDDING_DIM)


def cache_for(settings: Settings) -> CandidateCache:
    """Return the candidate cache adapter for settings.cache_location."""
    return open_cache(settings.cache_location, settings.cache_prefix, settings.cache_version_grace_s)
