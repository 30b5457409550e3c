"""The process environment beside the settings: libraries' switches, and the environment of the processes we start.

With core/settings.py the only module that reads or writes the environment. `apply_runtime_defaults` sets the
switches of the libraries we drive (Prefect, Hugging Face, Great Expectations); `child_environment` and
`worker_environment` build the environment of the processes we start (worker, servers, Ray workers);
`export_settings` puts settings where the processes this one starts will read them (uvicorn's workers), and
`export_metrics_folder` names where those workers write their metrics (prometheus_client's multiprocess mode).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from core.settings import ENV_PREFIX, Settings

# Variables a worker process needs besides NIGHTSCORE_*: where the Prefect API is, offline model libraries,
# an S3 endpoint/region. Credentials stay in each node's own environment.
PASSTHROUGH = (
    "PREFECT_API_URL",
    "PREFECT_API_AUTH_STRING",
    "PREFECT_SERVER_ANALYTICS_ENABLED",
    "DO_NOT_TRACK",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "TOKENIZERS_PARALLELISM",
    "GX_ANALYTICS_ENABLED",
    "AWS_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
)


def library_defaults(settings: Settings) -> dict[str, str]:
    """Return the libraries' switches: offline model libraries, no telemetry, a startup timeout a slow machine meets."""
    return {
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": str(settings.ops.prefect_startup_timeout_s),
        "PREFECT_UI_ENABLED": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "true",
        "GX_ANALYTICS_ENABLED": "False",
    }


def apply_runtime_defaults(settings: Settings) -> None:
    """Set Prefect's, Hugging Face's and Great Expectations' process switches, never overriding the user's.

    Prefect runs in its local ephemeral mode unless PREFECT_API_URL is set; model libraries are told they
    are offline (the encoder's files ship inside a package; nothing may be downloaded).
    """
    for name, value in library_defaults(settings).items():
        os.environ.setdefault(name, value)


def settings_environment(settings: Settings) -> dict[str, str]:
    """Return NIGHTSCORE_* variables that reproduce settings in another process (home made absolute)."""
    values = settings.flat()
    values["home"] = str(Path(settings.home).resolve())
    return {ENV_PREFIX + name.upper(): v if isinstance(v, str) else json.dumps(v) for name, v in values.items()}


def export_settings(settings: Settings) -> None:
    """Put settings in this process's environment, where the processes it starts next read them (uvicorn workers)."""
    os.environ.update(settings_environment(settings))


METRICS_FOLDER = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's multiprocess mode: where each worker writes its values


def export_metrics_folder(folder: str | None) -> None:
    """Name the folder where the serving workers this process starts next write their metrics (None: no longer)."""
    if folder is None:
        os.environ.pop(METRICS_FOLDER, None)
    else:
        os.environ[METRICS_FOLDER] = folder


def metrics_folder() -> str | None:
    """Return the folder of the serving workers' metrics, or None when this process keeps its own (one worker)."""
    return os.environ.get(METRICS_FOLDER) or None


def worker_environment(settings: Settings, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the small environment of a remote worker (Ray): settings, library switches and PASSTHROUGH variables."""
    env = {**library_defaults(settings), **{k: v for k, v in os.environ.items() if k in PASSTHROUGH}}
    return {**env, **settings_environment(settings), **(extra or {})}


def child_environment(settings: Settings, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the environment of a local child process (server, worker): this one's, plus settings and extra."""
    return {**library_defaults(settings), **os.environ, **settings_environment(settings), **(extra or {})}
