"""Service tests of the online ranker over a real cache (the embedded SQLite file and the real Redis on loopback).

The served run comes from the candidate stage on demo data (tests/service/conftest.py): its LightGBM ranker in
the lake, one encoded entry per user. One test runs its own redis-server, stops it mid-test and starts it again.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from core.errors import ModelLoadError
from serving.app import create_app
from serving.config import ServingConfig
from storage.cache import CandidateCache, SqliteCache
from storage.cache_async import Found, SqliteReader
from storage.cache_redis import RedisCache
from storage.candidate_payload import decode_entry
from storage.events import SqliteEvents
from tests.service.conftest import REDIS_URL, K, Served, free_port, keyed, own_redis_server, publish, service_config

WAIT_S = 20.0  # deadlock guard only


def config_for(served: Served, location: str, prefix: str, lake_root: Path | None = None, **overrides: Any) -> ServingConfig:
    """Return a ServingConfig over the served lake (or another one) and the given cache, with the test key."""
    return service_config(location, prefix, lake_root or served.lake_root, **overrides)


def recommend(client: TestClient, user_id: str, n: int = 10) -> dict[str, Any]:
    """GET one user's recommendations and return the JSON body of a 200."""
    response = client.get(f"/v1/users/{user_id}/recommendations", params={"n": n})
    assert response.status_code == 200, response.text
    return dict(response.json())


def wait_until(condition: Any, what: str) -> None:
    """Poll condition() until true or fail after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture(params=["sqlite", "redis"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """Return (cache location, key prefix) of each backend: a SQLite file, then the shared Redis."""
    if request.param == "sqlite":
        return str(tmp_path / "cache.sqlite"), "nstest"
    return REDIS_URL, str(request.getfixturevalue("prefix"))


@pytest.fixture
def cache(location: tuple[str, str], served: Served) -> Iterator[CandidateCache]:
    """Yield the real cache of the backend with run r1 published and current."""
    url, prefix = location
    opened: CandidateCache = RedisCache(url, prefix) if url.startswith("redis://") else SqliteCache(url, prefix)
    with opened:
        publish(opened, "r1", served.entries)
        yield opened


@pytest.fixture
def client(cache: CandidateCache, location: tuple[str, str], served: Served) -> Iterator[TestClient]:
    """Yield a client of the service over the published cache."""
    with keyed(create_app(config_for(served, location[0], location[1]))) as test_client:
        yield test_client


# --- ranking --------------------------------------------------------------------------------


def test_orders_candidates_by_the_runs_ranker(client: TestClient, served: Served) -> None:
    reordered = 0
    for user_id in sorted(served.entries)[:8]:
        body = recommend(client, user_id, n=10)
        entry = decode_entry(served.entries[user_id])
        expected = served.scorer.predict(entry.features)
        got_ids = [item["item_id"] for item in body["items"]]
        got_scores = np.array([item["score"] for item in body["items"]], dtype=np.float32)
        assert body["run_id"] == "r1" and body["fallback"] is None and body["model_version"].startswith("lightgbm-")
        assert len(got_ids) == 10 and set(got_ids) <= set(entry.item_ids)
        assert np.all(np.diff(got_scores) <= 0), "scores must be descending"
        np.testing.assert_allclose(got_scores, expected[[entry.item_ids.index(i) for i in got_ids]], rtol=1e-6)
        np.testing.assert_allclose(got_scores, np.sort(expected)[::-1][:10], rtol=1e-6)
        reordered += got_ids != entry.item_ids[:10]
    assert reordered > 0, "the ranker never changed the fused order: it is not being used"


def test_n_limits_the_answer(client: TestClient, served: Served) -> None:
    user_id = sorted(served.entries)[0]
    assert len(recommend(client, user_id, n=1)["items"]) == 1
    assert len(recommend(client, user_id, n=100)["items"]) == len(decode_entry(served.entries[user_id]).item_ids) == K


def test_unknown_user_gets_the_runs_trending_items(client: TestClient, served: Served) -> None:
    body = recommend(client, "user-never-seen", n=5)
    assert body["fallback"] == "popular" and body["reason"] == "unknown_user"
    assert [item["item_id"] for item in body["items"]] == served.fallback[:5]
    assert body["run_id"] is None


def test_pointer_switch_is_picked_up_without_restart(client: TestClient, cache: CandidateCache, served: Served) -> None:
    first, second = sorted(served.entries)[:2]
    assert recommend(client, first)["run_id"] == "r1"
    publish(cache, "r2", {first: served.entries[second]})  # r2 gives the first user the second user's candidates
    body = recommend(client, first)
    assert body["run_id"] == "r2"
    assert {item["item_id"] for item in body["items"]} <= set(decode_entry(served.entries[second]).item_ids)
    assert recommend(client, second)["reason"] == "unknown_user"  # not in r2


# --- validation, health, metrics -----------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v1/users/%20bad/recommendations",
        "/v1/users/bad%09id/recommendations",
        "/v1/users/" + "u" * 257 + "/recommendations",
        "/v1/users/u%E2%80%8B1/recommendations",  # a zero-width space
        "/v1/users/user-00001/recommendations?n=0",
        "/v1/users/user-00001/recommendations?n=101",
        "/v1/users/user-00001/recommendations?n=ten",
    ],
)
def test_invalid_requests_are_422(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 422
    assert response.json()["error"] == "RequestValidationError"


def test_health_readiness_and_metrics(client: TestClient, served: Served) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz").json()
    assert ready["status"] == "ready" and ready["model_version"].startswith("lightgbm-")
    recommend(client, sorted(served.entries)[0])
    recommend(client, "nobody")
    client.get("/v1/users/bad%09id/recommendations")
    text = client.get("/metrics").text
    assert 'nightscore_requests_total{endpoint="recommendations",status="200"} 2.0' in text
    assert 'nightscore_requests_total{endpoint="recommendations",status="422"} 1.0' in text
    assert 'nightscore_fallbacks_total{reason="unknown_user"} 1.0' in text
    assert 'nightscore_request_seconds_count{endpoint="recommendations"} 3.0' in text


# --- failures ---------------------------------------------------------------------------------


def test_unreachable_cache_is_503_without_fallback(served: Served) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with keyed(create_app(config_for(served, dead, "nstest-dead", fallback=False))) as client:
        response = client.get("/v1/users/user-00001/recommendations")
        assert response.status_code == 503 and response.json()["error"] == "CacheUnavailable"
        assert response.headers["retry-after"] == "1"
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 503  # no fallback: this replica cannot answer


def test_unreachable_cache_falls_back_to_trending_when_configured(served: Served) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with keyed(create_app(config_for(served, dead, "nstest-dead"))) as client:
        body = recommend(client, "user-00001", n=3)
        assert body["fallback"] == "popular" and body["reason"] == "cache_unavailable"
        assert [item["item_id"] for item in body["items"]] == served.fallback[:3]
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "degraded" and ready.json()["cache"] == "unavailable"
        assert "nightscore_degraded 1.0" in client.get("/metrics").text


@pytest.fixture
def hung_redis() -> Iterator[str]:
    """Yield the URL of a TCP server that accepts connections and never answers (a hung Redis)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    listener.close()


def test_a_hung_cache_costs_one_timeout_per_breaker_period_not_per_request(served: Served, hung_redis: str) -> None:
    config = config_for(served, hung_redis, "nstest-hung", cache_timeout_s=0.3, breaker_open_s=30.0)
    with keyed(create_app(config)) as client:
        started = time.perf_counter()
        bodies = [recommend(client, f"user-{i:05d}") for i in range(20)]
        elapsed = time.perf_counter() - started
    assert {b["reason"] for b in bodies} == {"cache_unavailable"}
    assert elapsed < 0.3 * 3, f"{elapsed:.2f} s for 20 requests: the breaker did not open"


def test_overload_is_429(cache: CandidateCache, location: tuple[str, str], served: Served) -> None:
    with keyed(create_app(config_for(served, location[0], location[1], max_in_flight=0))) as client:
        response = client.get("/v1/users/user-00001/recommendations")
        assert response.status_code == 429 and response.json()["error"] == "Overloaded"
        assert client.get("/healthz").status_code == 200  # probes are never refused
        assert 'endpoint="recommendations",status="429"} 1.0' in client.get("/metrics").text


class BlockingReader(SqliteReader):
    """The real SQLite read path, held until released: a request that stays in flight on demand."""

    def __init__(self, path: str, prefix: str) -> None:
        super().__init__(SqliteCache(path, prefix), None)
        self.entered, self.release = threading.Event(), threading.Event()

    async def read(self, user_id: str) -> Found:
        self.entered.set()
        while not self.release.is_set():
            await asyncio.sleep(0.005)
        return await super().read(user_id)


def test_requests_beyond_max_in_flight_are_429(served: Served, tmp_path: Path) -> None:
    path = str(tmp_path / "cache.sqlite")
    with SqliteCache(path, "nstest") as cache:
        publish(cache, "r1", served.entries)
    blocking = BlockingReader(path, "nstest")
    app = create_app(
        config_for(served, path, "nstest", max_in_flight=1), stores=lambda: (blocking, SqliteEvents(path, 60.0, 100))
    )
    url = f"/v1/users/{sorted(served.entries)[0]}/recommendations"
    with keyed(app) as client:
        first: dict[str, int] = {}
        worker = threading.Thread(target=lambda: first.update(status=client.get(url).status_code))
        worker.start()
        assert blocking.entered.wait(WAIT_S)
        assert client.get(url).status_code == 429
        blocking.release.set()
        worker.join(WAIT_S)
        assert first == {"status": 200}
        assert client.get(url).status_code == 200


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Yield a controller of a redis-server this test runs itself on a free port (stopped after)."""
    with own_redis_server(tmp_path) as server:
        yield server


def test_redis_stopped_and_restarted_mid_test(own_redis: dict[str, Any], served: Served) -> None:
    url, prefix, user_id = str(own_redis["url"]), "nstest-own", sorted(served.entries)[0]
    with RedisCache(url, prefix) as cache:
        publish(cache, "r1", served.entries)
        with keyed(create_app(config_for(served, url, prefix))) as client:
            assert recommend(client, user_id)["run_id"] == "r1"
            own_redis["stop"]()
            down = recommend(client, user_id)
            assert down["fallback"] == "popular" and down["reason"] == "cache_unavailable"
            assert client.get("/readyz").json()["status"] == "degraded"  # the fallback answers: stay in the balancer
            own_redis["start"]()
            wait_until(lambda: client.get("/readyz").json()["cache"] != "unavailable", "the cache answering again")
            empty = client.get("/readyz")  # back, but empty (started without persistence): answers, degraded
            assert empty.status_code == 200 and empty.json() | {"model_version": None} == {
                "status": "degraded",
                "cache": "no_candidates_version",
                "model_version": None,
            }
            assert "nightscore_degraded 1.0" in client.get("/metrics").text
            assert recommend(client, user_id)["reason"] == "no_candidates_version"  # not "unknown_user"
            publish(cache, "r1", served.entries)
            assert client.get("/readyz").json()["status"] == "ready"
            assert "nightscore_degraded 0.0" in client.get("/metrics").text
            back = recommend(client, user_id)
            assert back["fallback"] is None and back["run_id"] == "r1"
            assert 'nightscore_fallbacks_total{reason="cache_unavailable"} 1.0' in client.get("/metrics").text


def test_no_published_run_or_a_run_without_serving_artifacts_fail_at_creation(served: Served, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no published run to serve"):
        create_app(config_for(served, str(tmp_path / "c.sqlite"), "p", lake_root=tmp_path / "empty-lake"))
    with SqliteCache(tmp_path / "c9.sqlite", "p") as cache:
        publish(cache, "r9", {"u": served.entries[sorted(served.entries)[0]]})
    with pytest.raises(ModelLoadError, match="run r9"):  # the cache names a run the lake has no serving.json for
        create_app(config_for(served, str(tmp_path / "c9.sqlite"), "p"))
