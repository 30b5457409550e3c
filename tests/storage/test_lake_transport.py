"""Storage and service tier: transport failures of the lake (S3 on moto_server) and the cache (Redis) are retried
with backoff and then named, never taken for bad data (issue 18, item 9).

The network is a real loopback TCP proxy in front of the real server that resets connections on demand
(tests/servers.py ResettingProxy): what a connection reset or a vanished endpoint looks like to s3fs and redis-py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
import redis

from core.errors import CacheUnavailable, InputUnreadable, LakeUnavailable
from storage.lake import Lake
from storage.resources import open_cache
from tests.servers import ResettingProxy, proxy, s3_bucket, s3_endpoint  # noqa: F401 - fixtures

ONE_BOTO_ATTEMPT = {"config_kwargs": {"retries": {"max_attempts": 1}}}  # each lake attempt is one request here


@pytest.fixture
def lakes(s3_bucket: str, proxy: ResettingProxy) -> tuple[Lake, Lake]:
    """Return (a lake straight on moto, the same lake through the proxy with 2 retries)."""
    direct = Lake(s3_bucket, {"use_listings_cache": False})
    options = {"use_listings_cache": False, "endpoint_url": proxy.url, **ONE_BOTO_ATTEMPT}
    flaky = Lake(s3_bucket, options, retries=2, backoff_s=0.05)
    direct.write_parquet(pl.DataFrame({"item_id": ["a", "b"], "body": ["x", "y"]}), direct.uri("items.parquet"))
    direct.write_bytes(b"PAR1 this is not a parquet file", direct.uri("corrupt.parquet"))
    return direct, flaky


def test_a_reset_connection_is_retried_then_the_read_succeeds(lakes: tuple[Lake, Lake], proxy: ResettingProxy) -> None:
    _, flaky = lakes
    before = proxy.connections
    proxy.reset_next = 2  # the first two connections are reset, the third gets through
    assert flaky.read_parquet(flaky.uri("items.parquet"), "items").get_column("item_id").to_list() == ["a", "b"]
    assert proxy.connections - before >= 3
    proxy.reset_next = 1
    assert [f.height for f in flaky.iter_frames(flaky.uri("items.parquet"), "items")] == [2]
    proxy.reset_next = 1
    assert flaky.write_json({"ok": True}, flaky.uri("run.json")) and flaky.read_json(flaky.uri("run.json")) == {"ok": True}


@pytest.mark.parametrize("operation", ["exists", "read_parquet", "iter_frames", "read_json", "write_bytes", "identity"])
def test_a_lake_that_stays_unreachable_is_named_after_the_retries(
    lakes: tuple[Lake, Lake], proxy: ResettingProxy, operation: str
) -> None:
    _, flaky = lakes
    uri = flaky.uri("items.parquet")
    calls = {
        "exists": lambda: flaky.exists(uri),
        "read_parquet": lambda: flaky.read_parquet(uri, "items"),
        "iter_frames": lambda: list(flaky.iter_frames(uri, "items")),
        "read_json": lambda: flaky.read_json(uri),
        "write_bytes": lambda: flaky.write_bytes(b"x", flaky.uri("x.bin")),
        "identity": lambda: flaky.identity(uri),
    }
    proxy.cut()
    before = proxy.connections
    with pytest.raises(LakeUnavailable, match=r"lake unavailable: \w+ s3://.* failed 3 time\(s\): \w+") as failed:
        calls[operation]()
    assert "\n" not in str(failed.value) and proxy.connections - before >= 3
    assert not isinstance(failed.value, InputUnreadable)


def test_corrupt_and_missing_files_stay_contract_failures(lakes: tuple[Lake, Lake], proxy: ResettingProxy) -> None:
    _, flaky = lakes
    before = proxy.connections
    with pytest.raises(InputUnreadable, match="not a readable Parquet file"):
        flaky.read_parquet(flaky.uri("corrupt.parquet"), "items")
    with pytest.raises(InputUnreadable, match="not a readable Parquet file"):
        list(flaky.iter_frames(flaky.uri("corrupt.parquet"), "items"))
    with pytest.raises(InputUnreadable, match="not found"):
        flaky.read_parquet(flaky.uri("missing.parquet"), "items")
    assert proxy.connections - before <= 8  # answered at once: nothing was retried


def test_local_lake_errors_keep_their_meaning(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputUnreadable):
        lake.read_parquet(lake.uri("bad.parquet"), "items")
    assert lake.read_json(lake.uri("none.json")) is None and lake.identity(lake.uri("none.json")) is None


# --- the cache (Redis) ------------------------------------------------------------------------------------------


@pytest.fixture
def redis_proxy() -> Iterator[ResettingProxy]:
    """Yield a resetting proxy in front of the Redis server on 127.0.0.1:6379 (skip when there is none)."""
    try:
        redis.Redis(socket_connect_timeout=2).ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.skip(f"no Redis on 127.0.0.1:6379: {exc}")
    relay = ResettingProxy(6379)
    yield relay
    relay.close()


def test_cache_writes_and_the_switch_survive_reset_connections_and_then_name_the_server(redis_proxy: ResettingProxy) -> None:
    prefix = f"nstest:{uuid.uuid4().hex}"
    url = f"redis://127.0.0.1:{redis_proxy.port}/0"
    try:
        with open_cache(url, prefix, retries=2) as cache:
            redis_proxy.reset_next = 2
            assert cache.write_version("r1", [("u1", b"a"), ("u2", b"b")]) == 2
            redis_proxy.reset_next = 2
            assert cache.switch_current("r1") is None and cache.current() == "r1"
            redis_proxy.cut()
            with pytest.raises(CacheUnavailable, match=f"candidate cache unavailable at {url}") as failed:
                cache.switch_current("r2")
            assert "\n" not in str(failed.value)
        with open_cache("redis://127.0.0.1:6379/0", prefix) as direct:
            assert (direct.current(), direct.read("u2")) == ("r1", ("r1", b"b"))  # nothing half-done by the failure
        redis_proxy.reset_all = False
        with open_cache(url, prefix, retries=0) as strict:  # NIGHTSCORE_CACHE_RETRIES=0: the first reset is final
            redis_proxy.reset_next = 1
            with pytest.raises(CacheUnavailable):
                strict.current()
    finally:
        client = redis.Redis()
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
