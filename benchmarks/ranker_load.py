"""Load benchmark of the online ranker: open-loop fixed rates against `nightscore serve` on loopback, one table out.

It builds a served run (the candidate stage on demo data, tests/service/conftest.build_served), publishes its
entries to Redis under its own key prefix, then for each configuration (per-request scoring or dynamic batching, 1
or 2 uvicorn workers) starts `nightscore serve` on a free port and drives it at each offered rate from a separate
process. Fixed rates need an open loop, which wrk (closed loop) is not: the driver is an asyncio generator, request
i is due at start + i / rate whatever happened before, and its latency runs from that due time (queueing in the
driver counts, so a saturated server shows as latency, not as a lower rate); "send lag" says when the driver itself
fell behind. Then wrk (where installed) drives the same mix closed-loop at a few connection counts: the saturation
rows. The mix: known users, unknown users, a few event posts. The service runs as deployed: every request carries
an API key and passes the per-client rate limit (set high enough that the one benchmark client is never refused).
Keys and files are removed at the end.

With ``--baseline DIR`` (a source tree of the service before a change, e.g. ``git worktree add /tmp/before HEAD``)
every configuration is measured twice, the baseline's server then this tree's, on the same data, and the table
shows them side by side ("before" / "after" rows). The baseline's processes cannot import the modules named by
``--baseline-blocks`` (default: hiredis, which the change added), so it runs as it did before them.

With ``--profile DIR`` each server samples its own CPU time during the first wrk row (a loaded worker;
benchmarks/cpu_profile/sitecustomize.py) into DIR/<config>/<pid>.txt; ``benchmarks/ranker_stages.py --summarise
DIR/*`` sorts the samples into the stages of a request. Usage:

    python benchmarks/ranker_load.py [--rates 100 300 1000 2000] [--duration 5] [--configs batching:2] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import cast

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: a baseline tree put first there wins (--baseline)

log = logging.getLogger("bench")
READY_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 5.0
DRAIN_TIMEOUT_S = 15.0
IDLE_REUSE_S = 4.0  # below uvicorn's 5 s keep-alive timeout: never send on a connection the server may close
BENCH_KEY = "ranker-benchmark-key-0123456789"  # the service's one API key; every request sends it
BENCH_RATE_PER_S = 1_000_000  # the rate limit is on, per client, far above what one client sends here


# --------------------------------------------------------------------------------------------
# Preparation: a served run (candidate stage on demo data), published to Redis
# --------------------------------------------------------------------------------------------


def prepare(folder: Path, redis_url: str, prefix: str, n_items: int, n_users: int, top_k: int) -> list[str]:
    """Build a served run in folder/lake (tests/service/conftest.build_served) and publish it to Redis; return its users."""
    from storage.cache_redis import RedisCache
    from tests.service.conftest import build_served, publish

    served = build_served(folder / "lake", n_items, n_users, top_k)
    with RedisCache(redis_url, prefix) as cache:
        publish(cache, "r1", served.entries)
    return sorted(served.entries)


def drop_keys(redis_url: str, prefix: str) -> int:
    """Delete every key under the prefix; return how many."""
    import redis

    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.unlink(*keys)
    client.close()
    return len(keys)


def blocked_modules_folder(folder: Path, modules: list[str]) -> Path:
    """Return a folder of stand-ins that refuse to import (first on PYTHONPATH, they hide the modules named)."""
    blocked = folder / "blocked-modules"
    blocked.mkdir(exist_ok=True)
    for name in modules:
        (blocked / f"{name}.py").write_text(f"raise ImportError('{name} is blocked: the baseline ran without it')\n")
    return blocked


def start_server(
    folder: Path, args: argparse.Namespace, prefix: str, port: int, workers: int, batching: bool, delay_us: str, tree: Path
) -> subprocess.Popen:
    """Start `nightscore serve` from a source tree on the benchmark's lake and Redis prefix, with the key and a limit."""
    blocks = args.baseline_blocks if tree != ROOT else []
    path = [str(blocked_modules_folder(folder, blocks))] if blocks else []
    profile = {}
    if args.profile is not None:  # the sampler first on the path: Python imports it as sitecustomize
        path.insert(0, str(ROOT / "benchmarks" / "cpu_profile"))
        label = f"{'before' if tree != ROOT else 'after'}-{'batching' if batching else 'per-request'}-{workers}w"
        profile["NIGHTSCORE_BENCH_PROFILE"] = str(args.profile.resolve() / label)
    env = {
        **os.environ,
        "NIGHTSCORE_HOME": str(folder / "home"),
        "NIGHTSCORE_LAKE_URL": str(folder / "lake"),
        "NIGHTSCORE_CACHE_URL": args.redis,
        "NIGHTSCORE_CACHE_PREFIX": prefix,
        "NIGHTSCORE_SERVING_BATCHING": str(batching).lower(),
        "NIGHTSCORE_SERVING_MAX_IN_FLIGHT": "512",
        "NIGHTSCORE_SERVING_EVENTS_MAX": "10000000",
        "NIGHTSCORE_SERVING_API_KEYS": json.dumps([BENCH_KEY]),
        "NIGHTSCORE_SERVING_RATE_LIMIT_PER_S": str(BENCH_RATE_PER_S),
        "NIGHTSCORE_SERVING_RATE_LIMIT_BURST": str(BENCH_RATE_PER_S),
        "PYTHONPATH": os.pathsep.join([*path, str(tree)]),
        **profile,
    }
    if delay_us:
        env["NIGHTSCORE_SERVING_MAX_QUEUE_DELAY_US"] = delay_us
    cmd = [str(Path(sys.executable).with_name("nightscore")), "serve", "--port", str(port), "--workers", str(workers)]
    return subprocess.Popen(
        cmd,
        env=env,
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=open(folder / f"serve-{port}.log", "wb"),
        start_new_session=True,
    )


def process_tree(pid: int) -> list[int]:
    """Return a process and its descendants, from /proc."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        found.append(current)
    return found


def rss_mb(pid: int) -> float:
    """Return the resident memory of a process and its descendants (MiB), from /proc."""
    total = 0
    for current in process_tree(pid):
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))
        except (OSError, StopIteration):
            continue
    return total / 1024


def cpu_s(pid: int) -> float:
    """Return the CPU seconds (user + system) a process and its descendants used so far, from /proc.

    CPU per answered request does not depend on what else runs on the host, as throughput on shared cores does.
    """
    total = 0
    for current in process_tree(pid):
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def cpu_flags() -> str:
    """Return the CPU model, family/model/stepping and its flags that matter for numpy/LightGBM (SIMD), from /proc/cpuinfo.

    A VM often names every EPYC "AMD EPYC": the family (23: Zen 1/2, 25: Zen 3/4, 26: Zen 5) tells them apart.
    """
    text = Path("/proc/cpuinfo").read_text()

    def field(name: str) -> str:
        return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.split(":")[0].strip() == name), "?")

    simd = [f for f in field("flags").split() if f.startswith(("sse", "ssse", "avx", "fma", "f16c", "bmi", "amx"))]
    where = f"family {field('cpu family')} model {field('model')} stepping {field('stepping')}"
    return f"{field('model name')} ({where}); {os.cpu_count()} CPUs; SIMD flags: {' '.join(simd)}"


def signal_tree(pid: int, signum: int) -> None:
    """Send a signal to a process and its descendants (the profiler's start and stop)."""
    for current in process_tree(pid):
        try:
            os.kill(current, signum)
        except ProcessLookupError:
            continue


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

    async def get(self, path: bytes, body: bytes | None = None) -> tuple[int, bytes]:
        """Send one GET (or a POST of body) on an idle (or new) connection; return (status, body)."""
        async with self.slots:
            reader, writer = await self._connection()
            try:
                status, answer, keep = await _exchange(reader, writer, path, body)
            except BaseException:
                writer.close()  # a half-read response leaves the connection unusable
                raise
            if keep:
                self.idle.append((reader, writer, asyncio.get_running_loop().time()))
            else:
                writer.close()
            return status, answer


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: bytes, body: bytes | None
) -> tuple[int, bytes, bool]:
    """Write one request, read one response; return (status, body, connection reusable)."""
    head = b"Host: 127.0.0.1\r\nAuthorization: Bearer " + BENCH_KEY.encode() + b"\r\n"
    if body is None:
        writer.write(b"GET " + path + b" HTTP/1.1\r\n" + head + b"\r\n")
    else:
        writer.write(
            b"POST " + path + b" HTTP/1.1\r\n" + head + b"Content-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split()[1]), body, headers.get("connection", "").lower() != "close"


async def _one(pool: Pool, request: tuple[bytes, bytes | None], due: float) -> tuple[str, float, bool]:
    """Run one request due at `due` (loop time); return (status or error name, latency from due, fallback)."""
    loop = asyncio.get_running_loop()
    try:
        status, body = await asyncio.wait_for(pool.get(*request), REQUEST_TIMEOUT_S)
        outcome, fallback = str(status), b'"fallback":"popular"' in body
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
        outcome, fallback = type(exc).__name__, False
    return outcome, loop.time() - due, fallback


async def drive(port: int, rate: float, duration: float, users: list[str], n: int, connections: int) -> dict[str, object]:
    """Send rate x duration requests on schedule; return the outcomes, latencies and the driver's own lag."""
    pool, loop = Pool(port, connections), asyncio.get_running_loop()
    paths = mix(users, n)
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
    return {
        "rate": rate,
        "sent": len(tasks),
        "unfinished": len(pending),
        "elapsed": loop.time() - start,
        "outcomes": [r[0] for r in results],
        "latencies": [r[1] for r in results],
        "fallbacks": sum(r[2] for r in results),
        "max_send_lag": max_lag,
        "connections": pool.opened,
    }


def mix(users: list[str], n: int) -> list[tuple[bytes, bytes | None]]:
    """Return the request mix, cycled: 88% known users, 10% unknown users, 2% event posts (clicks)."""
    out: list[tuple[bytes, bytes | None]] = []
    for i in range(1000):
        user = users[(i * 7919) % len(users)]
        if i % 50 == 7:
            body = json.dumps(
                {
                    "user_id": user,
                    "item_id": f"item-{i:06d}",
                    "event": "click",
                    "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
            ).encode()
            out.append((b"/v1/events", body))
        else:
            who = f"nobody-{i}" if i % 10 == 3 else user
            out.append((f"/v1/users/{who}/recommendations?n={n}".encode(), None))
    return out


def run_driver(port: int, rate: float, duration: float, users_file: Path, n: int, connections: int) -> None:
    """Drive one rate and print its raw results as one JSON line (the driver subprocess)."""
    users = users_file.read_text().split()
    print(json.dumps(asyncio.run(drive(port, rate, duration, users, n, connections))))


# --------------------------------------------------------------------------------------------
# Saturation: wrk (C, closed loop) where it is installed
# --------------------------------------------------------------------------------------------

WRK_SCRIPT = """
local requests = {}
local key = "Bearer %s"
init = function(args)
  for line in io.lines(args[1]) do requests[#requests + 1] = line end
  counter = 0
end
request = function()
  counter = counter + 1
  local line = requests[(counter %% #requests) + 1]
  if line:sub(1, 5) == "POST " then
    return wrk.format("POST", "/v1/events", {["Content-Type"] = "application/json", ["Authorization"] = key}, line:sub(6))
  end
  return wrk.format("GET", line, {["Authorization"] = key})
end
"""
WRK_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def write_wrk_inputs(folder: Path, users: list[str], n: int) -> tuple[Path, Path]:
    """Write wrk's Lua script and the request mix it cycles (one request per line); return both paths."""
    lines = [path.decode() if body is None else "POST " + body.decode() for path, body in mix(users, n)]
    (folder / "mix.txt").write_text("\n".join(lines) + "\n")
    (folder / "mix.lua").write_text(WRK_SCRIPT % BENCH_KEY)
    return folder / "mix.lua", folder / "mix.txt"


def _ms(text: str) -> float:
    """Return a wrk duration ('812.00us', '1.20ms', '2.01s') in milliseconds."""
    match = re.fullmatch(r"([0-9.]+)(us|ms|s)", text)
    return float(match.group(1)) * WRK_UNITS[match.group(2)] if match else float("nan")


def parse_wrk(out: str) -> dict[str, float]:
    """Return requests/s, latency percentiles (ms), non-2xx answers and socket errors from wrk --latency output."""
    pct = {f"p{m.group(1)}": _ms(m.group(2)) for m in re.finditer(r"^\s+(50|90|99)%\s+(\S+)", out, re.M)}
    rps = re.search(r"Requests/sec:\s+([0-9.]+)", out)
    total = re.search(r"(\d+) requests in", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    sockets = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {
        "rps": float(rps.group(1)) if rps else float("nan"),
        "requests": float(total.group(1)) if total else float("nan"),
        **pct,
        "non2xx": float(non2xx.group(1)) if non2xx else 0.0,
        "socket_errors": float(sum(int(g) for g in sockets.groups())) if sockets else 0.0,
    }


def saturate(port: int, script: Path, requests: Path, duration: float, connections: int, server: int) -> dict[str, float] | None:
    """Return wrk's closed-loop figures at `connections` connections (one wrk thread), or None without wrk."""
    wrk = shutil.which("wrk")
    if wrk is None:
        return None
    cmd = [wrk, "-t1", f"-c{connections}", f"-d{max(int(duration), 1)}s", "--latency", "-s", str(script)]
    used = cpu_s(server)
    done = subprocess.run(
        [*cmd, f"http://127.0.0.1:{port}", "--", str(requests)], capture_output=True, text=True, timeout=duration + 60
    )
    found = parse_wrk(done.stdout)
    return {**found, "cpu_us": (cpu_s(server) - used) / found["requests"] * 1e6}


def render_saturation(rows: list[dict[str, object]]) -> str:
    """Return the saturation table: wrk's closed-loop throughput and latency per configuration."""
    head = (
        f"{'config':<30} {'conns':>5} {'req/s':>8} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'non-2xx':>8} {'sock err':>8} "
        f"{'CPU us/req':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        p50, p90, p99 = (r.get(k, float("nan")) for k in ("p50", "p90", "p99"))
        lines.append(
            f"{r['config']:<30} {r['conns']:>5} {r['rps']:>8.0f} {p50:>7.2f} {p90:>7.2f} {p99:>7.2f} "
            f"{r['non2xx']:>8.0f} {r['socket_errors']:>8.0f} {r['cpu_us']:>10.0f}"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------


def summarise(raw: dict) -> dict[str, object]:
    """Return one table row: counts, achieved rate of 2xx answers, 429s, errors and latency percentiles in ms."""
    outcomes, latencies = raw["outcomes"], np.array(raw["latencies"]) * 1000
    ok = np.array([o in ("200", "202") for o in outcomes], dtype=bool)
    errors: dict[str, int] = {}
    for outcome in outcomes:
        if outcome not in ("200", "202", "429"):
            errors[outcome] = errors.get(outcome, 0) + 1
    if raw["unfinished"]:
        errors["unfinished"] = raw["unfinished"]
    pct = np.percentile(latencies[ok], [50, 95, 99, 99.9]) if ok.any() else [float("nan")] * 4
    return {
        "target": raw["rate"],
        "sent": raw["sent"],
        "ok": int(ok.sum()),
        "errors": errors,
        "429": outcomes.count("429"),
        "achieved": ok.sum() / raw["elapsed"],
        "p50": pct[0],
        "p95": pct[1],
        "p99": pct[2],
        "p999": pct[3],
        "lag": raw["max_send_lag"] * 1000,
    }


def wrk_version() -> str:
    """Return wrk's version line's first words, or 'absent'."""
    wrk = shutil.which("wrk")
    if wrk is None:
        return "absent"
    done = subprocess.run([wrk, "--version"], capture_output=True, text=True)
    return " ".join((done.stdout or done.stderr).split()[:2])


def render(rows: list[dict[str, object]]) -> str:
    """Return the side-by-side table of every configuration and rate."""
    head = (
        f"{'config':<30} {'offered':>7} {'sent':>6} {'2xx/s':>7} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} "
        f"{'p999 ms':>8} {'429':>5} {'RSS MiB before/after':>21} {'send lag ms':>11} {'CPU us/req':>10}  errors"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(cast(dict[str, int], r["errors"]).items())) or "0"
        lines.append(
            f"{r['config']:<30} {r['target']:>7.0f} {r['sent']:>6} {r['achieved']:>7.0f} {r['p50']:>7.2f} "
            f"{r['p95']:>7.2f} {r['p99']:>7.2f} {r['p999']:>8.2f} {r['429']:>5} "
            f"{r['rss_before']:>10.0f}/{r['rss_after']:<10.0f} {r['lag']:>11.1f} {r['cpu_us']:>10.0f}  {errors}"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options (the --drive mode is internal)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[100, 300, 1000, 2000, 3000, 4000])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per rate")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--top-k", type=int, default=100, help="candidates per user in the cache")
    parser.add_argument("--n", type=int, default=10, help="items asked per request")
    parser.add_argument("--connections", type=int, default=64, help="most keep-alive connections of the driver")
    parser.add_argument(
        "--configs",
        nargs="+",
        default=["per-request:1", "batching:1", "batching@1000:1", "per-request:2", "batching:2"],
        help="scoring:workers pairs to compare",
    )
    parser.add_argument(
        "--wrk-connections", type=int, nargs="+", default=[16, 64], help="wrk's connection counts for the saturation rows"
    )
    parser.add_argument("--baseline", type=Path, help="source tree of the service before a change, measured beside this one")
    parser.add_argument("--profile", type=Path, help="folder for each server's CPU-time samples during the first wrk row")
    parser.add_argument(
        "--baseline-blocks",
        nargs="*",
        default=["hiredis"],
        help="modules the baseline's processes may not import (dependencies the change added)",
    )
    parser.add_argument("--drive", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def measure_rate(args: argparse.Namespace, port: int, users_file: Path, rate: float) -> dict[str, object]:
    """Run the driver subprocess for one rate and return its summarised row."""
    cmd = [
        sys.executable,
        __file__,
        "--drive",
        str(users_file),
        "--port",
        str(port),
        "--rates",
        str(rate),
        "--duration",
        str(args.duration),
        "--n",
        str(args.n),
        "--connections",
        str(args.connections),
    ]
    done = subprocess.run(
        cmd, capture_output=True, text=True, check=True, timeout=args.duration + DRAIN_TIMEOUT_S + REQUEST_TIMEOUT_S + 30
    )
    return summarise(json.loads(done.stdout.strip().splitlines()[-1]))


def measure_config(
    args: argparse.Namespace, folder: Path, prefix: str, users_file: Path, config: str, tree: Path = ROOT, tag: str = ""
) -> tuple[list[dict], list[dict]]:
    """Start one server configuration from a tree, measure every rate (then wrk's saturation), stop it; return the rows."""
    scoring, workers = config.split(":")
    scoring, _, delay_us = scoring.partition("@")  # batching@500: a max queue delay of 500 us
    port = free_port()
    server = start_server(folder, args, prefix, port, int(workers), scoring == "batching", delay_us, tree)
    rows = []
    try:
        wait_ready(port, server)
        time.sleep(1.0 * int(workers))  # every worker warmed up, not only the one that answered
        for rate in args.rates:
            before, used = rss_mb(server.pid), cpu_s(server.pid)
            row = measure_rate(args, port, users_file, rate)
            rows.append(
                {
                    **row,
                    "config": f"{tag}{scoring}{'@' + delay_us + 'us' if delay_us else ''}, {workers}w",
                    "rss_before": before,
                    "rss_after": rss_mb(server.pid),
                    "cpu_us": (cpu_s(server.pid) - used) / max(cast(int, row["sent"]), 1) * 1e6,  # per request sent
                }
            )
            log.info("%s at %.0f/s: p99 %.2f ms, %.0f/s answered", config, rate, row["p99"], row["achieved"])
        label = rows[0]["config"] if rows else config
        saturation = []
        for i, conns in enumerate(args.wrk_connections):
            profiled = args.profile is not None and i == 0
            if profiled:
                signal_tree(server.pid, signal.SIGUSR1)
            found = saturate(port, folder / "mix.lua", folder / "mix.txt", args.duration, conns, server.pid)
            if profiled:
                signal_tree(server.pid, signal.SIGUSR2)
            if found is not None:
                saturation.append({**found, "config": label, "conns": conns})
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    return rows, saturation


def orchestrate(args: argparse.Namespace) -> int:
    """Prepare, measure every configuration at every rate, print the table, clean up."""
    prefix, folder = f"bench-ranker:{uuid.uuid4().hex[:12]}", Path(tempfile.mkdtemp(prefix="ranker-load-"))
    try:
        users = prepare(folder, args.redis, prefix, args.items, args.users, args.top_k)
        users_file = folder / "users.txt"
        users_file.write_text("\n".join(users))
        write_wrk_inputs(folder, users, args.n)
        trees = [(args.baseline, "before: "), (ROOT, "after: ")] if args.baseline else [(ROOT, "")]
        measured = [
            measure_config(args, folder, prefix, users_file, config, tree, tag)
            for config in args.configs
            for tree, tag in trees  # alternately: a change in the machine's load hits both alike
        ]
        rows = [row for fixed, _ in measured for row in fixed]
        saturation = [row for _, found in measured for row in found]
        print(
            f"\nonline ranker (nightscore serve, uvicorn), {len(users)} users x {args.top_k} candidates in Redis, n={args.n}, "
            f"mix 88% known / 10% unknown users / 2% event posts, {args.duration:g} s per rate, open-loop asyncio "
            f"driver (one process, {args.connections} keep-alive connections) on the same host; API key and rate limit on"
        )
        print(f"CPU: {cpu_flags()}\n")
        print(render(rows))
        if saturation:
            print(f"\nsaturation: {wrk_version()} closed loop, one thread, the same mix, {args.duration:g} s per row\n")
            print(render_saturation(saturation))
        else:
            print("\nsaturation: wrk not installed (the setup installs Debian's wrk where it may); see the fixed rates above")
        return 0
    finally:
        log.info("deleted %d keys of %s", drop_keys(args.redis, prefix), prefix)
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the driver, or run the whole benchmark."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    if args.drive:
        run_driver(args.port, args.rates[0], args.duration, args.drive, args.n, args.connections)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
