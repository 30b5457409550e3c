"""The online ranker's configuration: the settings it serves under (their serving group; where the cache and lake are).

Nothing here reads the environment: `nightscore serve` hands its settings over, and its uvicorn workers read theirs
from the NIGHTSCORE_ variables it exported for them (core/environment.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator

from core.ids import id_problem
from core.settings import ServingSettings, Settings

MAX_N = 100
DEFAULT_N = 10


def checked_id(value: str) -> str:
    """Return value when it follows the id rule (core/ids.py); raise ValueError saying why not (never echoing it)."""
    problem = id_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


ServedId = Annotated[str, AfterValidator(checked_id)]  # a user or item id in a request: the contracts' rule


@dataclass(frozen=True)
class ServingConfig:
    """The settings a service runs under: its options (settings.serving) and the adapters' locations."""

    settings: Settings

    @property
    def options(self) -> ServingSettings:
        """Return the service's own options (NIGHTSCORE_SERVING_*)."""
        return self.settings.serving


def serving_config(settings: Settings, **overrides: Any) -> ServingConfig:
    """Return the service's configuration: the settings, with serving options overridden by name (tests, benchmarks)."""
    options = ServingSettings.model_validate({**settings.serving.model_dump(), **overrides})
    return ServingConfig(settings.model_copy(update={"serving": options}))
