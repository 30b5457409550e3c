"""Load benchmark of the online ranker: open-loop fixed rates against uvicorn on loopback, one table out.

It trains a ranker on the demo data, writes its model and feature files to a temporary folder, publishes
the demo candidates to Redis under its own key prefix, starts the service (uvicorn, one process) on a free
loopback port, then for each rate drives it from a separate process for a bounded time. The driver is
open-loop: request i is due at start + i / rate whatever happened before, and its latency runs from that
due time (queueing in the driver counts, so a saturated server shows as latency, not as a lower rate).
Keys and files are removed at the end. Usage:

    python benchmarks/ranker_load.py [--rates 100 300 1000] [--duration 10] [--redis URL] [--users 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import asdict
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

log = logging.getLogger("bench")
HALF_LIFE_DAYS = 14.0
READY_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 5.0
DRAIN_TIMEOUT_S = 15.0
IDLE_REUSE_S = 4.0  # below uvicorn's 5 s keep-alive timeout: never send on a connection the server may close


# --------------------------------------------------------------------------------------------
# Preparation: model, feature files, published candidates
# --------------------------------------------------------------------------------------------


def prepare(
    folder: Path, redis_url: str, prefix: str, n_items: int, n_users: int, top_k: int
) -> tuple[Path, list[str], dict[str, float]]:
    """Train and save the ranker, write the feature tables, publish candidates; return (config file, users, metrics)."""
    from models.ranker import (
        embedding_retrieval,
        hashed_text_vectors,
        item_features,
        retrieval_candidates,
        save_ranker,
        train_ranker,
        user_topic_affinity,
    )
    from nightscore.demo_data import DEMO_BASE_TIME, generate_demo_data
    from nightscore.settings import DEFAULT_EVENT_WEIGHTS, Settings
    from serving.config import serving_config

    items, interactions = generate_demo_data(n_items, n_users)
    scores = items.select("item_id", "topic", pl.Series("topic_score", np.random.default_rng(0).uniform(0.4, 1.0, items.height)))
    vectors = hashed_text_vectors(items)
    model = train_ranker(items, interactions, scores, embedding_retrieval(vectors, DEFAULT_EVENT_WEIGHTS, HALF_LIFE_DAYS))
    table = item_features(items, interactions, scores, DEMO_BASE_TIME)
    table.write_parquet(folder / "item_features.parquet")
    user_topic_affinity(interactions, table, DEMO_BASE_TIME).write_parquet(folder / "user_features.parquet")
    candidates = retrieval_candidates(vectors, interactions, DEMO_BASE_TIME, top_k, DEFAULT_EVENT_WEIGHTS, HALF_LIFE_DAYS)
    users = publish(candidates, redis_url, prefix)
    config = serving_config(Settings(cache_url=redis_url, cache_prefix=prefix), save_ranker(model, folder / "ranker.pt"),
                            folder / "item_features.parquet", folder / "user_features.parquet", max_in_flight=512)
    path = folder / "serving.json"
    path.write_text(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}))
    return path, users, model.metrics


def publish(candidates: pl.DataFrame, redis_url: str, prefix: str) -> list[str]:
    """Publish run 'bench' of the candidates frame with the real RedisCache; return the user ids."""
    from storage.cache import RedisCache
    from storage.candidate_payload import encode_candidates

    grouped = candidates.sort("user_id", "rank").group_by("user_id", maintain_order=True).agg("item_id", "score")
    with RedisCache(redis_url, prefix) as cache:
        cache.write_version("bench", ((u, encode_candidates(ids, s)) for u, ids, s in grouped.iter_rows()))
        cache.switch_current("bench")
    return grouped.get_column("user_id").to_list()


def drop_keys(redis_url: str, prefix: str) -> int:
    """Delete every key of the benchmark's prefix; return how many."""
    import redis

    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    deleted = client.unlink(*keys) if keys else 0
    client.close()
    return deleted


# --------------------------------------------------------------------------------------------
# Server process
# --------------------------------------------------------------------------------------------


def serve(config_path: Path, port: int) -> None:
    """Run the service from a ServingConfig JSON file (the server subprocess)."""
    from serving.app import run_server
    from serving.config import ServingConfig

    raw = json.loads(config_path.read_text())
    for key in ("model_path", "item_features_path", "user_features_path"):
        raw[key] = None if raw[key] is None else Path(raw[key])
    run_server(ServingConfig(**raw), "127.0.0.1", port, log_level="warning")


def free_port() -> int:
    """Return a loopback TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(port: int, server: subprocess.Popen) -> None:
    """Poll /readyz until 200; raise when the server exits or the timeout passes."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server not ready in time")


# --------------------------------------------------------------------------------------------
# Open-loop driver (a separate process)
# --------------------------------------------------------------------------------------------


class Pool:
    """Keep-alive HTTP/1.1 connections to one server, at most `size` at once."""

    def __init__(self, port: int, size: int) -> None:
        self.port = port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
        self.slots = asyncio.Semaphore(size)
        self.opened = 0

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Return the most recently used connection idle for less than IDLE_REUSE_S, or a new one."""
        now = asyncio.get_running_loop().time()
        while self.idle:
            reader, writer, last_used = self.idle.pop()
            if now - last_used < IDLE_REUSE_S and not reader.at_eof():
                return reader, writer
            writer.close()
        self.opened += 1
        return await asyncio.open_connection("127.0.0.1", self.port)

    async def get(self, path: bytes) -> tuple[int, bytes]:
        """Send one GET on an idle (or new) connection; return (status, body)."""
        async with self.slots:
            reader, writer = await self._connection()
            try:
                status, body, keep = await _exchange(reader, writer, path)
            except BaseException:
                writer.close()  # a half-read response leaves the connection unusable
                raise
            if keep:
                self.idle.append((reader, writer, asyncio.get_running_loop().time()))
            else:
                writer.close()
            return status, body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: bytes) -> tuple[int, bytes, bool]:
    """Write one request, read one response; return (status, body, connection reusable)."""
    writer.write(b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split()[1]), body, headers.get("connection", "").lower() != "close"


async def _one(pool: Pool, path: bytes, due: float) -> tuple[str, float, bool]:
    """Run one request due at `due` (loop time); return (status or error name, latency from due, fallback)."""
    loop = asyncio.get_running_loop()
    try:
        status, body = await asyncio.wait_for(pool.get(path), REQUEST_TIMEOUT_S)
        outcome, fallback = str(status), b'"fallback":"popular"' in body
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
        outcome, fallback = type(exc).__name__, False
    return outcome, loop.time() - due, fallback


async def drive(port: int, rate: float, duration: float, users: list[str], n: int, connections: int) -> dict[str, object]:
    """Send rate x duration requests on schedule; return the outcomes, latencies and the driver's own lag."""
    pool, loop = Pool(port, connections), asyncio.get_running_loop()
    paths = [f"/v1/users/{u}/recommendations?n={n}".encode() for u in users]
    start, tasks, max_lag = loop.time() + 0.1, [], 0.0
    for i in range(int(rate * duration)):
        due = start + i / rate
        if (delay := due - loop.time()) > 0:
            await asyncio.sleep(delay)
        max_lag = max(max_lag, loop.time() - due)
        tasks.append(asyncio.create_task(_one(pool, paths[i % len(paths)], due)))
    done, pending = await asyncio.wait(tasks, timeout=DRAIN_TIMEOUT_S)
    for task in pending:
        task.cancel()
    results = [t.result() for t in done]
    return {"rate": rate, "sent": len(tasks), "unfinished": len(pending), "elapsed": loop.time() - start,
            "outcomes": [r[0] for r in results], "latencies": [r[1] for r in results],
            "fallbacks": sum(r[2] for r in results), "max_send_lag": max_lag, "connections": pool.opened}


def run_driver(port: int, rate: float, duration: float, users_file: Path, n: int, connections: int) -> None:
    """Drive one rate and print its raw results as one JSON line (the driver subprocess)."""
    users = users_file.read_text().split()
    print(json.dumps(asyncio.run(drive(port, rate, duration, users, n, connections))))


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------


def summarise(raw: dict) -> dict[str, object]:
    """Return one table row: counts, achieved rate of 200s and latency percentiles in ms."""

    outcomes, latencies = raw["outcomes"], np.array(raw["latencies"]) * 1000
    ok = np.array([o == "200" for o in outcomes], dtype=bool)
    errors: dict[str, int] = {}
    for outcome in outcomes:
        if outcome != "200":
            errors[outcome] = errors.get(outcome, 0) + 1
    if raw["unfinished"]:
        errors["unfinished"] = raw["unfinished"]
    pct = np.percentile(latencies[ok], [50, 95, 99]) if ok.any() else [float("nan")] * 3
    return {"target": raw["rate"], "sent": raw["sent"], "ok": int(ok.sum()), "errors": errors,
            "achieved": ok.sum() / raw["elapsed"], "p50": pct[0], "p95": pct[1], "p99": pct[2],
            "max": latencies[ok].max() if ok.any() else float("nan"), "fallbacks": raw["fallbacks"],
            "lag": raw["max_send_lag"] * 1000, "connections": raw["connections"]}


def render(rows: list[dict[str, object]]) -> str:
    """Return the side-by-side table of every rate."""
    head = (f"{'target rps':>10} {'sent':>6} {'ok':>6} {'achieved rps':>12} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
            f"{'max ms':>8} {'fallback':>8} {'opened':>6} {'send lag ms':>11}  errors")
    lines = [head, "-" * len(head)]
    for r in rows:
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(r["errors"].items())) or "0"  # type: ignore[union-attr]
        lines.append(f"{r['target']:>10.0f} {r['sent']:>6} {r['ok']:>6} {r['achieved']:>12.1f} {r['p50']:>8.2f} "
                     f"{r['p95']:>8.2f} {r['p99']:>8.2f} {r['max']:>8.2f} {r['fallbacks']:>8} {r['connections']:>6} "
                     f"{r['lag']:>11.1f}  {errors}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options (the --serve and --drive modes are internal)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per rate")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--top-k", type=int, default=100, help="candidates per user in the cache")
    parser.add_argument("--n", type=int, default=10, help="items asked per request")
    parser.add_argument("--connections", type=int, default=64, help="most keep-alive connections of the driver")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--drive", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def measure_rate(args: argparse.Namespace, port: int, users_file: Path, rate: float) -> dict[str, object]:
    """Run the driver subprocess for one rate and return its summarised row."""
    cmd = [sys.executable, __file__, "--drive", str(users_file), "--port", str(port), "--rates", str(rate),
           "--duration", str(args.duration), "--n", str(args.n), "--connections", str(args.connections)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True,
                          timeout=args.duration + DRAIN_TIMEOUT_S + REQUEST_TIMEOUT_S + 30)
    return summarise(json.loads(done.stdout.strip().splitlines()[-1]))


def orchestrate(args: argparse.Namespace) -> int:
    """Prepare, start the server, measure every rate, print the table, clean up."""
    prefix, folder = f"bench-ranker:{uuid.uuid4().hex[:12]}", Path(tempfile.mkdtemp(prefix="ranker-load-"))
    server = None
    try:
        config_path, users, metrics = prepare(folder, args.redis, prefix, args.items, args.users, args.top_k)
        log.info("ranker offline metrics: %s", metrics)
        users_file = folder / "users.txt"
        users_file.write_text("\n".join(users))
        port = free_port()
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(config_path), "--port", str(port)])
        wait_ready(port, server)
        rows = []
        for rate in args.rates:
            rows.append(measure_rate(args, port, users_file, rate))
            log.info("rate %.0f done", rate)
        print(f"\nonline ranker, {len(users)} users x {args.top_k} candidates, n={args.n}, {args.duration:g} s per rate, "
              f"1 uvicorn process, {os.cpu_count()} CPUs (driver on the same host)\n")
        print(render(rows))
        return 0
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        log.info("deleted %d keys of %s", drop_keys(args.redis, prefix), prefix)
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the server, the driver, or the whole benchmark."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    if args.serve:
        serve(args.serve, args.port)
        return 0
    if args.drive:
        run_driver(args.port, args.rates[0], args.duration, args.drive, args.n, args.connections)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
