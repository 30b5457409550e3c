"""Service tests of POST /v1/events on both event stores (SQLite file, real Redis): validation, bounds, exclusion."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.settings import CacheSettings, LakeSettings, Settings
from serving.app import create_app
from serving.config import serving_config
from storage.cache import CandidateCache, RedisCache, SqliteCache
from storage.cache_async import open_stores
from storage.candidate_payload import decode_entry
from tests.service.conftest import REDIS_URL, Served, publish


@pytest.fixture(params=["sqlite", "redis"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """Return (cache location, key prefix) of each backend."""
    if request.param == "sqlite":
        return str(tmp_path / "cache.sqlite"), "nstest"
    return REDIS_URL, str(request.getfixturevalue("prefix"))


def _client(served: Served, location: tuple[str, str], **overrides: Any) -> TestClient:
    url, prefix = location
    cache: CandidateCache = RedisCache(url, prefix) if url.startswith("redis://") else SqliteCache(url, prefix)
    with cache:
        publish(cache, "r1", served.entries)
    settings = Settings(cache=CacheSettings(url=url, prefix=prefix), lake=LakeSettings(url=str(served.lake_root)))
    return TestClient(create_app(serving_config(settings, **overrides)))


@pytest.fixture
def client(served: Served, location: tuple[str, str]) -> Iterator[TestClient]:
    """Yield a client of the service with run r1 published."""
    with _client(served, location) as test_client:
        yield test_client


def event(user_id: str, item_id: str, kind: str = "click", ts: datetime | None = None) -> dict[str, str]:
    """Return an event body."""
    return {"user_id": user_id, "item_id": item_id, "event": kind, "ts": (ts or datetime.now(UTC)).isoformat()}


def top_ids(client: TestClient, user_id: str, n: int = 10) -> list[str]:
    """Return the item ids recommended to a user."""
    response = client.get(f"/v1/users/{user_id}/recommendations", params={"n": n})
    assert response.status_code == 200, response.text
    return [item["item_id"] for item in response.json()["items"]]


def test_a_clicked_item_is_no_longer_recommended(client: TestClient, served: Served) -> None:
    user_id = sorted(served.entries)[3]
    before = top_ids(client, user_id)
    assert client.post("/v1/events", json=event(user_id, before[0])).status_code == 202
    after = top_ids(client, user_id)
    assert before[0] not in after and after == [i for i in top_ids(client, user_id, 11) if i != before[0]][:10]
    assert after[:9] == before[1:10]
    other = sorted(served.entries)[4]
    assert top_ids(client, other) == top_ids(client, other)  # nobody else is affected


def test_events_before_the_runs_candidates_do_not_exclude(client: TestClient, served: Served) -> None:
    user_id = sorted(served.entries)[5]
    before = top_ids(client, user_id)
    old = datetime.fromisoformat(served.computed_at) - timedelta(hours=1)  # the run already knew it
    assert client.post("/v1/events", json=event(user_id, before[0], ts=old)).status_code == 202
    assert top_ids(client, user_id) == before


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"user_id": "u1", "item_id": "i1", "event": "like", "ts": "2026-11-30T10:00:00Z"}, "event"),
        ({"user_id": "u 1", "item_id": "i1", "event": "click", "ts": "2026-11-30T10:00:00Z"}, "user_id"),
        ({"user_id": "u1", "item_id": "i1", "event": "click", "ts": "2026-11-30T10:00:00"}, "ts"),  # no time zone
        ({"user_id": "u1", "item_id": "i1", "event": "click", "ts": "2999-01-01T00:00:00Z"}, "ts"),  # the future
        ({"user_id": "u1", "item_id": "i1", "event": "click"}, "ts"),
        ({"user_id": "u1", "item_id": "i1", "event": "click", "ts": "2026-11-30T10:00:00Z", "extra": 1}, "extra"),
    ],
)
def test_bad_events_are_422_with_the_reason(client: TestClient, body: dict[str, object], reason: str) -> None:
    response = client.post("/v1/events", json=body)
    assert response.status_code == 422, response.text
    assert reason in {str(loc) for error in response.json()["detail"] for loc in error["loc"]}


def test_an_oversized_body_is_413(client: TestClient) -> None:
    body = event("u1", "i1") | {"user_id": "u" * 5000}
    assert client.post("/v1/events", json=body).status_code == 413


def test_a_full_store_refuses_with_429_and_keeps_what_it_has(served: Served, location: tuple[str, str]) -> None:
    with _client(served, location, events_max=3) as client:
        statuses = [client.post("/v1/events", json=event("u1", f"i{k}")).status_code for k in range(5)]
        assert statuses == [202, 202, 202, 429, 429]
        assert client.post("/v1/events", json=event("u1", "i9")).json()["error"] == "EventsFull"
    reader, store = open_stores(location[0], location[1], 1.0, 2, 3600.0, 3)

    async def today() -> list[str]:
        events = await store.day(date.today())
        await store.close()
        await reader.close()
        return [e.item_id for e in events]

    assert asyncio.run(today()) == ["i0", "i1", "i2"]  # nothing silently dropped or replaced


def test_exclusion_can_be_turned_off(served: Served, location: tuple[str, str]) -> None:
    user_id = sorted(served.entries)[6]
    with _client(served, location, exclude_recent=False) as client:
        before = top_ids(client, user_id)
        client.post("/v1/events", json=event(user_id, before[0]))
        assert top_ids(client, user_id) == before
    assert before[0] in decode_entry(served.entries[user_id]).item_ids
