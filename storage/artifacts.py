"""The online ranker's artifacts in the lake: feature tables per published run, ranker versions and the current one.

Layout (under the lake root, so an s3:// lake serves a service on another host):

- ``serving/<run_id>/item_features.parquet``, ``serving/<run_id>/user_features.parquet``: written by each
  publication, read by the service for the run the cache pointer names (a rollback brings its features back too);
- ``models/ranker/<version>/ranker.pt`` and ``ranker.json``: one folder per trained ranker (content-hash version);
- ``serving/latest.json``: ``{"run_id": ...}`` of the last run whose features were written;
- ``models/ranker/current.json``: ``{"version": ...}`` of the ranker the service loads.
"""

from __future__ import annotations

import posixpath
import tempfile
from pathlib import Path

import polars as pl

from storage.lake import Lake

ITEM_FEATURES, USER_FEATURES = "item_features.parquet", "user_features.parquet"
MODEL_FILE, META_FILE = "ranker.pt", "ranker.json"


def features_uri(lake: Lake, run_id: str, table: str) -> str:
    """Return the URI of one feature table of a published run."""
    return lake.uri("serving", run_id, table)


def write_features(lake: Lake, run_id: str, items: pl.DataFrame, users: pl.DataFrame) -> tuple[str, str]:
    """Write a run's item and user feature tables (each atomically), then name the run latest; return their URIs."""
    uris = (lake.write_parquet(items, features_uri(lake, run_id, ITEM_FEATURES)),
            lake.write_parquet(users, features_uri(lake, run_id, USER_FEATURES)))
    lake.write_json({"run_id": run_id}, lake.uri("serving", "latest.json"))
    return uris


def latest_features_run(lake: Lake) -> str | None:
    """Return the run whose features were written last (what a service starts with when its cache is down)."""
    latest = lake.read_json(lake.uri("serving", "latest.json"))
    return None if latest is None else str(latest["run_id"])


def read_features(lake: Lake, run_id: str, item_columns: list[str], user_columns: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Return a run's (item features, user features); InputUnreadable when the run has none."""
    return (lake.read_parquet(features_uri(lake, run_id, ITEM_FEATURES), "item features", columns=item_columns),
            lake.read_parquet(features_uri(lake, run_id, USER_FEATURES), "user features", columns=user_columns))


def ranker_folder(lake: Lake, version: str) -> str:
    """Return the lake folder of one ranker version."""
    return lake.uri("models", "ranker", version)


def publish_ranker(lake: Lake, version: str, local_model: Path, local_meta: Path) -> str:
    """Upload a saved ranker (its state file and metadata) as a version, then make it current; return its folder."""
    folder = ranker_folder(lake, version)
    lake.write_bytes(local_model.read_bytes(), posixpath.join(folder, MODEL_FILE))
    lake.write_bytes(local_meta.read_bytes(), posixpath.join(folder, META_FILE))
    lake.write_json({"version": version}, lake.uri("models", "ranker", "current.json"))
    return folder


def current_ranker(lake: Lake) -> str | None:
    """Return the version of the ranker the service should load, or None before the first training."""
    current = lake.read_json(lake.uri("models", "ranker", "current.json"))
    return None if current is None else str(current["version"])


def fetch_ranker(lake: Lake, version: str, into: Path) -> Path:
    """Download a ranker version into a local folder; return the path of its state file (metadata beside it)."""
    folder = ranker_folder(lake, version)
    into.mkdir(parents=True, exist_ok=True)
    (into / MODEL_FILE).write_bytes(lake.read_bytes(posixpath.join(folder, MODEL_FILE)))
    (into / META_FILE).write_bytes(lake.read_bytes(posixpath.join(folder, META_FILE)))
    return into / MODEL_FILE


def scratch_dir(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """Return a local temporary folder for files on their way to or from the lake."""
    return tempfile.TemporaryDirectory(prefix=prefix)
