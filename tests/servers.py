"""Real servers the tests start on loopback and stop: a Prefect API server (SQLite or PostgreSQL)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest

PREFECT = str(Path(sys.executable).with_name("prefect"))


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check: Callable[[], bool], timeout: float, proc: subprocess.Popen | None, what: str) -> None:
    """Wait until check() is true; fail if proc exits first or the timeout passes."""
    deadline = time.monotonic() + timeout
    while not check():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode} before it was ready")
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not ready after {timeout}s")
        time.sleep(0.1)


def healthy(api_url: str, auth: str | None = None) -> bool:
    """Return whether the Prefect API at api_url answers /health."""
    request = urllib.request.Request(f"{api_url}/health")
    if auth:
        import base64

        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def prefect_server(home: Path, database_url: str | None = None, auth: str | None = None,
                   ui: bool = False) -> Iterator[str]:
    """Start `prefect server start` on a free loopback port; yield its API URL; stop it after.

    database_url: PREFECT_API_DATABASE_CONNECTION_URL (PostgreSQL); default SQLite under home.
    auth: "user:password" for PREFECT_SERVER_API_AUTH_STRING (basic auth on).
    """
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "true" if ui else "false"}
    env.pop("PREFECT_API_URL", None)
    if database_url:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    if auth:
        env["PREFECT_SERVER_API_AUTH_STRING"] = auth
    log = open(home / "server.log", "ab")
    server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    try:
        wait_for(lambda: healthy(url, auth), 180, server, "Prefect server")
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()
