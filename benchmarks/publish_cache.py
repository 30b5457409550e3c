"""Publish benchmark: 100k users x 100 candidates into Redis, msgpack payload vs JSON, one table.

    python benchmarks/publish_cache.py [--users 100000] [--k 100] [--redis redis://127.0.0.1:6379/0]

Writes each encoding under its own throw-away key prefix through nightscore's RedisCache (pipelined
batches, then the pointer switch), reports users/s and payload bytes per user, and deletes its keys.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from storage.cache_redis import RedisCache
from storage.candidate_payload import CandidateEntry, encode_entry, feature_set_id

FEATURES = 22  # feature columns of a cache entry (the fusion of six lists)
FEATURE_SET = feature_set_id([f"f{i}" for i in range(FEATURES)])


def encode_msgpack(item_ids: list[str], features: np.ndarray) -> bytes:
    """Return the cache entry nightscore writes: msgpack ids + float32 feature rows."""
    return encode_entry(CandidateEntry(item_ids, features, FEATURE_SET))


def encode_json(item_ids: list[str], features: np.ndarray) -> bytes:
    """Return the JSON payload a naive publisher would write."""
    return json.dumps({"items": item_ids, "features": features.tolist(), "feature_set": FEATURE_SET}).encode()


def entries(users: int, k: int, encode: Callable[[list[str], np.ndarray], bytes], seed: int = 0) -> Iterator[tuple[str, bytes]]:
    """Yield (user_id, payload) for synthetic candidates."""
    rng = np.random.default_rng(seed)
    for u in range(users):
        items = [f"item-{i:06d}" for i in rng.integers(0, 50_000, size=k)]
        features = rng.random((k, FEATURES), dtype=np.float32)
        yield f"user-{u:07d}", encode(items, features)


def measure(url: str, users: int, k: int, name: str, encode: Callable[[list[str], np.ndarray], bytes]) -> dict[str, float]:
    """Publish one version with an encoding and return users/s, bytes/user and the encode share."""
    payload_bytes = sum(len(p) for _, p in entries(min(users, 2000), k, encode)) / min(users, 2000)
    prefix = f"nsbench:{name}:{uuid.uuid4().hex[:6]}"
    cache = RedisCache(url, prefix)
    try:
        started = time.perf_counter()
        written = cache.write_version("r1", entries(users, k, encode), batch_size=1000)
        cache.switch_current("r1")
        seconds = time.perf_counter() - started
        return {"users_per_s": written / seconds, "bytes_per_user": payload_bytes, "seconds": seconds}
    finally:
        cache.switch_current("r0")  # an empty version, so r1 is no longer current and may be dropped
        cache.drop_version("r1")
        cache.close()
        redis.Redis.from_url(url).delete(f"{prefix}:cand:current", f"{prefix}:cand:previous")


def main(argv: list[str] | None = None) -> int:
    """Run both encodings and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args(argv)
    rows = {
        name: measure(args.redis, args.users, args.k, name, fn)
        for name, fn in (("msgpack+f32", encode_msgpack), ("json", encode_json))
    }
    print(f"{args.users} users x {args.k} candidates into {args.redis} (pipelined batches of 1000, then pointer switch)")
    print(f"{'encoding':<14}{'users/s':>10}{'bytes/user':>12}{'seconds':>9}")
    for name, r in rows.items():
        print(f"{name:<14}{r['users_per_s']:>10.0f}{r['bytes_per_user']:>12.0f}{r['seconds']:>9.1f}")
    ratio = rows["json"]["bytes_per_user"] / rows["msgpack+f32"]["bytes_per_user"]
    print(
        f"msgpack+f32 is {ratio:.2f}x smaller and "
        f"{rows['msgpack+f32']['users_per_s'] / rows['json']['users_per_s']:.2f}x faster to publish"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
