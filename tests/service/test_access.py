"""Service tests of who may call the ranker and how often (serving/guard.py), and of the one id rule across the stack.

Keys: writes (POST /v1/events) and /metrics always need one, recommendations unless open_reads, probes never; no
keys at all refuses to start unless allow_no_keys. Rate limits: a token bucket per client, 429 with Retry-After.
Ids: whatever the input contracts accept, the ranker serves and the events API takes; whatever they refuse, both
refuse (core/ids.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import polars as pl
import pytest
from fastapi.testclient import TestClient

from core.errors import UsageError
from data_contracts.inputs import InputRules, validate_interactions, validate_items
from serving.app import create_app
from serving.guard import TokenBuckets
from storage.cache import SqliteCache
from tests.service.conftest import API_KEY, AUTH, Served, keyed, publish, service_config

OTHER_KEY = "another-test-key-0123456789"


@pytest.fixture
def cache_path(served: Served, tmp_path: Path) -> str:
    """Return a SQLite cache with run r1 published."""
    path = str(tmp_path / "cache.sqlite")
    with SqliteCache(path, "nstest") as cache:
        publish(cache, "r1", served.entries)
    return path


def app_for(served: Served, cache_path: str, **overrides: Any) -> Any:
    """Return a service over the published cache with the test options, then overrides."""
    return create_app(service_config(cache_path, "nstest", served.lake_root, **overrides))


@pytest.fixture
def anonymous(served: Served, cache_path: str) -> Iterator[TestClient]:
    """Yield a client that sends no key, of a service that has keys."""
    with TestClient(app_for(served, cache_path)) as client:
        yield client


def event(user_id: str, item_id: str) -> dict[str, str]:
    """Return an event body stamped now."""
    return {"user_id": user_id, "item_id": item_id, "event": "click", "ts": datetime.now(UTC).isoformat()}


def recommendations_path(user_id: str) -> str:
    """Return the recommendations path of a user id, percent-encoded as a client sends it."""
    return f"/v1/users/{quote(user_id, safe='')}/recommendations"


# --- keys -----------------------------------------------------------------------------------


def test_without_keys_the_service_refuses_to_start_unless_allowed(served: Served, cache_path: str) -> None:
    with pytest.raises(UsageError, match="NIGHTSCORE_SERVING_API_KEYS"):
        app_for(served, cache_path, api_keys=[])
    with TestClient(app_for(served, cache_path, api_keys=[], allow_no_keys=True)) as client:
        assert client.get(recommendations_path(sorted(served.entries)[0])).status_code == 200
        assert client.post("/v1/events", json=event("u1", served.item_ids[0])).status_code == 202
        assert client.get("/metrics").status_code == 200


def test_an_unauthenticated_write_is_401_and_a_wrong_key_403(anonymous: TestClient, served: Served) -> None:
    body = event("u1", served.item_ids[0])
    refused = anonymous.post("/v1/events", json=body)
    assert refused.status_code == 401 and refused.json()["error"] == "Unauthenticated"
    assert refused.headers["www-authenticate"] == "Bearer"
    assert anonymous.get("/metrics").status_code == 401
    assert anonymous.get(recommendations_path("user-00001")).status_code == 401
    assert anonymous.post("/v1/events", json=body, headers={"Authorization": "Bearer wrong-key-000000000"}).status_code == 403
    assert anonymous.post("/v1/events", json=body, headers={"Authorization": f"Basic {API_KEY}"}).status_code == 401
    assert anonymous.post("/v1/events", json=body, headers={"X-API-Key": API_KEY}).status_code == 202
    assert anonymous.post("/v1/events", json=event("u2", served.item_ids[0]), headers=AUTH).status_code == 202
    assert anonymous.get("/healthz").status_code == 200 and anonymous.get("/readyz").status_code == 200  # probes
    assert 'endpoint="v1/events",status="401"} 2.0' in anonymous.get("/metrics", headers=AUTH).text


def test_open_reads_serve_recommendations_without_a_key_and_nothing_else(served: Served, cache_path: str) -> None:
    with TestClient(app_for(served, cache_path, open_reads=True)) as client:
        assert client.get(recommendations_path(sorted(served.entries)[0])).status_code == 200
        assert client.post("/v1/events", json=event("u1", served.item_ids[0])).status_code == 401
        assert client.get("/metrics").status_code == 401


# --- rate limits ------------------------------------------------------------------------------


def test_a_rate_limited_client_gets_429_with_retry_after(served: Served, cache_path: str) -> None:
    app = app_for(served, cache_path, api_keys=[API_KEY, OTHER_KEY], rate_limit_per_s=0.5, rate_limit_burst=3)
    with keyed(app) as client:
        path = recommendations_path(sorted(served.entries)[0])
        assert [client.get(path).status_code for _ in range(4)] == [200, 200, 200, 429]
        limited = client.post("/v1/events", json=event("u1", served.item_ids[0]))
        assert limited.status_code == 429 and limited.json()["error"] == "RateLimited"
        assert int(limited.headers["retry-after"]) == 2  # a token every 2 s
        other = {"Authorization": f"Bearer {OTHER_KEY}"}
        assert client.get(path, headers=other).status_code == 200  # another client keeps its own bucket
        guesses = [{"Authorization": "", "X-API-Key": f"guess-{k:016d}"} for k in range(5)]
        guessing = [client.get(path, headers=guess).status_code for guess in guesses]
        assert guessing == [403, 403, 403, 429, 429]  # wrong keys are limited by the address
        assert client.get("/healthz").status_code == 200  # probes are never limited


def test_token_buckets_refill_at_the_rate_up_to_the_burst() -> None:
    now = [0.0]
    buckets = TokenBuckets(rate=2.0, burst=2, clock=lambda: now[0])
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 0.5]
    now[0] = 0.5  # one token back
    assert buckets.take("a") == 0.0 and buckets.take("a") == pytest.approx(0.5)
    now[0] = 100.0  # never more than the burst
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 0.5]
    assert buckets.take("b") == 0.0


# --- one id rule ----------------------------------------------------------------------------------

GOOD_IDS = ["user-00001", "café", "商品 42", "a/b", "50% off", "ab?c#d", "Ölçü", "x" * 256, "🙂", "a.b"]
BAD_IDS = [" ", "", "a\nb", "x" * 257, "u\u200b1", " lead", "trail ", "tab\there", "\u00a0nbsp", "..", "."]
RULES = InputRules(not_after=datetime(2030, 1, 1, tzinfo=UTC))


def contracts_accept(served: Served, user_id: str) -> tuple[bool, bool]:
    """Return whether the input contracts accept an id as an item's item_id and as an interaction's user_id."""
    items = pl.DataFrame({"item_id": [user_id], "title": ["t"], "body": ["b"]})
    valid_items, _ = validate_items(items, RULES, "mem://items")
    interactions = pl.DataFrame(
        {"user_id": [user_id], "item_id": [served.item_ids[0]], "event": ["click"], "ts": [datetime(2026, 1, 1, tzinfo=UTC)]}
    )
    valid, _ = validate_interactions(interactions, pl.Series([served.item_ids[0]]), RULES, "mem://x")
    return valid_items.height == 1, valid.height == 1


@pytest.mark.parametrize("good", GOOD_IDS)
def test_an_id_the_contracts_accept_is_served_and_accepted(served: Served, cache_path: str, good: str) -> None:
    assert contracts_accept(served, good) == (True, True)
    with keyed(app_for(served, cache_path)) as client:
        answer = client.get(recommendations_path(good))
        assert answer.status_code == 200 and answer.json()["user_id"] == good
        assert client.post("/v1/events", json=event(good, served.item_ids[0])).json() == {"status": "accepted"}
        as_item = client.post("/v1/events", json=event("u1", good))
        assert as_item.status_code == 202 and as_item.json()["reason"] == "unknown_item"  # a valid id, not in the run


@pytest.mark.parametrize("bad", BAD_IDS)
def test_an_id_the_contracts_refuse_is_refused_by_the_ranker_and_the_events_api(
    served: Served, cache_path: str, bad: str
) -> None:
    assert contracts_accept(served, bad) == (False, False)
    with keyed(app_for(served, cache_path)) as client:
        assert client.get(recommendations_path(bad)).status_code in (404, 422)  # '.' and '..' never reach a route
        assert client.post("/v1/events", json=event(bad, served.item_ids[0])).status_code == 422
        assert client.post("/v1/events", json=event("u1", bad)).status_code == 422
