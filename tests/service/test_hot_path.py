"""Service tests of the hot path: the fast recommendation answer, the Redis read's one deadline, frozen start-up objects.

A well-formed ``GET /v1/users/{id}/recommendations`` is answered below the guard without FastAPI's routing; the route
stays the reference for anything else, so both must give the same body. The Redis read runs without a socket
timeout (redis-py starts a task per timed send), bounded by one deadline instead.
"""

from __future__ import annotations

import asyncio
import gc
import math
import socket
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from threadpoolctl import threadpool_limits

from core.errors import CacheUnavailable
from serving.app import RECOMMEND_PREFIX, app_from_environment, create_app, recommendation_body, well_formed_request
from serving.ranking import Recommendation
from storage.cache import SqliteCache
from storage.cache_async import RedisReader
from storage.cache_redis import RedisCache
from tests.service.conftest import API_KEY, REDIS_URL, Served, keyed, own_redis_server, publish, service_config

ROUTE = "/v1/users/{user_id:path}/recommendations"
PASSWORD = "hot-path-test-password"


def _scope(path: str, query: bytes = b"", method: str = "GET", **extra: Any) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "query_string": query, "root_path": "", **extra}


@pytest.mark.parametrize(
    ("path", "query", "expected"),
    [
        ("/v1/users/u1/recommendations", b"", ("u1", 10)),
        ("/v1/users/u1/recommendations", b"n=1", ("u1", 1)),
        ("/v1/users/u1/recommendations", b"n=100", ("u1", 100)),
        ("/v1/users/a/b/recommendations", b"n=5", ("a/b", 5)),  # a '/' in the id (sent as %2F)
        ("/v1/users/a/recommendations/recommendations", b"", ("a/recommendations", 10)),  # greedy, as the route
    ],
)
def test_well_formed_requests_are_recognised(path: str, query: bytes, expected: tuple[str, int]) -> None:
    assert well_formed_request(_scope(path, query)) == expected


@pytest.mark.parametrize(
    ("path", "query", "method"),
    [
        ("/v1/users/u1/recommendations", b"n=0", "GET"),
        ("/v1/users/u1/recommendations", b"n=101", "GET"),
        ("/v1/users/u1/recommendations", b"n=0010", "GET"),
        ("/v1/users/u1/recommendations", b"n=+5", "GET"),
        ("/v1/users/u1/recommendations", b"n=5&n=6", "GET"),
        ("/v1/users/u1/recommendations", b"n=5&debug=1", "GET"),
        ("/v1/users/u1/recommendations", b"n=", "GET"),
        ("/v1/users/u1/recommendations", b"", "HEAD"),
        ("/v1/users/u1/recommendations", b"", "POST"),
        ("/v1/users//recommendations", b"", "GET"),
        ("/v1/users/recommendations", b"", "GET"),
        ("/v1/users/ bad/recommendations", b"", "GET"),
        ("/v1/users/bad\tid/recommendations", b"", "GET"),
        ("/v1/users/../recommendations", b"", "GET"),
        ("/v1/users/" + "u" * 257 + "/recommendations", b"", "GET"),
        ("/v1/users/u1/recommendations/", b"", "GET"),
        ("/v1/events", b"", "GET"),
    ],
)
def test_anything_else_is_left_to_the_route(path: str, query: bytes, method: str) -> None:
    assert well_formed_request(_scope(path, query, method)) is None


def test_a_mounted_app_is_left_to_the_route() -> None:
    assert well_formed_request(_scope("/api/v1/users/u1/recommendations", root_path="/api")) is None


@pytest.fixture
def sqlite_config(served: Served, tmp_path: Path) -> Any:
    """Return the options of a service over a SQLite cache with run r1 published."""
    location = str(tmp_path / "cache.sqlite")
    with SqliteCache(location, "nstest") as cache:
        publish(cache, "r1", served.entries)
    return service_config(location, "nstest", served.lake_root)


def test_the_fast_answer_is_the_routes_answer(sqlite_config: Any, served: Served) -> None:
    user = sorted(served.entries)[3]
    with keyed(create_app(sqlite_config)) as client:
        for who in (user, "nobody-known"):  # a ranked answer and a fallback
            fast = client.get(f"{RECOMMEND_PREFIX}{who}/recommendations?n=5")
            routed = client.get(f"{RECOMMEND_PREFIX}{who}/recommendations?n=5&unused=1")  # the route's to parse
            assert fast.status_code == routed.status_code == 200
            assert fast.content == routed.content
            assert fast.headers["content-type"] == routed.headers["content-type"] == "application/json"
            assert fast.headers["content-length"] == routed.headers["content-length"]


def test_a_well_formed_request_needs_no_route(sqlite_config: Any, served: Served) -> None:
    app = create_app(sqlite_config)
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != ROUTE]
    user = sorted(served.entries)[0]
    with keyed(app) as client:
        answered = client.get(f"{RECOMMEND_PREFIX}{user}/recommendations?n=3")
        assert answered.status_code == 200 and len(answered.json()["items"]) == 3
        assert client.get(f"{RECOMMEND_PREFIX}{user}/recommendations?n=3&unused=1").status_code == 404  # route gone
        wrong_key = client.get(f"{RECOMMEND_PREFIX}{user}/recommendations", headers={"Authorization": "Bearer nope"})
        assert wrong_key.status_code == 403  # the guard still runs first
        metrics = client.get("/metrics").text
    assert 'nightscore_requests_total{endpoint="recommendations",status="200"} 1.0' in metrics  # counted as before


def test_a_non_finite_score_is_refused_as_json_dumps_did() -> None:
    answer = Recommendation("u1", ["a", "b"], [1.0, math.nan], "r1", "v1")
    with pytest.raises(ValueError, match="non-finite"):
        recommendation_body(answer)
    assert recommendation_body(Recommendation("u1", ["a"], [0.5], "r1", "v1")).startswith(b'{"user_id":"u1"')


# --- the Redis read ---------------------------------------------------------------------------


async def _tasks_started_by(call: Coroutine[Any, Any, Any]) -> tuple[Any, int]:
    """Return what a coroutine returns and how many tasks the loop created while it ran."""
    loop, started = asyncio.get_running_loop(), []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        started.append(coro)
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    try:
        return await call, len(started)
    finally:
        loop.set_task_factory(None)


def test_a_redis_read_starts_no_task_of_its_own(served: Served, prefix: str) -> None:
    user = sorted(served.entries)[0]
    with RedisCache(REDIS_URL, prefix) as cache:
        publish(cache, "r1", {user: served.entries[user]})

    async def second_read() -> tuple[Any, int]:
        reader = RedisReader(REDIS_URL, prefix, 1.0, 4)
        try:
            await reader.read(user)  # the first one connects
            return await _tasks_started_by(reader.read(user))
        finally:
            await reader.close()

    found, tasks = asyncio.run(second_read())
    assert found.run_id == "r1" and found.entry == served.entries[user]
    assert tasks == 0  # redis-py's socket timeout wraps each send in asyncio.wait_for: one task per command


def test_concurrent_reads_share_one_connection_and_each_gets_its_own_entry(served: Served, prefix: str) -> None:
    users = sorted(served.entries)[:40]
    with RedisCache(REDIS_URL, prefix) as cache:
        publish(cache, "r1", {u: served.entries[u] for u in users})

    async def together() -> list[Any]:
        reader = RedisReader(REDIS_URL, prefix, 2.0, 4)
        try:
            return list(await asyncio.gather(*(reader.read(u) for u in [*users, "nobody", *users])))
        finally:
            await reader.close()

    found = asyncio.run(together())
    expected = [served.entries[u] for u in users]
    assert [f.entry for f in found] == [*expected, None, *expected]  # replies matched to their calls, in order


class _CountedWrites:
    """A transport that counts its writes and hands everything to the real one."""

    def __init__(self, transport: Any) -> None:
        self.transport, self.writes = transport, 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def test_the_reads_of_one_turn_go_out_in_one_write(served: Served, prefix: str) -> None:
    users = sorted(served.entries)[:12]
    with RedisCache(REDIS_URL, prefix) as cache:
        publish(cache, "r1", {u: served.entries[u] for u in users})

    async def one_turn() -> tuple[list[Any], int]:
        reader = RedisReader(REDIS_URL, prefix, 2.0, 4)
        try:
            await reader.read(users[0])  # connects
            protocol = reader._pipe._protocol  # type: ignore[union-attr]
            counted = protocol.transport = _CountedWrites(protocol.transport)  # type: ignore[union-attr]
            found = await asyncio.gather(*(reader.read(u) for u in users))  # all started in the same turn
            return list(found), counted.writes
        finally:
            await reader.close()

    found, writes = asyncio.run(one_turn())
    assert [f.entry for f in found] == [served.entries[u] for u in users]
    assert writes == 1  # twelve commands, one system call


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Yield a redis-server of this test's own, with a password (stopped after); it can be restarted."""
    with own_redis_server(tmp_path, PASSWORD) as server:
        yield server


def test_the_pipelined_read_logs_in_selects_its_db_and_recovers(own_redis: dict[str, Any], served: Served) -> None:
    url, user = f"redis://:{PASSWORD}@127.0.0.1:{own_redis['port']}/3", sorted(served.entries)[0]

    def publish_r1() -> None:
        with RedisCache(url, "nstest-own") as cache:
            publish(cache, "r1", {user: served.entries[user]})

    async def reads() -> list[Any]:
        reader, got = RedisReader(url, "nstest-own", 2.0, 2), []
        try:
            got.append(await reader.read(user))  # logged in, database 3
            redis.Redis(port=own_redis["port"], password=PASSWORD).script_flush()
            got.append(await reader.read(user))  # the script lost: sent in full
            own_redis["stop"]()
            with pytest.raises(CacheUnavailable):
                await reader.read(user)
            own_redis["start"]()
            publish_r1()
            got.append(await reader.read(user))  # a new connection after the restart
            return got
        finally:
            await reader.close()

    publish_r1()
    assert [f.entry for f in asyncio.run(reads())] == [served.entries[user]] * 3


def test_a_wrong_password_makes_the_cache_unavailable(own_redis: dict[str, Any]) -> None:
    async def read() -> None:
        reader = RedisReader(f"redis://:wrong@127.0.0.1:{own_redis['port']}/0", "nstest-own", 1.0, 2)
        try:
            with pytest.raises(CacheUnavailable, match="refused"):
                await reader.read("u1")
        finally:
            await reader.close()

    asyncio.run(read())


@pytest.fixture
def hung_redis() -> Iterator[str]:
    """Yield the URL of a TCP server that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    listener.close()


def test_a_hung_redis_read_fails_within_its_deadline(hung_redis: str) -> None:
    async def read() -> float:
        reader = RedisReader(hung_redis, "nstest-hung", 0.2, 2)
        started = time.perf_counter()
        try:
            with pytest.raises(CacheUnavailable):
                await reader.read("u1")
            return time.perf_counter() - started
        finally:
            await reader.close()

    assert asyncio.run(read()) < 0.2 + 0.5  # the deadline, plus scheduling noise on a busy host


# --- the worker process -------------------------------------------------------------------------


def test_a_worker_freezes_its_start_up_objects(sqlite_config: Any, served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = sqlite_config.settings
    monkeypatch.setenv("NIGHTSCORE_LAKE_URL", str(served.lake_root))
    monkeypatch.setenv("NIGHTSCORE_CACHE_URL", settings.cache.url)
    monkeypatch.setenv("NIGHTSCORE_CACHE_PREFIX", settings.cache.prefix)
    monkeypatch.setenv("NIGHTSCORE_SERVING_API_KEYS", f'["{API_KEY}"]')
    gc.unfreeze()
    try:
        with threadpool_limits(limits=None):  # the factory sets this process's BLAS threads: restored on exit
            app = app_from_environment()
        recommender = app.state.recommender
        assert gc.get_freeze_count() > 0  # full collections no longer walk the modules and the loaded run
        assert not any(o is recommender for o in gc.get_objects())  # frozen objects are in no generation
    finally:
        gc.unfreeze()
