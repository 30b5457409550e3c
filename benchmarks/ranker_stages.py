"""Where a recommendation request's CPU goes: each stage of the online ranker timed in-process, before and after.

It builds the load benchmark's served run (benchmarks/ranker_load.py: the candidate stage on demo data, published
to Redis under its own prefix), then times each stage of a request on it, in microseconds of CPU per request
(``time.process_time``: another process on the same cores does not count, so a busy host still gives usable
figures): the HTTP parse (httptools), the guard (key and rate limit), the cache round trip (client side, 16 at
once), the entry's decode (feature assembly), scoring (alone and 16 requests stacked), ranking (decode, score, top
n), recommend() (cache read and ranking, 16 at once, per-request scoring and batched), serialisation, metrics, and
the whole request through the ASGI app without sockets (16 at once). What is left of a served request, uvicorn's
protocol and the socket calls, shows in a sampling profile of a loaded worker: ``--summarise PROFILE`` sorts the
samples of py-spy's raw output (``py-spy record -p <worker pid> -f raw -o PROFILE`` while wrk runs) into the same
stages (docs/serving.md).

With ``--baseline DIR`` (a source tree of the service before a change, e.g. ``git worktree add /tmp/before HEAD``)
each tree is measured in processes of its own, alternately, and the table puts them side by side. Keys are removed
at the end. Usage:

    python benchmarks/ranker_stages.py [--baseline /tmp/before] [--repeats 3] [--requests 2000]
    python benchmarks/ranker_stages.py --summarise before.txt after.txt
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: a baseline tree put first there wins (--baseline)

from ranker_load import BENCH_KEY, blocked_modules_folder, cpu_flags, drop_keys, prepare  # noqa: E402

log = logging.getLogger("stages")
CONCURRENT = 16  # requests in flight at once in the async stages (wrk's connections in the load benchmark)
STAGES = (
    ("http parse (httptools)", "parse"),
    ("guard: key + rate limit", "guard"),
    ("cache round trip (client CPU, 16 at once)", "read"),
    ("decode entry (feature assembly)", "decode"),
    ("score one request", "score_one"),
    ("score 16 requests stacked, per request", "score_16"),
    ("rank: decode + score + top n", "rank"),
    ("recommend(): read + rank, per-request scoring", "recommend_direct"),
    ("recommend(): read + rank, batched", "recommend_batched"),
    ("serialise the answer", "serialise"),
    ("metrics: count + latency", "metrics"),
    ("whole request, ASGI in-process, batched", "full"),
)
# A profile's stages. A sample belongs to the first of PROFILE_STAGES with a marker in any frame of its stack
# (scoring before rank, which awaits it; redis-py's timed sends run in tasks of their own, whose stacks hold only
# redis/); else to the server layer of its innermost frame in one (every stack runs inside uvicorn's protocol).
PROFILE_STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("event posts", ("serving/events.py", "RedisEvents", "SqliteEvents")),
    ("cache round trip (client)", ("RedisReader.read", "PipelinedScript", "_Replies.", "SqliteReader.read", "redis/")),
    ("scoring (model)", ("Scorer.predict",)),
    ("batcher (queue, futures)", ("MicroBatcher.", "_score_group")),
    ("decode entry", ("decode_entry",)),
    ("rank: top n, exclusions, answer", ("Recommender.rank", "Recommender.popular")),
    ("serialisation", ("recommendation_body", "JSONResponse", "json/")),
    ("guard: key + rate limit", ("Guard.refusal",)),
    ("metrics", ("Metrics.observe", "prometheus_client")),
)
SERVER_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("uvicorn: HTTP parse, protocol, socket writes", ("uvicorn/protocols", "uvicorn/middleware")),
    (
        "routing, validation, middleware, glue",
        ("fastapi/", "starlette/", "pydantic", "Limit.", "Metrics.", "Guard.", "FastRecommendations.", "Recommender."),
    ),
)
OTHER = "event loop, other"


# --------------------------------------------------------------------------------------------
# Measuring one tree (a subprocess whose PYTHONPATH starts with the tree)
# --------------------------------------------------------------------------------------------


def cpu_us(call: Callable[[int], object], count: int) -> float:
    """Return the CPU microseconds per call of call(i) for i in range(count)."""
    started = time.process_time()
    for i in range(count):
        call(i)
    return (time.process_time() - started) / count * 1e6


async def cpu_us_async(call: Callable[[int], Awaitable[object]], count: int) -> float:
    """Return the CPU microseconds per call of call(i), CONCURRENT at a time."""
    started = time.process_time()
    for first in range(0, count, CONCURRENT):
        await asyncio.gather(*(call(i) for i in range(first, first + CONCURRENT)))
    return (time.process_time() - started) / count * 1e6


def request_scope(user_id: str, n: int) -> dict[str, Any]:
    """Return the ASGI scope of GET /v1/users/<user_id>/recommendations?n=<n> with the benchmark's key."""
    path = f"/v1/users/{user_id}/recommendations"
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": f"n={n}".encode(),
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {BENCH_KEY}".encode())],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }


async def asgi_request(app: Any, scope: dict[str, Any]) -> int:
    """Return the status of one request sent through the ASGI app in-process."""
    statuses: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await app(scope, receive, send)
    return statuses[0]


def serialiser() -> Callable[[Any], object]:
    """Return how this tree turns an answer into its response body (orjson body after, JSONResponse before)."""
    import serving.app

    body = getattr(serving.app, "recommendation_body", None)
    if body is not None:
        return body
    from fastapi.responses import JSONResponse

    return lambda recommendation: JSONResponse(recommendation.as_json())


def http_parser() -> Callable[[int], object]:
    """Return a call parsing one raw GET with httptools, as uvicorn's protocol does first."""
    import httptools

    class Sink:
        def on_url(self, url: bytes) -> None:
            self.url = url

        def on_header(self, name: bytes, value: bytes) -> None:
            self.last = (name, value)

    raw = f"GET /v1/users/user-00001/recommendations?n=10 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {BENCH_KEY}\r\n\r\n"
    data = raw.encode()
    return lambda _i: httptools.HttpRequestParser(Sink()).feed_data(data)


def measure_tree(redis_url: str, prefix: str, lake: Path, users: list[str], count: int) -> dict[str, float]:
    """Return CPU microseconds per request of every stage, for the service code on sys.path."""
    import numpy as np
    import uvloop
    from threadpoolctl import threadpool_limits

    from core.settings import CacheSettings, LakeSettings, Settings
    from serving.app import create_app
    from serving.batcher import DirectScoring, MicroBatcher
    from serving.config import serving_config
    from serving.guard import Guard
    from storage.candidate_payload import decode_entry

    threadpool_limits(1)  # as each worker does (serving_blas_threads)
    settings = Settings(cache=CacheSettings(url=redis_url, prefix=prefix), lake=LakeSettings(url=str(lake)))
    config = serving_config(settings, api_keys=[BENCH_KEY], rate_limit_per_s=1e9, rate_limit_burst=1_000_000_000)
    app = create_app(config)
    recommender = app.state.recommender
    guard = Guard(app, config.options)
    out: dict[str, float] = {}

    async def run() -> None:
        async with app.router.lifespan_context(app):
            reader, run = recommender.reader, recommender.runs.latest
            known = users[:64]
            found = {u: await reader.read(u) for u in known}
            entries = [decode_entry(found[u].entry) for u in known]
            stacked = np.concatenate([e.features for e in entries[:16]])
            out["parse"] = cpu_us(http_parser(), count)
            scopes = [request_scope(u, 10) for u in users]
            out["guard"] = cpu_us(lambda i: guard.refusal(scopes[i % len(scopes)]), count)
            out["read"] = await cpu_us_async(lambda i: reader.read(users[i % len(users)]), count)
            out["decode"] = cpu_us(lambda i: decode_entry(found[known[i % 64]].entry), count)
            out["score_one"] = cpu_us(lambda i: run.scorer.predict(entries[i % 64].features), count)
            out["score_16"] = cpu_us(lambda _i: run.scorer.predict(stacked), max(count // 16, 1)) / 16
            recommender.scoring = DirectScoring()
            out["rank"] = await cpu_us_async(lambda i: recommender.rank(known[i % 64], 10, run, found[known[i % 64]]), count)
            out["recommend_direct"] = await cpu_us_async(lambda i: recommender.recommend(users[i % len(users)], 10), count)
            recommender.scoring = MicroBatcher(config.options.max_batch, 0.0)
            out["recommend_batched"] = await cpu_us_async(lambda i: recommender.recommend(users[i % len(users)], 10), count)
            answer = await recommender.rank(known[0], 10, run, found[known[0]])
            out["serialise"] = cpu_us(lambda _i: serialiser()(answer), count)
            metrics = app.state.metrics
            out["metrics"] = cpu_us(lambda i: metrics.observe("recommendations", 200, 0.001), count)
            recommender.scoring = MicroBatcher(config.options.max_batch, 0.0)
            out["full"] = await cpu_us_async(lambda i: asgi_request(app, scopes[i % len(scopes)]), count)

    uvloop.install()
    asyncio.run(run())
    return out


# --------------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options (--measure is internal: one tree in a subprocess)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="source tree of the service before a change, measured beside this one")
    parser.add_argument(
        "--baseline-blocks",
        nargs="*",
        default=["hiredis"],
        help="modules the baseline's processes may not import (dependencies the change added)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="processes per tree, alternating; the median is shown")
    parser.add_argument("--requests", type=int, default=2000, help="calls per stage in each process")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--top-k", type=int, default=100, help="candidates per user in the cache")
    parser.add_argument("--summarise", type=Path, nargs="+", help="py-spy raw profiles of loaded workers: their stages")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def measure_in_subprocess(args: argparse.Namespace, tree: Path, blocks: list[str], folder: Path, prefix: str) -> dict[str, float]:
    """Run --measure with the tree first on PYTHONPATH (and blocked modules before it); return its figures."""
    path = [str(blocked_modules_folder(folder, blocks))] if blocks else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(tree)])}
    cmd = [sys.executable, __file__, "--measure", str(folder), "--prefix", prefix, "--redis", args.redis]
    done = subprocess.run(
        [*cmd, "--requests", str(args.requests)], env=env, cwd=tree, capture_output=True, text=True, check=False, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"measuring {tree} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def render(figures: dict[str, list[dict[str, float]]]) -> str:
    """Return the table: each stage's median CPU microseconds per request for each tree, and their ratio."""
    trees = list(figures)
    head = f"{'stage':<48}" + "".join(f"{t + ' us':>12}" for t in trees) + (f"{'ratio':>8}" if len(trees) == 2 else "")
    lines = [head, "-" * len(head)]
    for label, key in STAGES:
        medians = [statistics.median(run[key] for run in figures[t]) for t in trees]
        ratio = f"{medians[0] / medians[1]:>7.2f}x" if len(trees) == 2 and medians[1] > 0 else ""
        lines.append(f"{label:<48}" + "".join(f"{m:>12.1f}" for m in medians) + ratio)
    return "\n".join(lines)


def profile_stage(frames: list[str]) -> str:
    """Return the stage of one sampled stack (outermost frame first), or OTHER."""
    for label, markers in PROFILE_STAGES:
        if any(marker in frame for frame in frames for marker in markers):
            return label
    for frame in reversed(frames):
        for label, markers in SERVER_LAYERS:
            if any(marker in frame for marker in markers):
                return label
    return OTHER


def summarise_profile(path: Path) -> dict[str, float]:
    """Return each stage's share (%) of the samples of a raw profile ("frame;frame;... count" lines; a folder: all its
    .txt files, e.g. one per worker)."""
    counts: dict[str, int] = {}
    for part in sorted(path.glob("*.txt")) if path.is_dir() else [path]:
        for line in part.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                stage = profile_stage(stack.split(";"))
                counts[stage] = counts.get(stage, 0) + int(count)
    total = sum(counts.values()) or 1
    return {stage: 100 * n / total for stage, n in counts.items()}


def render_profiles(paths: list[Path]) -> str:
    """Return the table of each profile's stage shares, side by side."""
    shares = [summarise_profile(p) for p in paths]
    labels = [label for label, _ in (*PROFILE_STAGES, *SERVER_LAYERS)] + [OTHER]
    head = f"{'stage (share of samples, %)':<50}" + "".join(f"{p.stem[-22:]:>24}" for p in paths)
    lines = [head, "-" * len(head)]
    lines += [f"{label:<50}" + "".join(f"{s.get(label, 0.0):>24.1f}" for s in shares) for label in labels]
    return "\n".join(lines)


def orchestrate(args: argparse.Namespace) -> int:
    """Prepare the served run, measure each tree alternately, print the table, clean up."""
    prefix, folder = f"bench-stages:{uuid.uuid4().hex[:12]}", Path(tempfile.mkdtemp(prefix="ranker-stages-"))
    trees = {"before": (args.baseline, args.baseline_blocks)} if args.baseline else {}
    trees["after" if args.baseline else "this tree"] = (ROOT, [])
    try:
        users = prepare(folder, args.redis, prefix, args.items, args.users, args.top_k)
        (folder / "users.txt").write_text("\n".join(users))
        figures: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for repeat in range(args.repeats):
            for name, (tree, blocks) in trees.items():
                figures[name].append(measure_in_subprocess(args, tree, blocks, folder, prefix))
                log.info("repeat %d, %s: whole request %.0f us", repeat + 1, name, figures[name][-1]["full"])
        print(
            f"\nCPU microseconds per request, in-process, median of {args.repeats} processes x {args.requests} calls; "
            f"{len(users)} users x {args.top_k} candidates in Redis, n=10"
        )
        print(f"CPU: {cpu_flags()}\n")
        print(render(figures))
        return 0
    finally:
        log.info("deleted %d keys of %s", drop_keys(args.redis, prefix), prefix)
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Measure one tree (--measure), or run the whole comparison."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    if args.summarise:
        print(render_profiles(args.summarise))
        return 0
    if args.measure:
        users = (args.measure / "users.txt").read_text().split()
        figures = measure_tree(args.redis, args.prefix, args.measure / "lake", users, args.requests)
        print(json.dumps(figures))
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
