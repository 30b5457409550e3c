"""Service tests of dynamic batching with the served run's real LightGBM ranker: same scores, bounded waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.recommender.ranker_models import Scorer
from serving.app import create_app
from serving.batcher import DirectScoring, MicroBatcher
from storage.cache import SqliteCache
from storage.candidate_payload import decode_entry
from tests.service.conftest import Served, keyed, publish, service_config

SLACK_S = 0.05  # scheduling noise allowed on a busy 2-core machine


def _features(served: Served, users: list[str]) -> list[np.ndarray]:
    return [decode_entry(served.entries[u]).features for u in users]


async def _request(batcher: MicroBatcher, scorer: Scorer, features: np.ndarray) -> np.ndarray:
    """Return one request's scores as the service gets them: on its way for a turn (its cache read), then scored."""
    with batcher.arriving():
        await asyncio.sleep(0)
    return await batcher.score(scorer, features)


def _finishes_without_suspending(coroutine: Coroutine[Any, Any, np.ndarray]) -> np.ndarray:
    """Return the coroutine's result when it completes in its first step; fail when it waits for the loop."""
    with pytest.raises(StopIteration) as finished:
        coroutine.send(None)
    return np.asarray(finished.value.value)


def test_concurrent_requests_are_scored_in_one_call_with_the_offline_scores(served: Served) -> None:
    users = sorted(served.entries)[:20]
    sizes: list[int] = []
    batcher = MicroBatcher(max_batch=64, max_delay_s=0.01, on_batch=lambda n, _s: sizes.append(n))

    async def both() -> tuple[list[np.ndarray], list[np.ndarray]]:
        batched = await asyncio.gather(*(_request(batcher, served.scorer, x) for x in _features(served, users)))
        direct = [await DirectScoring().score(served.scorer, x) for x in _features(served, users)]
        return list(batched), direct

    batched, direct = asyncio.run(both())
    assert sizes == [20], sizes  # all twenty arrived in one turn of the loop: one model call
    for features, got, alone in zip(_features(served, users), batched, direct, strict=True):
        np.testing.assert_allclose(got, served.scorer.predict(features), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got, alone, rtol=1e-6, atol=1e-6)


def test_max_batch_caps_one_model_call(served: Served) -> None:
    sizes: list[int] = []
    batcher = MicroBatcher(max_batch=4, max_delay_s=0.01, on_batch=lambda n, _s: sizes.append(n))

    async def run() -> None:
        await asyncio.gather(*(_request(batcher, served.scorer, x) for x in _features(served, sorted(served.entries)[:10])))

    asyncio.run(run())
    assert sizes == [4, 4, 2], sizes


def test_a_request_alone_is_scored_in_its_own_turn(served: Served) -> None:
    sizes: list[int] = []
    batcher = MicroBatcher(max_batch=64, max_delay_s=1.0, on_batch=lambda n, _s: sizes.append(n))
    features = _features(served, sorted(served.entries)[:1])[0]

    async def alone() -> np.ndarray:
        return _finishes_without_suspending(batcher.score(served.scorer, features))  # no future, no timer, no tick

    np.testing.assert_allclose(asyncio.run(alone()), served.scorer.predict(features), rtol=1e-6, atol=1e-6)
    assert sizes == [1]


def test_the_last_request_on_its_way_scores_the_batch_without_waiting(served: Served) -> None:
    sizes: list[int] = []
    batcher = MicroBatcher(max_batch=64, max_delay_s=1.0, on_batch=lambda n, _s: sizes.append(n))
    first, last = _features(served, sorted(served.entries)[:2])

    async def two() -> tuple[np.ndarray, np.ndarray]:
        with batcher.arriving():  # the last request reads the cache while the first one queues
            queued = asyncio.create_task(batcher.score(served.scorer, first))
            await asyncio.sleep(0)
            assert not queued.done()
        mine = _finishes_without_suspending(batcher.score(served.scorer, last))
        return await queued, mine

    got_first, got_last = asyncio.run(two())
    assert sizes == [2], sizes  # one model call, made in the last request's turn
    np.testing.assert_allclose(got_first, served.scorer.predict(first), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got_last, served.scorer.predict(last), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("delay_s", [0.02, 0.2])
def test_a_request_alone_waits_at_most_the_delay(served: Served, delay_s: float) -> None:
    batcher = MicroBatcher(max_batch=64, max_delay_s=delay_s)
    features = _features(served, sorted(served.entries)[:1])[0]

    async def alone() -> float:
        with batcher.arriving():  # another request is on its way and never comes: the batch waits for it, no longer
            started = time.perf_counter()
            await batcher.score(served.scorer, features)
            return time.perf_counter() - started

    assert asyncio.run(alone()) <= delay_s + SLACK_S


def test_an_idle_service_adds_no_delay(served: Served) -> None:
    batcher = MicroBatcher(max_batch=64, max_delay_s=1.0)  # a delay no test could miss
    features = _features(served, sorted(served.entries)[:1])[0]

    async def alone() -> float:
        started = time.perf_counter()
        await batcher.score(served.scorer, features)
        return time.perf_counter() - started

    assert asyncio.run(alone()) < SLACK_S


@pytest.mark.parametrize("batching", [True, False])
def test_concurrent_http_requests_get_the_offline_order_either_way(served: Served, tmp_path: Path, batching: bool) -> None:
    location = str(tmp_path / "cache.sqlite")
    with SqliteCache(location, "nstest") as cache:
        publish(cache, "r1", served.entries)
    config = service_config(location, "nstest", served.lake_root, batching=batching)
    users = sorted(served.entries)[:24]
    with keyed(create_app(config)) as client, ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(lambda u: client.get(f"/v1/users/{u}/recommendations", params={"n": 5}).json(), users))
    for user_id, body in zip(users, bodies, strict=True):
        entry = decode_entry(served.entries[user_id])
        expected = served.scorer.predict(entry.features)
        top = np.lexsort((np.arange(len(expected)), -expected))[:5]
        assert [i["item_id"] for i in body["items"]] == [entry.item_ids[i] for i in top]
        np.testing.assert_allclose([i["score"] for i in body["items"]], expected[top], rtol=1e-6)
