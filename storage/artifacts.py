"""The online ranker's artifacts in the lake: the ranker versions and what each published run serves with.

Layout (under the lake root, so an s3:// lake serves a service on another host):

- ``models/ranker/<version>/model.bin`` and ``metadata.json``: one folder per trained ranker, content-addressed
  (the version is a hash of the ranker's kind, feature names and bytes; models/recommender/ranker_models.py);
- ``serving/<run_id>/serving.json``: written when a run publishes: its ranker version, the feature set of its
  cache entries, and the trending items answered to users the run has not seen. A rollback brings back the run's
  own ranker with its candidates;
- ``serving/<run_id>/neighbours.parquet``: the run's co-visitation neighbours (item_id, neighbour_id, weight), a
  few per item, named in its serving.json (``"neighbours"``, a path under the lake root; null without them): the
  service boosts the candidates that co-occur with a user's fresh events;
- ``serving/<run_id>/items.parquet``: the run's catalogue (one ``item_id`` column), named in its serving.json
  (``"items"``): the service drops events of items the run it serves does not know;
- ``serving/latest.json``: ``{"run_id": ...}`` of the newest published run (a service whose cache is down starts
  from it).
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

import polars as pl

from core.errors import InputUnreadable
from storage.lake import Lake

MODEL_FILE, META_FILE, SERVING_FILE, NEIGHBOURS_FILE = "model.bin", "metadata.json", "serving.json", "neighbours.parquet"
ITEMS_FILE = "items.parquet"
NEIGHBOUR_COLUMNS = {"item_id": pl.String(), "neighbour_id": pl.String(), "weight": pl.Float32()}


def ranker_folder(lake: Lake, version: str) -> str:
    """Return the lake folder of one ranker version."""
    return lake.uri("models", "ranker", version)


def publish_scorer(lake: Lake, model: bytes, metadata: bytes) -> str:
    """Write a ranker's bytes and metadata under its version (written once: the folder is content-addressed)."""
    version = str(json.loads(metadata)["version"])
    folder = ranker_folder(lake, version)
    if not lake.exists(posixpath.join(folder, META_FILE)):
        lake.write_bytes(model, posixpath.join(folder, MODEL_FILE))
        lake.write_bytes(metadata, posixpath.join(folder, META_FILE))  # last: a folder with metadata is complete
    return version


def read_scorer_bytes(lake: Lake, version: str) -> tuple[bytes, bytes]:
    """Return (model bytes, metadata bytes) of a ranker version; InputUnreadable when it is not in the lake."""
    folder = ranker_folder(lake, version)
    return lake.read_bytes(posixpath.join(folder, MODEL_FILE)), lake.read_bytes(posixpath.join(folder, META_FILE))


def serving_uri(lake: Lake, run_id: str) -> str:
    """Return the URI of a published run's serving.json."""
    return lake.uri("serving", run_id, SERVING_FILE)


def publish_neighbours(lake: Lake, run_id: str, neighbours: pl.DataFrame) -> str:
    """Write a run's neighbour table to serving/<run_id>/neighbours.parquet; return its path under the lake root."""
    path = posixpath.join("serving", run_id, NEIGHBOURS_FILE)
    lake.write_parquet(neighbours, lake.uri(path))
    return path


def read_neighbours(lake: Lake, path: str) -> pl.DataFrame:
    """Return the neighbour table at a path under the lake root (serving.json's "neighbours").

    Raises:
        InputUnreadable: the file is absent, unreadable, or lacks a column (or has it in another type).
    """
    frame = lake.read_parquet(lake.uri(path), "neighbours", columns=list(NEIGHBOUR_COLUMNS))
    if dict(frame.schema) != NEIGHBOUR_COLUMNS:
        raise InputUnreadable(f"neighbours file {path}: columns {dict(frame.schema)}, expected {NEIGHBOUR_COLUMNS}")
    return frame


def publish_items(lake: Lake, run_id: str, item_ids: pl.Series) -> str:
    """Write a run's catalogue to serving/<run_id>/items.parquet (one item_id column); return its path under the lake root."""
    path = posixpath.join("serving", run_id, ITEMS_FILE)
    lake.write_parquet(pl.DataFrame({"item_id": item_ids.cast(pl.String)}), lake.uri(path))
    return path


def read_items(lake: Lake, path: str) -> pl.Series:
    """Return the item ids of a run's catalogue at a path under the lake root (serving.json's "items").

    Raises:
        InputUnreadable: the file is absent or unreadable, or its item_id column is not text.
    """
    frame = lake.read_parquet(lake.uri(path), "items", columns=["item_id"])
    if frame.schema.get("item_id") != pl.String():
        raise InputUnreadable(f"items file {path}: item_id is {frame.schema.get('item_id')}, expected String")
    return frame.get_column("item_id")


def publish_serving(lake: Lake, run_id: str, serving: dict[str, Any], latest: bool) -> str:
    """Write a run's serving.json (and name it latest when it is the newest published run); return its URI."""
    uri = lake.write_json(serving, serving_uri(lake, run_id))
    if latest:
        lake.write_json({"run_id": run_id}, lake.uri("serving", "latest.json"))
    return uri


def read_serving(lake: Lake, run_id: str) -> dict[str, Any] | None:
    """Return a published run's serving.json, or None when the run has none."""
    return lake.read_json(serving_uri(lake, run_id))


def latest_serving_run(lake: Lake) -> str | None:
    """Return the newest run whose serving.json was written (what a service starts with when its cache is down)."""
    latest = lake.read_json(lake.uri("serving", "latest.json"))
    return None if latest is None else str(latest["run_id"])


def rebind_ranker(lake: Lake, run_id: str, version: str, kind: str) -> None:
    """Make a published run serve another ranker version of the same feature set (the train-ranker flow)."""
    serving = read_serving(lake, run_id)
    if serving is None:
        raise FileNotFoundError(f"run {run_id} has no serving.json in the lake")
    lake.write_json({**serving, "ranker_version": version, "ranker_kind": kind}, serving_uri(lake, run_id))
