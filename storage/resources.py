"""The one place that builds the adapters in use (lake, warehouse, cache) from settings.

Each builder imports its adapter when called: a command line that reads the warehouse (`nightscore query`) then
never loads the lake's polars and fsspec or the cache's redis client (most of a second of its start), and a run on
the embedded SQLite cache never loads redis-py.
"""

from __future__ import annotations

import asyncio
from datetime import date
from typing import TYPE_CHECKING, Any

from core.settings import Settings

if TYPE_CHECKING:
    from storage.cache import CandidateCache
    from storage.cache_async import CacheReader
    from storage.events import EventStore
    from storage.lake import Lake
    from storage.warehouse.base import Warehouse

S3_SCHEMES = ("s3://", "s3a://")


def lake_storage_options(settings: Settings) -> dict[str, Any]:
    """Return the s3fs options of an s3:// lake from settings (endpoint, region); {} for a local lake.

    Credentials are left to s3fs/botocore (AWS_* variables, the AWS config or profile); AWS_ENDPOINT_URL
    and AWS_DEFAULT_REGION apply when the settings leave endpoint and region unset.
    """
    if not settings.lake_root.startswith(S3_SCHEMES):
        return {}
    # Listings are not cached: several processes (tasks, resumed runs, analysts) write the same prefixes.
    options: dict[str, Any] = {"use_listings_cache": False}
    if settings.lake.s3_endpoint_url:
        options["endpoint_url"] = settings.lake.s3_endpoint_url
    if settings.lake.s3_region:
        options["client_kwargs"] = {"region_name": settings.lake.s3_region}
    return options


def lake_for(settings: Settings) -> Lake:
    """Return the lake adapter for settings.lake_root (s3:// through s3fs with lake_storage_options)."""
    from storage.lake import Lake

    return Lake(settings.lake_root, lake_storage_options(settings), settings.lake.retries, settings.lake.retry_backoff_s)


def warehouse_for(settings: Settings, embedding_dim: int | None = None) -> Warehouse:
    """Return the warehouse adapter for settings.warehouse_location (embedding_dim: a run's, so it may create it)."""
    return open_warehouse(
        settings.warehouse_location, embedding_dim=embedding_dim, lock_timeout_s=settings.warehouse.lock_timeout_s
    )


def query_warehouse_for(settings: Settings) -> Warehouse:
    """Return the adapter analysts' SQL runs on (settings.query_warehouse_location: a read-only role on PostgreSQL)."""
    return open_warehouse(settings.query_warehouse_location, lock_timeout_s=settings.warehouse.lock_timeout_s)


def cache_for(settings: Settings, retries: int | None = None) -> CandidateCache:
    """Return the candidate cache adapter for settings.cache_location (retries: its transport retries, else the setting)."""
    retry = settings.cache.retries if retries is None else retries
    return open_cache(settings.cache_location, settings.cache.prefix, settings.cache.version_grace_s, retry)


def open_cache(location: str, prefix: str, version_grace_s: float | None = None, retries: int = 2) -> CandidateCache:
    """Return the cache at a redis:// or rediss:// URL (transport errors retried `retries` times), or else the SQLite
    file; version_grace_s None keeps the adapters' default."""
    from storage.cache import DEFAULT_VERSION_GRACE_S, REDIS_SCHEMES, SqliteCache

    grace = DEFAULT_VERSION_GRACE_S if version_grace_s is None else version_grace_s
    if location.startswith(REDIS_SCHEMES):
        from storage.cache_redis import RedisCache  # redis-py loads for a Redis cache only

        return RedisCache(location, prefix, grace, retries)
    return SqliteCache(location, prefix, grace)


def open_warehouse(location: str, embedding_dim: int | None = None, lock_timeout_s: float | None = None) -> Warehouse:
    """Return the warehouse adapter for a location: a postgresql:// URL or a DuckDB file path.

    embedding_dim: the width of this run's embeddings, for the run that may create the tables; None to read and
    update an existing warehouse only. lock_timeout_s: how long to wait for another process's lock (None: the
    adapter's default).
    """
    if location.startswith(("postgresql://", "postgres://")):
        # psycopg is imported only when a PostgreSQL warehouse is used
        from storage.warehouse.postgres_warehouse import PostgresWarehouse

        if lock_timeout_s is None:
            return PostgresWarehouse(location, embedding_dim=embedding_dim)
        return PostgresWarehouse(location, embedding_dim=embedding_dim, lock_timeout_s=lock_timeout_s)
    from storage.warehouse.duckdb_warehouse import DuckDBWarehouse

    return DuckDBWarehouse(location, embedding_dim=embedding_dim, lock_timeout_s=lock_timeout_s)


def stores_for(settings: Settings, pool_size: int | None = None) -> tuple[CacheReader, EventStore]:
    """Return the online ranker's cache read path and event store (one shared Redis pool, or the SQLite file)."""
    from storage.cache_async import open_stores

    options = settings.serving
    return open_stores(
        settings.cache_location,
        settings.cache.prefix,
        options.cache_timeout_s,
        pool_size or options.cache_pool_size,
        options.events_retention_s,
        options.events_max,
    )


def export_events(settings: Settings, day: date) -> tuple[str | None, int]:
    """Write a UTC day's events from the service's event store to the lake; return (partition URI or None, rows)."""

    from storage.events import export_day

    async def export() -> tuple[str | None, int]:
        reader, store = stores_for(settings, pool_size=1)
        try:
            return await export_day(store, lake_for(settings), day)
        finally:
            await store.close()
            await reader.close()

    return asyncio.run(export())
