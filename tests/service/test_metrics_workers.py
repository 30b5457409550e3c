"""Service test of /metrics under `nightscore serve --workers 2`: whichever worker answers a scrape, it reports every
worker's requests (prometheus_client's multiprocess mode), so no counter ever goes back between scrapes."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from storage.cache import SqliteCache
from tests.service.conftest import API_KEY, AUTH, Served, free_port, publish

START_TIMEOUT_S = 90.0
REQUESTS = 40
SCRAPES = 12
COUNTER = re.compile(r'^nightscore_requests_total\{endpoint="recommendations",status="200"\} (\S+)$', re.MULTILINE)


@pytest.fixture
def two_workers(served: Served, tmp_path: Path) -> Iterator[str]:
    """Yield the URL of `nightscore serve --workers 2` over a SQLite cache with run r1 (stopped after)."""
    binary = shutil.which("nightscore", path=str(Path(sys.executable).parent))
    if binary is None:
        pytest.skip("the nightscore command is not installed in this environment")
    cache = str(tmp_path / "cache.sqlite")
    with SqliteCache(cache, "nstest") as opened:
        publish(opened, "r1", served.entries)
    port = free_port()
    env = {
        **os.environ,
        "NIGHTSCORE_LAKE_URL": str(served.lake_root),
        "NIGHTSCORE_CACHE_URL": cache,
        "NIGHTSCORE_CACHE_PREFIX": "nstest",
        "NIGHTSCORE_SERVING_API_KEYS": f'["{API_KEY}"]',
        "NIGHTSCORE_SERVING_RATE_LIMIT_PER_S": "0",
    }
    command = [binary, "serve", "--workers", "2", "--port", str(port), "--home", str(tmp_path / "home")]
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, server)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def wait_ready(url: str, server: subprocess.Popen[bytes]) -> None:
    """Return once both workers can answer (a handful of fresh connections all ready), or fail with the server's log."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"nightscore serve exited: {server.stderr.read().decode()[-2000:] if server.stderr else ''}")
        try:
            if all(httpx.get(f"{url}/readyz", timeout=2).status_code == 200 for _ in range(8)):
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    pytest.fail("nightscore serve did not get ready")


def scrape(url: str) -> float:
    """Return the recommendations-200 counter of one scrape on a fresh connection (any worker may answer)."""
    text = httpx.get(f"{url}/metrics", headers=AUTH | {"Connection": "close"}, timeout=5).text
    found = COUNTER.search(text)
    return float(found.group(1)) if found else 0.0


def test_counters_never_decrease_across_scrapes_of_two_workers(two_workers: str, served: Served) -> None:
    user = sorted(served.entries)[0]
    seen = []
    for k in range(REQUESTS):
        response = httpx.get(f"{two_workers}/v1/users/{user}/recommendations", headers=AUTH | {"Connection": "close"}, timeout=5)
        assert response.status_code == 200
        if k % 4 == 3:
            seen.append(scrape(two_workers))
    seen += [scrape(two_workers) for _ in range(SCRAPES)]
    assert all(b >= a for a, b in itertools.pairwise(seen)), seen
    assert seen[-SCRAPES:] == [float(REQUESTS)] * SCRAPES, seen  # every scrape counts both workers' requests
