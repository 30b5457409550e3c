"""Service tests of POST /v1/events on both event stores (SQLite file, real Redis): validation, bounds, exclusion."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from serving.app import create_app
from storage.cache import CandidateCache, SqliteCache
from storage.cache_async import open_stores
from storage.cache_redis import RedisCache
from storage.candidate_payload import decode_entry
from tests.service.conftest import REDIS_URL, Served, keyed, publish, service_config


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
    return keyed(create_app(service_config(url, prefix, served.lake_root, **overrides)))


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


def test_events_before_the_runs_candidates_do_not_exclude(served: Served, location: tuple[str, str]) -> None:
    user_id = sorted(served.entries)[5]
    with _client(served, location, events_max_age_s=1e9) as client:  # the demo run's cut-off is weeks ago
        before = top_ids(client, user_id)
        old = datetime.fromisoformat(served.computed_at) - timedelta(hours=1)  # the run already knew it
        assert client.post("/v1/events", json=event(user_id, before[0], ts=old)).status_code == 202
        assert top_ids(client, user_id) == before


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"user_id": "u1", "item_id": "i1", "event": "like", "ts": "2026-11-30T10:00:00Z"}, "event"),
        ({"user_id": " u1", "item_id": "i1", "event": "click", "ts": "2026-11-30T10:00:00Z"}, "user_id"),
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


def stored_items(location: tuple[str, str]) -> list[str]:
    """Return the item ids of today's events the store holds (what `nightscore events export` would write)."""
    reader, store = open_stores(location[0], location[1], 1.0, 2, 3600.0, 1000)

    async def today() -> list[str]:
        events = await store.day(datetime.now(UTC).date())
        await store.close()
        await reader.close()
        return [e.item_id for e in events]

    return asyncio.run(today())


def test_a_full_store_refuses_with_429_and_keeps_what_it_has(served: Served, location: tuple[str, str]) -> None:
    items = served.item_ids[:5]
    with _client(served, location, events_max=3) as client:
        statuses = [client.post("/v1/events", json=event("u1", item)).status_code for item in items]
        assert statuses == [202, 202, 202, 429, 429]
        assert client.post("/v1/events", json=event("u1", items[4])).json()["error"] == "EventsFull"
    assert stored_items(location) == items[:3]  # nothing silently dropped or replaced


def dropped_count(client: TestClient, reason: str) -> float:
    """Return nightscore_events_dropped_total of a reason from /metrics (0 before the first)."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f'nightscore_events_dropped_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_events_of_unknown_items_are_dropped_counted_and_never_stored(
    client: TestClient, served: Served, location: tuple[str, str]
) -> None:
    fake = [f"new-item-{k}" for k in range(30)]
    answers = [client.post("/v1/events", json=event(f"fake-user-{k % 6}", item)) for k, item in enumerate(fake)]
    assert {(a.status_code, a.json()["status"], a.json()["reason"]) for a in answers} == {(202, "dropped", "unknown_item")}
    known = client.post("/v1/events", json=event("user-00001", served.item_ids[0]))
    assert known.status_code == 202 and known.json() == {"status": "accepted"}
    assert dropped_count(client, "unknown_item") == 30
    assert stored_items(location) == [served.item_ids[0]]


def test_an_exact_duplicate_is_stored_once(client: TestClient, served: Served, location: tuple[str, str]) -> None:
    body = event("user-00002", served.item_ids[1])
    first, again = client.post("/v1/events", json=body), client.post("/v1/events", json=body)
    assert first.json() == {"status": "accepted"} and again.json() == {"status": "dropped", "reason": "duplicate"}
    later = client.post("/v1/events", json=body | {"event": "purchase"})  # another kind of event is another event
    assert later.json() == {"status": "accepted"} and dropped_count(client, "duplicate") == 1
    assert stored_items(location) == [served.item_ids[1]] * 2


@pytest.mark.parametrize("ts", ["NaN", "Infinity", "-Infinity", "1e300"])
def test_a_non_finite_ts_is_422_not_500(client: TestClient, ts: str) -> None:
    raw = '{"user_id": "u1", "item_id": "item-000001", "event": "click", "ts": TS}'.replace("TS", ts)
    response = client.post("/v1/events", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert [e["loc"] for e in response.json()["detail"]] == [["body", "ts"]]


@pytest.mark.parametrize("ts", ["1970-01-01T00:00:00Z", "0", "two days ago"])
def test_an_event_older_than_the_max_age_is_422(client: TestClient, served: Served, ts: str) -> None:
    if ts == "two days ago":  # made here, not at collection: every xdist worker must collect the same test ids
        ts = (datetime.now(UTC) - timedelta(days=2)).isoformat()
    body = {"user_id": "u1", "item_id": served.item_ids[0], "event": "click", "ts": ts}
    response = client.post("/v1/events", json=body)
    assert response.status_code == 422 and "in the past" in response.json()["detail"][0]["msg"]


def test_a_bad_id_is_never_echoed_back_in_full(client: TestClient) -> None:
    long_id = "x" * 3000 + "\n"
    response = client.post("/v1/events", json=event(long_id, "item-000001"))
    assert response.status_code == 422 and len(response.text) < 600, response.text
    path = client.get("/v1/users/" + "u" * 10_000 + "/recommendations")
    assert path.status_code == 422 and len(path.text) < 600 and "u" * 100 not in path.text


def test_exclusion_can_be_turned_off(served: Served, location: tuple[str, str]) -> None:
    user_id = sorted(served.entries)[6]
    with _client(served, location, exclude_recent=False) as client:
        before = top_ids(client, user_id)
        client.post("/v1/events", json=event(user_id, before[0]))
        assert top_ids(client, user_id) == before
    assert before[0] in decode_entry(served.entries[user_id]).item_ids
