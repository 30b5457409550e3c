"""The serving options: one small dataclass, built from nightscore Settings by serving_config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nightscore.settings import Settings

USER_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
MAX_N = 100
DEFAULT_N = 10


@dataclass(frozen=True)
class ServingConfig:
    """Every option of the online ranker, with its default.

    Attributes:
        cache_location: redis:// URL or SQLite path of the candidate cache.
        cache_prefix: key prefix of the cache entries.
        model_path: ranker state-dict file (its metadata sits next to it as .json).
        item_features_path: Parquet item features table (models.ranker.item_features).
        user_features_path: Parquet user-topic affinities (models.ranker.user_topic_affinity); None: affinity 0.
        fallback_on_cache_error: answer popular items (200, "fallback": "popular") when the cache is down;
            False answers 503.
        max_in_flight: recommendation requests served at once; more are refused with 429.
        features_refresh_s: how often the feature files are checked for a newer version (0: never).
    """

    cache_location: str
    cache_prefix: str
    model_path: Path
    item_features_path: Path
    user_features_path: Path | None = None
    fallback_on_cache_error: bool = True
    max_in_flight: int = 256
    features_refresh_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_in_flight < 0 or self.features_refresh_s < 0:
            raise ValueError("max_in_flight and features_refresh_s must not be negative")


def serving_config(
    settings: Settings, model_path: str | Path, item_features_path: str | Path,
    user_features_path: str | Path | None = None, **overrides: object,
) -> ServingConfig:
    """Return the serving options: cache from settings, files as given, other fields from overrides or defaults."""
    return ServingConfig(
        cache_location=settings.cache_location,
        cache_prefix=settings.cache_prefix,
        model_path=Path(model_path),
        item_features_path=Path(item_features_path),
        user_features_path=None if user_features_path is None else Path(user_features_path),
        **overrides,  # type: ignore[arg-type]
    )
