"""Service tests of the candidate cache: the same behaviour on SQLite (tmp_path) and the real Redis on loopback.

Unreachable Redis: ping() returns False; every other operation raises CacheUnavailable naming the URL.
"""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import redis

from core.errors import CacheUnavailable, PublishError
from storage.cache import CandidateCache, SqliteCache, redact_url
from storage.cache_redis import RedisCache
from storage.candidate_payload import PAYLOAD_VERSION, CandidateEntry, decode_entry, encode_entry, feature_set_id
from storage.resources import open_cache

REDIS_URL = "redis://127.0.0.1:6379/0"
DEAD_REDIS_URL = "redis://127.0.0.1:1/0"
FEATURE_SET = feature_set_id(["s0", "s1", "s2"])
N_CANDIDATES = 100
WAIT_S = 60.0  # deadlock guard only; nothing asserts on speed


# --- helpers --------------------------------------------------------------------------------


def _scores(run_id: str) -> np.ndarray:
    """Return scores unique to a run: all equal to the run's number (r3 -> 3.0)."""
    return np.full(N_CANDIDATES, float(run_id.lstrip("r")), dtype=np.float32)


def _payload(run_id: str) -> bytes:
    """Return a payload whose every item id is suffixed with the run id."""
    features = _scores(run_id)[:, None].repeat(3, axis=1)
    return encode_entry(CandidateEntry([f"item{i}-{run_id}" for i in range(N_CANDIDATES)], features, FEATURE_SET))


def _entries(run_id: str, n_users: int = 20) -> list[tuple[str, bytes]]:
    """Return (user_id, payload) entries of one run."""
    return [(f"u{u}", _payload(run_id)) for u in range(n_users)]


def _mismatch(run_id: str, blob: bytes) -> str | None:
    """Return why a payload is not exactly run_id's list, or None when it is."""
    entry = decode_entry(blob)
    item_ids, scores = entry.item_ids, entry.features[:, 0]
    runs = {item.rsplit("-", 1)[1] for item in item_ids}
    if runs != {run_id} or len(item_ids) != N_CANDIDATES or not np.array_equal(scores, _scores(run_id)):
        return f"pointer {run_id} but payload of runs {sorted(runs)}"
    return None


def _reader_loop(location: str, prefix: str, stop: Any, last_seen: Any, out: Any) -> None:
    """Read u0 until stopped; report (reads, runs seen, mismatches) on out (runs in a spawned process)."""
    reads, seen, bad = 0, set(), []
    with open_cache(location, prefix) as cache:
        while not stop.is_set():
            got = cache.read("u0")
            reads += 1
            if got is not None:
                problem = _mismatch(*got)
                bad += [problem] if problem else []
                seen.add(got[0])
                last_seen.value = max(last_seen.value, int(got[0].lstrip("r")))
    out.put((reads, sorted(seen), bad))


def _read_once(location: str, prefix: str, user_id: str) -> tuple[str, bytes] | None:
    """Open the cache and read one user (runs in a spawned process)."""
    with open_cache(location, prefix) as cache:
        return cache.read(user_id)


def _wait_for(condition: Callable[[], bool], proc: mp.process.BaseProcess) -> None:
    """Wait until condition holds while proc is alive; fail (not hang) if it never does."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert proc.is_alive(), "reader process died"
        if time.monotonic() > deadline:
            pytest.fail("reader process made no progress")
        time.sleep(0.005)


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "redis"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Yield (location, unique prefix) of an empty cache; Redis keys of the prefix are deleted after."""
    prefix = f"nstest:{uuid.uuid4().hex}"
    if request.param == "sqlite":
        yield str(tmp_path / "nested" / "cache.sqlite"), prefix
        return
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        pytest.skip(f"no Redis server at {REDIS_URL}")
    yield REDIS_URL, prefix
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.unlink(*keys)
    client.close()


@pytest.fixture
def cache(location: tuple[str, str]) -> Iterator[CandidateCache]:
    """Yield an open cache of the parametrized backend."""
    with open_cache(*location) as opened:
        yield opened


# --- payload --------------------------------------------------------------------------------


def test_payload_round_trip() -> None:
    item_ids = [f"artículo-{i}-日本-🎧" for i in range(N_CANDIDATES)]
    features = np.random.default_rng(0).normal(size=(N_CANDIDATES, 7)).astype(np.float32)
    blob = encode_entry(CandidateEntry(item_ids, features, FEATURE_SET))
    entry = decode_entry(blob)
    assert entry.item_ids == item_ids and entry.feature_set == FEATURE_SET
    assert entry.features.dtype == np.float32
    np.testing.assert_array_equal(entry.features, features)
    assert len(blob) < 40 * N_CANDIDATES + 4 * features.size  # compact: ids + 4 bytes a feature


@pytest.mark.parametrize(
    "blob",
    [
        msgpack.packb([PAYLOAD_VERSION + 1, "f", ["a"], 1, b"\0" * 4]),
        msgpack.packb({"v": PAYLOAD_VERSION}),
        msgpack.packb([PAYLOAD_VERSION, "f", ["a", "b"], 1, b"\0" * 4]),
        msgpack.packb([PAYLOAD_VERSION, "f", ["a"], 0, b""]),
        b"\xc1 not msgpack",
    ],
    ids=["future-version", "not-a-list", "features-mismatch", "no-features", "garbage"],
)
def test_payload_rejects_unknown_or_broken(blob: bytes) -> None:
    with pytest.raises(ValueError):
        decode_entry(blob)


def test_payload_rejects_feature_row_count_mismatch() -> None:
    with pytest.raises(ValueError, match="one feature row per item"):
        CandidateEntry(["a", "b"], np.zeros((1, 3), np.float32), "f")


def test_feature_set_names_the_columns_in_order() -> None:
    assert feature_set_id(["a", "b"]) == feature_set_id(("a", "b")) != feature_set_id(["b", "a"])


# --- versions and pointer -------------------------------------------------------------------


def test_written_version_is_invisible_before_switch(cache: CandidateCache) -> None:
    assert cache.write_version("r1", _entries("r1")) == 20
    assert cache.current() is None
    assert cache.read("u0") is None
    assert cache.read_version("r1", "u0") == _payload("r1")
    assert cache.versions() == ["r1"]


def test_switch_then_read(cache: CandidateCache) -> None:
    cache.write_version("r1", _entries("r1"))
    assert cache.switch_current("r1") is None
    assert cache.read("u0") == ("r1", _payload("r1"))
    assert cache.read("nobody") is None


def test_unswitched_second_version_keeps_readers_on_first(cache: CandidateCache) -> None:
    cache.write_version("r1", _entries("r1"))
    cache.switch_current("r1")
    cache.write_version("r2", _entries("r2"))
    assert cache.read("u3") == ("r1", _payload("r1"))
    assert cache.versions() == ["r1", "r2"]


def test_switch_returns_and_records_previous(cache: CandidateCache) -> None:
    for run_id in ("r1", "r2"):
        cache.write_version(run_id, _entries(run_id))
    assert cache.switch_current("r1") is None
    assert cache.previous() is None
    assert cache.switch_current("r2") == "r1"
    assert (cache.current(), cache.previous()) == ("r2", "r1")
    assert cache.switch_current("r2") == "r2"  # re-switching to current keeps previous
    assert (cache.current(), cache.previous()) == ("r2", "r1")


def test_current_version_cannot_be_dropped_or_rewritten(cache: CandidateCache) -> None:
    cache.write_version("r1", _entries("r1"))
    cache.switch_current("r1")
    with pytest.raises(PublishError, match="current"):
        cache.drop_version("r1")
    with pytest.raises(PublishError, match="current"):
        cache.write_version("r1", _entries("r1"))
    assert cache.read("u0") == ("r1", _payload("r1"))


def test_drop_old_version_removes_only_its_keys(cache: CandidateCache) -> None:
    for run_id in ("r1", "r2", "r[1]"):  # r[1] checks glob characters are escaped in SCAN patterns
        cache.write_version(run_id, _entries("r1" if run_id == "r[1]" else run_id))
    cache.switch_current("r1")
    cache.switch_current("r2")
    assert cache.drop_version("r[1]") == 20
    assert cache.drop_version("r1") == 20
    assert cache.versions() == ["r2"]
    assert cache.read_version("r1", "u0") is None
    assert (cache.current(), cache.previous()) == ("r2", "r1")  # pointers are not entries
    assert cache.read("u0") == ("r2", _payload("r2"))


def test_write_in_batches_from_a_generator(cache: CandidateCache) -> None:
    entries = ((f"user:{u}:ü", _payload("r1")) for u in range(53))
    assert cache.write_version("r1", entries, batch_size=7) == 53
    cache.switch_current("r1")
    assert cache.read("user:52:ü") == ("r1", _payload("r1"))


@pytest.mark.parametrize("run_id", ["", "a:b"])
def test_run_ids_with_separator_are_rejected(cache: CandidateCache, run_id: str) -> None:
    with pytest.raises(ValueError, match="run id"):
        cache.write_version(run_id, [])


# --- concurrency ----------------------------------------------------------------------------


def test_concurrent_reader_never_sees_a_mix(cache: CandidateCache, location: tuple[str, str]) -> None:
    ctx = mp.get_context("spawn")
    stop, last_seen, out = ctx.Event(), ctx.Value("i", -1), ctx.Queue()
    reader = ctx.Process(target=_reader_loop, args=(*location, stop, last_seen, out))
    reader.start()
    try:
        for k in range(6):
            cache.write_version(f"r{k}", _entries(f"r{k}", n_users=200), batch_size=50)
            cache.switch_current(f"r{k}")
            _wait_for(lambda: last_seen.value >= k, reader)  # noqa: B023 - called at once: the reader saw this version
    finally:
        stop.set()
        reads, seen, bad = out.get(timeout=WAIT_S)
        reader.join(WAIT_S)
    assert bad == []
    assert seen == [f"r{k}" for k in range(6)]
    assert reads >= len(seen)


def test_sqlite_readable_while_another_connection_writes(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    with SqliteCache(path, "ns") as cache:
        cache.write_version("r1", _entries("r1"))
        cache.switch_current("r1")
        writer = sqlite3.connect(path, isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE kv SET value = ? WHERE key = ?", (b"r2", cache.current_key))
        with mp.get_context("spawn").Pool(1) as pool:
            got = pool.apply_async(_read_once, (str(path), "ns", "u0")).get(timeout=WAIT_S)
        writer.execute("ROLLBACK")
        writer.close()
    assert got == ("r1", _payload("r1"))  # the committed state, not the open transaction's


# --- factory and failures -------------------------------------------------------------------


def test_open_cache_picks_backend_and_creates_folders(tmp_path: Path) -> None:
    with open_cache(str(tmp_path / "a" / "b" / "cache.sqlite"), "ns") as embedded:
        assert isinstance(embedded, SqliteCache) and embedded.ping()
    assert (tmp_path / "a" / "b" / "cache.sqlite").exists()
    for url in (REDIS_URL, "rediss://cache.example:6380/1"):
        remote = open_cache(url, "ns")  # no connection is made until first use
        assert isinstance(remote, RedisCache)
        remote.close()


def test_unreachable_redis() -> None:
    with open_cache(DEAD_REDIS_URL, "ns") as cache:
        assert cache.ping() is False
        for call in (cache.current, lambda: cache.read("u0"), lambda: cache.write_version("r1", _entries("r1"))):
            with pytest.raises(CacheUnavailable) as info:
                call()
            message = str(info.value)
            assert DEAD_REDIS_URL in message and "\n" not in message


def test_redact_url_hides_password() -> None:
    assert redact_url("redis://user:s3cret@host:6379/0") == "redis://user:***@host:6379/0"
    assert redact_url(REDIS_URL) == REDIS_URL


# --- version expiry (grace) -----------------------------------------------------------------


def _publish(cache: CandidateCache, run_id: str) -> list[str]:
    """Publish a run as the nightly publish does: write, switch, retire old versions; return the retired."""
    cache.write_version(run_id, _entries(run_id))
    cache.switch_current(run_id)
    return cache.retire_old_versions()


def _known(ttls: list[float | None]) -> list[float]:
    """Return the TTLs, asserting that every key has one."""
    assert None not in ttls, ttls
    return [t for t in ttls if t is not None]


def switching(cache: CandidateCache, run_id: str) -> Callable[[str], None]:
    """Return a before_commit hook that switches the cache pointer to run_id (as the publish task does)."""

    def switch(_latest: str) -> None:
        cache.switch_current(run_id)

    return switch


def _ttls(location: tuple[str, str], run_id: str) -> list[float | None]:
    """Return the seconds left of each entry of a run, read straight from the backend (None: no expiry)."""
    where, prefix = location
    if where.startswith("redis"):
        client = redis.Redis.from_url(where)
        try:
            ttls = [client.pttl(key) for key in client.scan_iter(match=f"{prefix}:cand:{run_id}:*", count=1000)]
        finally:
            client.close()
        return [None if ttl == -1 else ttl / 1000 for ttl in ttls]
    conn = sqlite3.connect(where)
    try:
        rows = conn.execute("SELECT expires_at FROM kv WHERE key LIKE ?", (f"{prefix}:cand:{run_id}:%",)).fetchall()
    finally:
        conn.close()
    return [None if expires is None else expires - time.time() for (expires,) in rows]


def test_three_publishes_expire_only_the_oldest_and_never_extend_it(location: tuple[str, str]) -> None:
    grace = 3600.0
    with open_cache(*location, version_grace_s=grace) as cache:
        assert _publish(cache, "r1") == [] and _publish(cache, "r2") == []
        assert _publish(cache, "r3") == ["r1"]
        oldest = _ttls(location, "r1")
        assert len(oldest) == 20 and all(ttl is not None and 0 < ttl <= grace for ttl in oldest)
        assert _ttls(location, "r2") == [None] * 20 and _ttls(location, "r3") == [None] * 20
        assert cache.read_version("r2", "u0") == _payload("r2")  # previous: readable, no TTL
        assert cache.read_version("r1", "u0") == _payload("r1")  # in its grace: still readable
        assert _publish(cache, "r4") == ["r1", "r2"]
        assert max(_known(_ttls(location, "r1"))) <= min(_known(oldest))  # the first expiry stays
        assert all(ttl is not None and 0 < ttl <= grace for ttl in _ttls(location, "r2"))


def test_expired_versions_are_gone_after_the_grace(location: tuple[str, str]) -> None:
    with open_cache(*location, version_grace_s=1.0) as cache:
        for run_id in ("r1", "r2", "r3"):
            _publish(cache, run_id)
        time.sleep(1.3)
        assert cache.read_version("r1", "u0") is None
        assert cache.versions() == ["r2", "r3"]
        assert cache.read("u0") == ("r3", _payload("r3")) and cache.read_version("r2", "u0") == _payload("r2")
    with open_cache(*location, version_grace_s=1.0):  # opening purges what expired
        assert _ttls(location, "r1") == []


def test_sqlite_purges_expired_rows_at_the_next_publish(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    with SqliteCache(path, "ns", version_grace_s=1.0) as cache:
        for run_id in ("r1", "r2", "r3"):
            _publish(cache, run_id)
        time.sleep(1.3)
        assert _ttls((str(path), "ns"), "r1") != []  # expired but not yet purged: hidden from reads only
        _publish(cache, "r4")
        assert _ttls((str(path), "ns"), "r1") == []


def test_switching_back_to_an_expiring_version_clears_its_ttl(location: tuple[str, str]) -> None:
    with open_cache(*location, version_grace_s=3600.0) as cache:
        for run_id in ("r1", "r2", "r3"):
            _publish(cache, run_id)
        assert None not in _ttls(location, "r1")
        assert cache.switch_current("r1") == "r3"  # e.g. a second rollback reaches r1
        assert _ttls(location, "r1") == [None] * 20
        assert cache.read("u0") == ("r1", _payload("r1"))


def test_zero_grace_drops_old_versions_at_once(location: tuple[str, str]) -> None:
    with open_cache(*location, version_grace_s=0) as cache:
        for run_id in ("r1", "r2", "r3"):
            _publish(cache, run_id)
        assert cache.versions() == ["r2", "r3"] and _ttls(location, "r1") == []


def test_sqlite_file_from_before_expiry_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value BLOB NOT NULL)")
    conn.execute("INSERT INTO kv VALUES ('ns:cand:current', ?), ('ns:cand:r1:u0', ?)", (b"r1", _payload("r1")))
    conn.commit()
    conn.close()
    with SqliteCache(path, "ns", version_grace_s=60.0) as cache:
        assert cache.read("u0") == ("r1", _payload("r1"))
        assert _publish(cache, "r2") == [] and _publish(cache, "r3") == ["r1"]


def test_rollback_twice_reaches_an_expiring_version_and_keeps_it(location: tuple[str, str], tmp_path: Path) -> None:
    """`nightscore cache rollback` (storage.publication.rollback) on a real DuckDB warehouse, through an expiring version."""
    from storage.publication import rollback
    from storage.resources import open_warehouse
    from tests.storage.test_warehouse import publish as publish_run

    wh = open_warehouse(str(tmp_path / "warehouse.duckdb"), embedding_dim=384)
    with open_cache(*location, version_grace_s=3600.0) as cache:
        for day, run_id in enumerate(("r1", "r2", "r3"), start=1):
            cache.write_version(run_id, _entries(run_id))
            publish_run(wh, run_id, f"2026-11-0{day}", before_commit=switching(cache, run_id))
            cache.retire_old_versions()
        assert None not in _ttls(location, "r1")
        assert rollback(wh, cache) == ("r3", "r2") and cache.current() == "r2"
        assert rollback(wh, cache) == ("r2", "r1") and cache.read("u0") == ("r1", _payload("r1"))
        assert _ttls(location, "r1") == [None] * 20  # current again: it no longer expires


# --- pointers set exactly (issue 18, item 6) ------------------------------------------------


def test_set_pointers_sets_clears_and_persists_both(location: tuple[str, str]) -> None:
    with open_cache(*location, version_grace_s=3600.0) as cache:
        for run_id in ("r1", "r2", "r3"):
            _publish(cache, run_id)
        assert None not in _ttls(location, "r1")  # r1 is older than previous: it expires
        cache.set_pointers("r2", "r1")
        assert (cache.current(), cache.previous()) == ("r2", "r1") and _ttls(location, "r1") == [None] * 20
        cache.set_pointers(None, None)  # a failed first publication: nothing current at all
        assert (cache.current(), cache.previous(), cache.read("u0")) == (None, None, None)


def test_reconcile_clears_a_pointer_the_warehouse_never_published(location: tuple[str, str], tmp_path: Path) -> None:
    """A first publication killed between the cache switch and the warehouse commit left the cache on its run."""
    from storage.publication import reconcile_cache
    from storage.resources import open_warehouse
    from tests.storage.test_warehouse import publish as publish_run

    wh = open_warehouse(str(tmp_path / "warehouse.duckdb"), embedding_dim=384)
    wh.record_run({"run_id": "r0", "flow_name": "nightly", "run_date": "2026-11-01", "status": "running"})
    with open_cache(*location) as cache:
        cache.write_version("r9", _entries("r9"))
        cache.switch_current("r9")
        assert reconcile_cache(wh, cache) == "none" and (cache.current(), cache.previous()) == (None, None)
        for day, run_id in enumerate(("r1", "r2"), start=1):
            cache.write_version(run_id, _entries(run_id))
            publish_run(wh, run_id, f"2026-11-0{day}", before_commit=switching(cache, run_id))
        cache.write_version("r9", _entries("r9"))
        cache.switch_current("r9")  # killed again, now with two published runs before it
        assert reconcile_cache(wh, cache) == "r2" and (cache.current(), cache.previous()) == ("r2", "r1")
        assert reconcile_cache(wh, cache) is None
