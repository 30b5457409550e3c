"""Service tests of the co-visitation boost (NIGHTSCORE_SERVING_COOC_BOOST) on both caches: a click lifts its neighbours."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from fastapi.testclient import TestClient

from serving.app import create_app
from serving.ranking import load_run
from storage.artifacts import publish_serving, read_serving
from storage.cache import CandidateCache, SqliteCache
from storage.cache_redis import RedisCache
from storage.lake import Lake
from tests.service.conftest import REDIS_URL, K, Served, keyed, publish, service_config
from tests.service.test_events import event

BOOST = 5.0


@pytest.fixture(params=["sqlite", "redis"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """Return (cache location, key prefix) of each backend."""
    if request.param == "sqlite":
        return str(tmp_path / "cache.sqlite"), "nstest"
    return REDIS_URL, str(request.getfixturevalue("prefix"))


@contextmanager
def _clients(served: Served, location: tuple[str, str], run_id: str, *boosts: float) -> Iterator[list[TestClient]]:
    """Yield one client per boost, all over the same cache with run_id published and current."""
    url, prefix = location
    cache: CandidateCache = RedisCache(url, prefix) if url.startswith("redis://") else SqliteCache(url, prefix)
    with cache:
        publish(cache, run_id, served.entries)
    with ExitStack() as stack:
        yield [
            stack.enter_context(keyed(create_app(service_config(url, prefix, served.lake_root, cooc_boost=b)))) for b in boosts
        ]


def ranked(client: TestClient, user_id: str) -> dict[str, Any]:
    """Return the user's whole answer (all K candidates) as {item_id: score}, in rank order, and its run."""
    response = client.get(f"/v1/users/{user_id}/recommendations", params={"n": K})
    assert response.status_code == 200, response.text
    body = response.json()
    return {"run_id": body["run_id"], "items": {item["item_id"]: item["score"] for item in body["items"]}}


def pick(served: Served, client: TestClient) -> tuple[str, str, str]:
    """Return (user, X, C): X not a candidate of the user, C the deepest-ranked candidate (never first) X's top neighbour."""
    top = served.neighbours.group_by("item_id", maintain_order=True).first()  # rows are best first per item
    best: tuple[int, str, str, str] | None = None
    for user_id in sorted(served.entries)[:20]:
        order = list(ranked(client, user_id)["items"])
        found = top.filter(~pl.col("item_id").is_in(order) & pl.col("neighbour_id").is_in(order[1:]))
        for item_x, item_c in found.select("item_id", "neighbour_id").rows():
            if best is None or order.index(item_c) > best[0]:
                best = (order.index(item_c), user_id, item_x, item_c)
    assert best is not None, "no user has a candidate that is the top neighbour of an item outside their list"
    return best[1], best[2], best[3]


def test_a_click_lifts_its_top_neighbour_with_the_boost_on_and_changes_nothing_with_it_off(
    served: Served, location: tuple[str, str]
) -> None:
    with _clients(served, location, "r1", 0.0, BOOST) as (off, on):
        user_id, clicked, neighbour = pick(served, off)
        before = ranked(off, user_id)["items"]
        assert ranked(on, user_id)["items"] == before  # no fresh event: no boost
        assert off.post("/v1/events", json=event(user_id, clicked)).status_code == 202
        assert ranked(off, user_id)["items"] == before  # boost 0: the ranking is the ranker's
        after = ranked(on, user_id)["items"]
        assert list(after).index(neighbour) < list(before).index(neighbour)
        assert after[neighbour] == pytest.approx(before[neighbour] + BOOST, rel=1e-5)  # weight 1: X's top neighbour
        assert set(after) == set(before) and all(after[i] >= before[i] - 1e-6 for i in before)


def test_a_run_without_neighbours_serves_normally_with_the_boost_on(served: Served, location: tuple[str, str]) -> None:
    with _clients(served, location, "r2", 0.0, BOOST) as (off, on):
        user_id, clicked, _ = pick(served, off)
        assert off.post("/v1/events", json=event(user_id, clicked)).status_code == 202
        answer = ranked(on, user_id)
        assert answer["run_id"] == "r2" and answer["items"] == ranked(off, user_id)["items"]


def test_neighbours_load_only_when_boosting_once_per_run_and_an_unreadable_file_only_loses_the_boost(served: Served) -> None:
    lake = Lake(str(served.lake_root))
    serving = read_serving(lake, "r1")
    assert serving is not None
    assert load_run(lake, "r1").neighbours is None  # boost off: not loaded
    loaded = load_run(lake, "r1", neighbours={}).neighbours
    assert loaded is not None and loaded.size == served.neighbours.height
    known = {str(serving["neighbours"]): loaded}
    assert load_run(lake, "r1", neighbours=known).neighbours is loaded  # a refresh does not re-read them
    lake.write_parquet(pl.DataFrame({"item_id": ["a"]}), lake.uri("serving", "r3", "neighbours.parquet"))
    publish_serving(lake, "r3", {**serving, "neighbours": "serving/r3/neighbours.parquet"}, latest=False)
    run = load_run(lake, "r3", neighbours={})
    assert run.neighbours is None and run.scorer is not None
