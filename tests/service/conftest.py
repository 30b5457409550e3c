"""Fixtures of the service tier: a served run built by the candidate stage's own functions on demo data, a real Redis.

`served` runs the candidate stage (models/recommender/candidate_stage.py: sources, fusion, a LightGBM ranker) on a small demo
catalogue, then writes what a published run leaves for serving: the ranker in the lake, serving/<run>/serving.json
(r1 also with its co-visitation neighbours, r2 without), its catalogue and one cache entry (encode_entry) per user.
No Prefect: the flow tier covers the nightly run itself. Services built here carry an API key (`service_config`,
`keyed`) and no rate limit unless a test sets one.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import redis
from fastapi import FastAPI
from fastapi.testclient import TestClient

from core.settings import CacheSettings, LakeSettings, Settings
from models.recommender.candidate_stage import CandidateConfig, candidate_chunks, fit_final, tune
from models.recommender.evaluation import time_split
from models.recommender.fusion import TuningGrid
from models.recommender.ranker_models import Scorer, scorer_to_bytes
from models.recommender.ranker_training import RankerParams
from models.recommender.retrieval import ItemChunks
from models.recommender.sources.base import encode_run
from models.recommender.sources.cooccurrence import CooccurrenceSource, neighbour_frame
from models.recommender.sources.popularity import robust_trending
from nightscore.demo import DEMO_BASE_TIME, generate_demo_data
from serving.config import ServingConfig, serving_config
from storage.artifacts import publish_items, publish_neighbours, publish_scorer, publish_serving
from storage.cache import CandidateCache
from storage.candidate_payload import CandidateEntry, encode_entry, feature_set_id
from storage.lake import Lake
from tests.helpers import hashed_text_vectors

REDIS_URL = "redis://127.0.0.1:6379/0"
RUN_IDS = ("r1", "r2")
K = 30
FALLBACK_ITEMS = 100
NEIGHBOURS = 20
API_KEY = "nightscore-test-key-0123456789"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
SERVICE_OPTIONS: dict[str, Any] = {"api_keys": [API_KEY], "rate_limit_per_s": 0.0}


@dataclass(frozen=True)
class Served:
    """A lake with runs r1 and r2 published for serving (same ranker; r1 with neighbours), and the cache entries to publish."""

    lake_root: Path
    scorer: Scorer
    entries: dict[str, bytes]
    fallback: list[str]
    computed_at: str
    neighbours: pl.DataFrame  # r1's (item_id, neighbour_id, weight)
    item_ids: list[str]  # the catalogue both runs published


def free_port() -> int:
    """Return a loopback TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def own_redis_server(folder: Path, password: str | None = None) -> Iterator[dict[str, Any]]:
    """Yield a controller of a redis-server run on a free port (port, url, start, stop), optionally with a password;
    it can be stopped and started again, and is killed after. Skips the test where redis-server is not installed."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port, procs = free_port(), []
    auth = ["--requirepass", password] if password else []

    def start() -> None:
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)]
        procs.append(subprocess.Popen([*args, *auth], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 20
        while not _answers(port, password):
            assert time.monotonic() < deadline, f"redis-server on port {port} did not start"
            time.sleep(0.05)

    def stop() -> None:
        procs[-1].terminate()
        procs[-1].wait(timeout=20)

    start()
    try:
        yield {"port": port, "url": f"redis://127.0.0.1:{port}/0", "start": start, "stop": stop}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=20)


def _answers(port: int, password: str | None) -> bool:
    """Return True when the redis-server on port answers PING."""
    client = redis.Redis(port=port, password=password, socket_connect_timeout=0.5)
    try:
        return bool(client.ping())
    except redis.exceptions.ConnectionError:
        return False
    finally:
        client.close()


def service_config(location: str, prefix: str, lake_root: Path, **overrides: Any) -> ServingConfig:
    """Return the options of a test service over a cache and a lake: the test key, no rate limit, then overrides."""
    settings = Settings(cache=CacheSettings(url=location, prefix=prefix), lake=LakeSettings(url=str(lake_root)))
    return serving_config(settings, **{**SERVICE_OPTIONS, **overrides})


def keyed(app: FastAPI) -> TestClient:
    """Return a test client of an app that sends the test key with every request."""
    return TestClient(app, headers=AUTH)


def publish(cache: CandidateCache, run_id: str, entries: dict[str, bytes]) -> None:
    """Write a run's entries and make it current."""
    cache.write_version(run_id, entries.items())
    cache.switch_current(run_id)


def _write_run(
    lake: Lake,
    run_id: str,
    scorer: Scorer,
    fallback: tuple[list[str], list[float]],
    computed_at: str,
    neighbours: pl.DataFrame | None,
    item_ids: pl.Series,
) -> None:
    """Write the ranker, a run's neighbours and its serving.json as the candidate stage and publish-serving do."""
    version = publish_scorer(lake, *scorer_to_bytes(scorer, {"trained_on": run_id}))
    names = list(scorer.feature_names)
    serving = {
        "run_id": run_id,
        "ranker_version": version,
        "ranker_kind": scorer.kind,
        "feature_names": names,
        "feature_set": feature_set_id(names),
        "fallback_items": fallback[0],
        "fallback_scores": fallback[1],
        "computed_at": computed_at,
        "neighbours": None if neighbours is None else publish_neighbours(lake, run_id, neighbours),
        "items": publish_items(lake, run_id, item_ids),
    }
    publish_serving(lake, run_id, serving, latest=True)


def build_served(lake_root: Path, n_items: int = 400, n_users: int = 120, k: int = K) -> Served:
    """Run the candidate stage on demo data and write runs r1, r2 into the lake at lake_root (benchmarks use it too)."""
    items, interactions = generate_demo_data(n_items, n_users, seed=0)
    catalogue, log = encode_run(items, interactions)
    vectors = np.stack(hashed_text_vectors(items)["embedding"].to_list()).astype(np.float32)
    config = CandidateConfig(
        k=k, per_source=k, grid=TuningGrid(weights=(1.0,), rrf_k=(60.0,), rounds=1), ranker=RankerParams(rounds=30, threads=1)
    )
    chunks, split = ItemChunks.of(vectors, 512), time_split(log, config.holdout_share)
    tuned = tune(catalogue, log, chunks, config, split)
    # The service is tested with a ranker to serve: the validation split's LightGBM. (On this log of hashed-text
    # vectors a run would serve none: stage two orders held-out users worse than the fused order, 0.034 vs 0.040.)
    scorer = tuned.scorers["lightgbm"]
    final = fit_final(catalogue, log, chunks, config, DEMO_BASE_TIME, tuned, scorer)
    entries = {}
    for chunk in candidate_chunks(final):
        feature_set = feature_set_id(chunk.feature_names)
        for user_id, item_ids, features in chunk.payloads(catalogue.item_ids, catalogue.user_ids):
            if item_ids:
                entries[user_id] = encode_entry(CandidateEntry(item_ids, features, feature_set))
    trending = robust_trending(final.history, config.popularity)
    top = np.argsort(-trending, kind="stable")[:FALLBACK_ITEMS]
    fallback = (catalogue.item_ids.gather(top).to_list(), [float(v) for v in trending[top]])
    cooc = next(s for s in final.sources if isinstance(s, CooccurrenceSource))
    neighbours = neighbour_frame(cooc, catalogue.item_ids, NEIGHBOURS)
    for run_id in RUN_IDS:
        own = neighbours if run_id == "r1" else None
        _write_run(Lake(str(lake_root)), run_id, scorer, fallback, DEMO_BASE_TIME.isoformat(), own, catalogue.item_ids)
    item_ids = catalogue.item_ids.to_list()
    return Served(lake_root, scorer, entries, fallback[0], DEMO_BASE_TIME.isoformat(), neighbours, item_ids)


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Served:
    """Return the served run on demo data (400 items, 120 users, K=30)."""
    return build_served(tmp_path_factory.mktemp("lake"))


@pytest.fixture
def prefix() -> Iterator[str]:
    """Yield a unique key prefix on the shared Redis; its keys are deleted after the test."""
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        pytest.skip(f"no Redis server at {REDIS_URL}")
    name = f"nstest-serving:{uuid.uuid4().hex}"
    yield name
    keys = list(client.scan_iter(match=f"{name}:*", count=1000))
    if keys:
        client.unlink(*keys)
    client.close()
