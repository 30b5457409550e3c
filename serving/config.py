"""The serving options: read from NIGHTSCORE_SERVING_* variables (the service's own), with the lake and cache of Settings.

This module and core/settings.py are the only ones that read the environment.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.settings import Settings
from storage.resources import lake_storage_options

USER_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
MAX_N = 100
DEFAULT_N = 10


class ServingConfig(BaseSettings):
    """Every option of the online ranker; each is also read as NIGHTSCORE_SERVING_<NAME> (where it lives comes from Settings)."""

    model_config = SettingsConfigDict(env_prefix="NIGHTSCORE_SERVING_", frozen=True, extra="ignore")

    cache_location: str = Field(description="redis:// URL or SQLite path of the candidate cache (from Settings).")
    cache_prefix: str = Field("nightscore", description="Key prefix of the cache entries (from Settings).")
    lake_root: str = Field(description="Lake holding the ranker and the feature tables (from Settings).")
    lake_options: dict[str, Any] = Field(default_factory=dict, description="s3fs options of an s3:// lake (from Settings).")
    fallback: bool = Field(True, description="Answer popular items (200, fallback popular) when the cache is down; else 503.")
    max_in_flight: int = Field(256, ge=0, description="Recommendation requests served at once; more are refused with 429.")
    model_refresh_s: float = Field(
        30.0, ge=0, description="How often the lake's current ranker is checked for a new one (0: never)."
    )
    blas_threads: int = Field(1, ge=1, description="BLAS/OpenMP threads of the ranker's forward pass (small matrices: 1).")
    batching: bool = Field(True, description="Score concurrent requests in one model call (False: one call per request).")
    max_batch: int = Field(32, ge=1, description="Most requests scored in one model call.")
    max_queue_delay_us: int = Field(
        0,
        ge=0,
        description="Longest a request waits for others to join its batch, us (0: those ready in the same loop turn).",
    )
    cache_timeout_s: float = Field(0.25, gt=0, description="Socket timeout of a Redis cache read (then: fallback).")
    breaker_open_s: float = Field(1.0, ge=0, description="After a cache failure, requests skip the cache this long.")
    cache_pool_size: int = Field(64, ge=1, description="Redis connections per worker.")
    events_retention_s: float = Field(172_800.0, gt=0, description="How long events are kept (stream trim, recent items).")
    events_max: int = Field(1_000_000, ge=1, description="Events held at most; more are refused with 429 until exported.")
    exclude_recent: bool = Field(True, description="Drop candidates the user interacted with after their run was computed.")
    cooc_boost: float = Field(
        0.0,
        ge=0,
        description="Add this x a candidate's co-visitation with the user's fresh events to its score (0: off; "
        "the run's neighbours are then not loaded).",
    )


CONFIG_VARIABLE = "NIGHTSCORE_SERVING_CONFIG_JSON"  # how `serve --workers N` hands the options to each worker


def export_config(config: ServingConfig) -> None:
    """Put the options where every uvicorn worker process reads them (its environment, inherited)."""
    os.environ[CONFIG_VARIABLE] = config.model_dump_json()


def exported_config() -> ServingConfig:
    """Return the options export_config put in this process's environment.

    Raises:
        KeyError: nothing was exported (the worker was not started by run_server).
    """
    return ServingConfig.model_validate_json(os.environ[CONFIG_VARIABLE])


def serving_config(settings: Settings, **overrides: Any) -> ServingConfig:
    """Return the serving options: lake and cache from settings, the rest from overrides or NIGHTSCORE_SERVING_* variables."""
    return ServingConfig(
        cache_location=settings.cache_location,
        cache_prefix=settings.cache.prefix,
        lake_root=settings.lake_root,
        lake_options=lake_storage_options(settings),
        **overrides,
    )
