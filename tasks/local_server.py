"""Prefect's temporary local server (its ephemeral mode), started while a command still imports its flow.

Without PREFECT_API_URL, a flow run starts a server process of its own the first time it needs the API and waits for
it to answer: 5.1 s on a 2-core AVX2 EPYC, after the 3 s the nightly flow's modules take to import. Started here
first, the server's process comes up on the second core while this one imports.

The process is spawned here with the command Prefect's SubprocessASGIServer uses, not through that class: its module
(prefect.server.api.server) costs this process 2.3 s of imports (FastAPI, SQLAlchemy, the server's models) before the
spawn, and a run that is only a client of the server never needs it. The run then uses the server by its URL
(api_scope), as a run given PREFECT_API_URL does, and the server stops when this process exits.
"""

from __future__ import annotations

import atexit
import base64
import logging
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import closing, contextmanager
from pathlib import Path

from core.errors import StackError

log = logging.getLogger(__name__)

PORTS = range(8000, 9000)  # Prefect's own range for temporary servers
PORT_TAKEN = 3  # uvicorn's exit status when it cannot bind
SPAWNS = 5  # server processes tried, each on a new port, before giving up
_STARTED: list[str] = []  # the API URL of the temporary server this process started, once it answers


def start_local_server() -> Future[str]:
    """Return the future API URL of this process's flow runs: the configured one, done at once; else a temporary
    server's, returned once its process exists, with a thread waiting for it to answer (a failure is the future's).

    Run the flow inside api_scope(url): a flow run outside it would start a second temporary server of its own.
    """
    started: Future[str] = Future()
    configured = prefect_api_url()
    if configured:
        started.set_result(configured)
        return started
    port = _free_port()
    process = _spawn(port)
    threading.Thread(target=_wait, args=(process, port, started), name="prefect-server-start", daemon=True).start()
    return started


def prefect_api_url() -> str | None:
    """Return the Prefect API URL configured for this process (environment or profile), or None in ephemeral mode
    (a temporary server this module started is not a configured one)."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    return None if url is None or url in _STARTED else url


@contextmanager
def api_scope(url: str) -> Iterator[None]:
    """Point this process's Prefect client at url for the block."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


def _spawn(port: int) -> subprocess.Popen[bytes]:
    """Return the started server process on port (Prefect's temporary server: no UI, the services of an ephemeral one)."""
    import prefect
    from prefect.settings import get_current_settings

    log.info("Starting temporary Prefect server on http://127.0.0.1:%d", port)
    command = [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(prefect.__file__).parent.parent)]
    command += ["--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--log-level", "error", "--lifespan", "on"]
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
    env.update(get_current_settings().to_environment_variables(exclude_unset=True))
    process = subprocess.Popen(command, env=env)  # its output is this process's, as Prefect's own spawn has it
    atexit.register(_stop, process)
    return process


def _wait(process: subprocess.Popen[bytes], port: int, started: Future[str]) -> None:
    """Resolve started with the server's API URL once it answers (spawned again on another port, SPAWNS times in all,
    while its port was taken), or with why it never did (StackError)."""
    try:
        for spawned in range(1, SPAWNS + 1):
            url = _healthy(process, port)
            if url:
                _STARTED.append(url)
                started.set_result(url)
                return
            if spawned < SPAWNS:
                port = _free_port()
                process = _spawn(port)
        raise StackError(f"Prefect's temporary server lost its port {SPAWNS} times: set PREFECT_API_URL to a server")
    except BaseException as exc:  # handed to whoever waits for the server
        log.debug("Prefect's temporary server did not start", exc_info=exc)
        started.set_exception(exc)


def healthy(api_url: str, auth: str | None = None) -> bool:
    """Return whether the Prefect API answers /health (basic auth "user:password" when given)."""
    request = urllib.request.Request(f"{api_url}/health")
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _healthy(process: subprocess.Popen[bytes], port: int) -> str | None:
    """Return the API URL once the server on port answers its health check; None if its port was taken."""
    from prefect.settings import get_current_settings

    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + get_current_settings().server.ephemeral.startup_timeout_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            if process.returncode == PORT_TAKEN:
                return None
            raise StackError(f"Prefect's temporary server exited with status {process.returncode} (its output is above)")
        if healthy(url):
            return url
        time.sleep(0.1)
    _stop(process)
    timeout = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
    raise StackError(f"Prefect's temporary server did not answer on {url} within {timeout}: set PREFECT_API_URL to a server")


def _free_port() -> int:
    """Return a port of PORTS that nothing listens on now (the server may still lose it to a race: _wait respawns)."""
    for _ in range(20):
        port = random.choice(PORTS)
        with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            try:
                sock.bind(("127.0.0.1", port))
                return port
            except OSError:
                time.sleep(random.uniform(0.05, 0.2))
    raise StackError(f"no free port for Prefect's temporary server in {PORTS.start}-{PORTS.stop - 1}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the server process (terminate, then kill after 5 s) and reap it."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
