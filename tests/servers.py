"""Real servers the tests start on loopback and stop: a Prefect API server (SQLite or PostgreSQL), an S3 server (moto)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tasks.local_server import healthy

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


@contextmanager
def serving(
    args: list[str],
    env: dict[str, str] | None,
    log_path: Path,
    ready: Callable[[], bool],
    timeout: float,
    what: str,
    stop_timeout: float,
) -> Iterator[subprocess.Popen]:
    """Start a server in its own process group (output to log_path), wait until ready(); SIGTERM the group after
    (SIGKILL past stop_timeout)."""
    log = open(log_path, "ab")  # noqa: SIM115 - closed in the finally below, after the server stopped
    server = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(ready, timeout, server, what)
        yield server
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


@contextmanager
def prefect_server(home: Path, database_url: str | None = None, auth: str | None = None, ui: bool = False) -> Iterator[str]:
    """Start `prefect server start` on a free loopback port; yield its API URL; stop it after.

    database_url: PREFECT_API_DATABASE_CONNECTION_URL (PostgreSQL); default SQLite under home.
    auth: "user:password" for PREFECT_SERVER_API_AUTH_STRING (basic auth on).
    """
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "true" if ui else "false",
    }
    env.pop("PREFECT_API_URL", None)
    env["PREFECT_UI_API_URL"] = f"http://127.0.0.1:{port}/api"  # else the UI looks for its API on port 4200
    if database_url:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    if auth:
        env["PREFECT_SERVER_API_AUTH_STRING"] = auth
    url = f"http://127.0.0.1:{port}/api"
    with serving(
        [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env,
        home / "server.log",
        lambda: healthy(url, auth),
        180,
        "Prefect server",
        stop_timeout=30,
    ):
        yield url


# --- S3 (moto_server) ---------------------------------------------------------------------------

MOTO_SERVER = str(Path(sys.executable).with_name("moto_server"))
S3_BUCKET = "nightscore-test"


def http_answers(url: str) -> bool:
    """Return whether anything answers HTTP at url (an error status counts as an answer)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


@contextmanager
def moto_s3(log_dir: Path) -> Iterator[str]:
    """Start `moto_server` (an S3-compatible server) on a free loopback port; yield its endpoint URL; stop it after."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with serving(
        [MOTO_SERVER, "-H", "127.0.0.1", "-p", str(port)],
        None,
        log_dir / "moto_server.log",
        lambda: http_answers(endpoint),
        60,
        "moto_server",
        stop_timeout=15,
    ):
        yield endpoint


def s3_environment(endpoint: str, home: Path) -> dict[str, str]:
    """Return the AWS_* variables that point boto/s3fs at endpoint with dummy keys and no user config."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",  # s3fs: region by env; client_kwargs region_name breaks bucket creation
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(home / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "aws-credentials"),
    }


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Run one moto_server for the session; yield its endpoint URL."""
    with moto_s3(tmp_path_factory.mktemp("moto")) as endpoint:
        yield endpoint


@pytest.fixture
def s3_bucket(s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Export AWS_* for the session's moto_server, create a fresh bucket; yield "s3://<bucket>"."""
    import s3fs

    for name, value in s3_environment(s3_endpoint, tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    s3fs.S3FileSystem.clear_instance_cache()  # fsspec reuses instances; one made under other variables would stay
    bucket = f"{S3_BUCKET}-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem().mkdir(bucket)
    try:
        yield f"s3://{bucket}"
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


# --- a TCP proxy that resets connections on demand ---------------------------------------------


class ResettingProxy:
    """A loopback TCP proxy to host:port that resets connections (RST) on demand, as a flaky network does.

    ``reset_next`` connections are reset at once (then it relays again); ``reset_all`` resets every new one and
    every open relay. ``connections`` counts the connections accepted.
    """

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        import threading

        self.target = (host, port)
        self.reset_next, self.reset_all, self.connections = 0, False, 0
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                reset = self.reset_all or self.reset_next > 0
                self.reset_next = max(0, self.reset_next - 1)
            if reset:
                _rst(client)
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:  # the server behind is gone: so is this connection
                _rst(client)
                continue
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._relay, args=(a, b), daemon=True).start()

    def _relay(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if self.reset_all:
                    break
                target.sendall(data)
        except OSError:
            pass
        for sock in (source, target):
            _rst(sock) if self.reset_all else _close(sock)

    def cut(self) -> None:
        """Reset every open relay and every later connection (the network went away)."""
        self.reset_all = True
        with self._lock:
            for sock in self._open:
                _rst(sock)

    def close(self) -> None:
        """Stop accepting."""
        self._listener.close()


def _rst(sock: socket.socket) -> None:
    import struct

    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


@pytest.fixture
def proxy(s3_endpoint: str) -> Iterator[ResettingProxy]:
    """Yield a resetting proxy in front of the session's moto_server."""
    relay = ResettingProxy(int(s3_endpoint.rsplit(":", 1)[1]))
    yield relay
    relay.close()
