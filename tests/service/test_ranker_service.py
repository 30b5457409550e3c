"""Service tests of the online ranker against a real Redis on loopback and a small ranker trained on demo data.

Candidates are published with the real RedisCache (write_version + switch_current) under a unique prefix per
test, deleted after. One test runs its own redis-server, stops it mid-test and starts it again.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import redis
from fastapi.testclient import TestClient

from models.ranker import (
    FeatureIndex,
    RankerModel,
    embedding_retrieval,
    hashed_text_vectors,
    item_features,
    metadata_path,
    popular_items,
    retrieval_candidates,
    save_ranker,
    train_ranker,
    user_topic_affinity,
)
from nightscore.demo_data import DEMO_BASE_TIME, generate_demo_data
from nightscore.errors import ModelLoadError
from nightscore.settings import DEFAULT_EVENT_WEIGHTS, Settings
from serving.app import create_app
from serving.config import ServingConfig, serving_config
from storage.artifacts import publish_ranker, write_features
from storage.cache import CandidateCache, RedisCache, SqliteCache
from storage.candidate_payload import encode_candidates
from storage.lake import Lake

REDIS_URL = "redis://127.0.0.1:6379/0"
HALF_LIFE_DAYS = 14.0
N_CANDIDATES = 50
WAIT_S = 20.0  # deadlock guard only

Candidates = dict[str, tuple[list[str], np.ndarray]]


@dataclass(frozen=True)
class Artifacts:
    """The module's lake (trained ranker current, feature tables of runs r1 and r2) and the demo candidates to publish."""

    model: RankerModel
    lake_root: Path
    features: FeatureIndex
    candidates: Candidates
    popular: list[str]


# --- helpers --------------------------------------------------------------------------------


def _candidates_by_user(frame: pl.DataFrame) -> Candidates:
    """Return user -> (item ids, scores) in rank order."""
    grouped = frame.sort("user_id", "rank").group_by("user_id", maintain_order=True).agg("item_id", "score")
    return {u: (ids, np.array(s, dtype=np.float32)) for u, ids, s in grouped.iter_rows()}


def publish(cache: CandidateCache, run_id: str, candidates: Candidates) -> None:
    """Write a run's payloads and make it current."""
    cache.write_version(run_id, ((u, encode_candidates(ids, s)) for u, (ids, s) in candidates.items()))
    cache.switch_current(run_id)


def config_for(art: Artifacts, location: str, prefix: str, lake_root: Path | None = None, **overrides: object) -> ServingConfig:
    """Return a ServingConfig over the module's lake (or another one) and the given cache."""
    settings = Settings(cache_url=location, cache_prefix=prefix, lake_url=str(lake_root or art.lake_root))
    return serving_config(settings, **overrides)


def recommend(client: TestClient, user_id: str, n: int = 10) -> dict:
    """GET one user's recommendations and return the JSON body of a 200."""
    response = client.get(f"/v1/users/{user_id}/recommendations", params={"n": n})
    assert response.status_code == 200, response.text
    return response.json()


def free_port() -> int:
    """Return a loopback TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition: object, what: str) -> None:
    """Poll condition() until true or fail after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def art(tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    """Train a ranker on generate_demo_data(300, 60) and write its model and feature files."""
    items, interactions = generate_demo_data(300, 60)
    scores = items.select("item_id", "topic", pl.Series("topic_score", np.random.default_rng(0).uniform(0.4, 1.0, items.height)))
    vectors = hashed_text_vectors(items)
    model = train_ranker(items, interactions, scores, embedding_retrieval(vectors, DEFAULT_EVENT_WEIGHTS, HALF_LIFE_DAYS))
    folder, lake_root = tmp_path_factory.mktemp("ranker"), tmp_path_factory.mktemp("lake")
    lake = Lake(str(lake_root))
    table = item_features(items, interactions, scores, DEMO_BASE_TIME)
    affinity = user_topic_affinity(interactions, table, DEMO_BASE_TIME)
    for run_id in ("r1", "r2"):
        write_features(lake, run_id, table, affinity)
    path = save_ranker(model, folder / "ranker.pt")
    publish_ranker(lake, model.version, path, metadata_path(path))
    frame = retrieval_candidates(vectors, interactions, DEMO_BASE_TIME, N_CANDIDATES, DEFAULT_EVENT_WEIGHTS, HALF_LIFE_DAYS)
    return Artifacts(model, lake_root, FeatureIndex(table, affinity), _candidates_by_user(frame), popular_items(table, 100)[0])


@pytest.fixture
def prefix() -> Iterator[str]:
    """Yield a unique key prefix on the shared Redis; its keys are deleted after the test."""
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        pytest.skip(f"no Redis server at {REDIS_URL}")
    name = f"nstest-ranker:{uuid.uuid4().hex}"
    yield name
    keys = list(client.scan_iter(match=f"{name}:*", count=1000))
    if keys:
        client.unlink(*keys)
    client.close()


@pytest.fixture
def cache(prefix: str, art: Artifacts) -> Iterator[RedisCache]:
    """Yield the real RedisCache of the test's prefix with run r1 published and current."""
    with RedisCache(REDIS_URL, prefix) as opened:
        publish(opened, "r1", art.candidates)
        yield opened


@pytest.fixture
def client(cache: RedisCache, art: Artifacts) -> Iterator[TestClient]:
    """Yield a client of the service over the published cache."""
    with TestClient(create_app(config_for(art, REDIS_URL, cache.prefix))) as test_client:
        yield test_client


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[dict[str, object]]:
    """Yield a controller of a redis-server this test runs itself on a free port (stopped after)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port, procs = free_port(), []

    def start() -> None:
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
        procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        probe = redis.Redis(port=port, socket_connect_timeout=0.5)
        wait_until(lambda: _answers(probe), f"redis-server on port {port}")
        probe.close()

    def stop() -> None:
        procs[-1].terminate()
        procs[-1].wait(timeout=WAIT_S)

    start()
    yield {"url": f"redis://127.0.0.1:{port}/0", "start": start, "stop": stop}
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=WAIT_S)


def _answers(client: redis.Redis) -> bool:
    """Return True when a Redis server answers PING."""
    try:
        return bool(client.ping())
    except redis.exceptions.ConnectionError:
        return False


# --- ranking --------------------------------------------------------------------------------


def test_orders_candidates_by_the_model(client: TestClient, art: Artifacts) -> None:
    reordered = 0
    for user_id in sorted(art.candidates)[:8]:
        body = recommend(client, user_id, n=10)
        ids, retrieval = art.candidates[user_id]
        expected = art.model.score(art.features.features(user_id, ids, retrieval))
        got_scores = np.array([item["score"] for item in body["items"]], dtype=np.float32)
        got_ids = [item["item_id"] for item in body["items"]]
        assert body["run_id"] == "r1" and body["model_version"] == art.model.version and body["fallback"] is None
        assert len(got_ids) == 10 and set(got_ids) <= set(ids)
        assert np.all(np.diff(got_scores) <= 0), "scores must be descending"
        np.testing.assert_array_equal(got_scores, expected[[ids.index(i) for i in got_ids]])
        np.testing.assert_array_equal(got_scores, np.sort(expected)[::-1][:10])
        reordered += got_ids != ids[:10]
    assert reordered > 0, "the model never changed the retrieval order: it is not being used"


def test_n_limits_the_answer(client: TestClient, art: Artifacts) -> None:
    user_id = sorted(art.candidates)[0]
    assert len(recommend(client, user_id, n=1)["items"]) == 1
    assert len(recommend(client, user_id, n=100)["items"]) == N_CANDIDATES  # all the user has


def test_unknown_user_gets_popular_items(client: TestClient, art: Artifacts) -> None:
    body = recommend(client, "user-never-seen", n=5)
    assert body["fallback"] == "popular" and body["reason"] == "unknown_user"
    assert [item["item_id"] for item in body["items"]] == art.popular[:5]
    assert body["run_id"] is None


def test_pointer_switch_is_picked_up_without_restart(client: TestClient, cache: RedisCache, art: Artifacts) -> None:
    user_id = sorted(art.candidates)[0]
    assert recommend(client, user_id)["run_id"] == "r1"
    ids, scores = art.candidates[user_id]
    publish(cache, "r2", {user_id: (ids[-12:], scores[-12:])})  # the user's 12 weakest candidates only
    body = recommend(client, user_id)
    assert body["run_id"] == "r2"
    assert {item["item_id"] for item in body["items"]} <= set(ids[-12:])
    assert recommend(client, sorted(art.candidates)[1])["fallback"] == "popular"  # not in r2


# --- validation, health, metrics -----------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v1/users/bad%20id/recommendations",
        "/v1/users/" + "u" * 129 + "/recommendations",
        "/v1/users/caf%C3%A9/recommendations",
        "/v1/users/user-00001/recommendations?n=0",
        "/v1/users/user-00001/recommendations?n=101",
        "/v1/users/user-00001/recommendations?n=ten",
    ],
)
def test_invalid_requests_are_422(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 422
    assert response.json()["error"] == "RequestValidationError"


def test_health_readiness_and_metrics(client: TestClient, art: Artifacts) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready", "model_version": art.model.version}
    recommend(client, sorted(art.candidates)[0])
    recommend(client, "nobody")
    client.get("/v1/users/bad%20id/recommendations")
    text = client.get("/metrics").text
    assert 'nightscore_requests_total{endpoint="recommendations",status="200"} 2.0' in text
    assert 'nightscore_requests_total{endpoint="recommendations",status="422"} 1.0' in text
    assert 'nightscore_fallbacks_total{reason="unknown_user"} 1.0' in text
    assert 'nightscore_request_seconds_count{endpoint="recommendations"} 3.0' in text


# --- failures ---------------------------------------------------------------------------------


def test_unreachable_cache_is_503_without_fallback(art: Artifacts) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with TestClient(create_app(config_for(art, dead, "nstest-dead", fallback=False))) as client:
        response = client.get("/v1/users/user-00001/recommendations")
        assert response.status_code == 503 and response.json()["error"] == "CacheUnavailable"
        assert response.headers["retry-after"] == "1"
        assert client.get("/readyz").status_code == 503
        assert client.get("/healthz").status_code == 200


def test_unreachable_cache_falls_back_to_popular_when_configured(art: Artifacts) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with TestClient(create_app(config_for(art, dead, "nstest-dead"))) as client:
        body = recommend(client, "user-00001", n=3)
        assert body["fallback"] == "popular" and body["reason"] == "cache_unavailable"
        assert [item["item_id"] for item in body["items"]] == art.popular[:3]


def test_overload_is_429(cache: RedisCache, art: Artifacts) -> None:
    with TestClient(create_app(config_for(art, REDIS_URL, cache.prefix, max_in_flight=0))) as client:
        response = client.get("/v1/users/user-00001/recommendations")
        assert response.status_code == 429 and response.json()["error"] == "Overloaded"
        assert client.get("/healthz").status_code == 200  # probes are never refused
        assert 'endpoint="recommendations",status="429"} 1.0' in client.get("/metrics").text


class BlockingCache(RedisCache):
    """A RedisCache whose read waits for a release: a request that stays in flight on demand."""

    def __init__(self, url: str, prefix: str) -> None:
        super().__init__(url, prefix)
        self.entered, self.release = threading.Event(), threading.Event()

    def read(self, user_id: str) -> tuple[str, bytes] | None:
        self.entered.set()
        self.release.wait(WAIT_S)
        return super().read(user_id)


def test_requests_beyond_max_in_flight_are_429(cache: RedisCache, art: Artifacts) -> None:
    blocking = BlockingCache(REDIS_URL, cache.prefix)
    app = create_app(config_for(art, REDIS_URL, cache.prefix, max_in_flight=1), cache=blocking)
    user_id = sorted(art.candidates)[0]
    with TestClient(app) as client:
        first: dict[str, int] = {}
        path = f"/v1/users/{user_id}/recommendations"
        worker = threading.Thread(target=lambda: first.update(status=client.get(path).status_code))
        worker.start()
        assert blocking.entered.wait(WAIT_S)
        assert client.get(path).status_code == 429
        blocking.release.set()
        worker.join(WAIT_S)
        assert first == {"status": 200}
        assert client.get(path).status_code == 200
    blocking.close()


def test_redis_stopped_and_restarted_mid_test(own_redis: dict[str, object], art: Artifacts) -> None:
    url, prefix, user_id = str(own_redis["url"]), "nstest-own", sorted(art.candidates)[0]
    with RedisCache(url, prefix) as cache:
        publish(cache, "r1", art.candidates)
        with TestClient(create_app(config_for(art, url, prefix))) as client:
            assert recommend(client, user_id)["run_id"] == "r1"
            own_redis["stop"]()  # type: ignore[operator]
            down = recommend(client, user_id)
            assert down["fallback"] == "popular" and down["reason"] == "cache_unavailable"
            assert client.get("/readyz").status_code == 503
            own_redis["start"]()  # type: ignore[operator]
            assert client.get("/readyz").status_code == 200
            publish(cache, "r1", art.candidates)  # started without persistence: the data is gone
            back = recommend(client, user_id)
            assert back["fallback"] is None and back["run_id"] == "r1"
            text = client.get("/metrics").text
            assert 'nightscore_fallbacks_total{reason="cache_unavailable"} 1.0' in text


def test_missing_ranker_or_features_fail_at_creation(art: Artifacts, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no trained ranker"):
        create_app(config_for(art, str(tmp_path / "c.sqlite"), "p", lake_root=tmp_path / "empty-lake"))
    ranker_only = Lake(str(tmp_path / "ranker-only"))
    path = save_ranker(art.model, tmp_path / "ranker.pt")
    publish_ranker(ranker_only, art.model.version, path, metadata_path(path))
    with pytest.raises(ModelLoadError, match="no published run to serve"):  # a ranker, but no run anywhere
        create_app(config_for(art, str(tmp_path / "c.sqlite"), "p", lake_root=tmp_path / "ranker-only"))
    cache = SqliteCache(tmp_path / "c9.sqlite", "p")
    cache.write_version("r9", iter([("u", encode_candidates(["i"], [1.0]))]))
    cache.switch_current("r9")
    cache.close()
    with pytest.raises(ModelLoadError, match="run r9"):  # the cache names a run without feature tables
        create_app(config_for(art, str(tmp_path / "c9.sqlite"), "p"))

