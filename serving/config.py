"""The serving options: read from NIGHTSCORE_SERVING_* variables (the service's own), with the lake and cache of Settings.

This module and nightscore/settings.py are the only ones that read the environment.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from nightscore.settings import Settings
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
    model_refresh_s: float = Field(30.0, ge=0, description="How often the lake's current ranker is checked for a new one (0: never).")
    torch_threads: int = Field(1, ge=1, description="Torch threads of the ranker's forward pass (a tiny MLP per request).")


def serving_config(settings: Settings, **overrides: Any) -> ServingConfig:
    """Return the serving options: lake and cache from settings, the rest from overrides or NIGHTSCORE_SERVING_* variables."""
    return ServingConfig(cache_location=settings.cache_location, cache_prefix=settings.cache_prefix,
                         lake_root=settings.lake_root, lake_options=lake_storage_options(settings), **overrides)
