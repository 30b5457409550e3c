"""`nightscore up` / `down`: a Prefect server, the deployments and a worker on one machine, started and stopped together."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.environment import child_environment
from core.errors import StackError, UsageError
from core.settings import Settings
from tasks.local_server import healthy

log = logging.getLogger(__name__)

STATE_FILE = "up.json"


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _auth() -> str | None:
    """Return the client's basic-auth string, as Prefect's own settings read it (PREFECT_API_AUTH_STRING)."""
    from prefect.settings import get_current_settings

    secret = get_current_settings().api.auth_string
    return secret.get_secret_value() if secret is not None else None


def _wait(check: Callable[[], bool], proc: subprocess.Popen, what: str, log_file: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if proc.poll() is not None:
            raise StackError(f"{what} exited with {proc.returncode} before it was ready; see {log_file}")
        if time.monotonic() > deadline:
            raise StackError(f"{what} not ready after {timeout_s:.0f} s; see {log_file}")
        time.sleep(0.25)


def _start(args: list[str], env: dict[str, str], log_file: Path) -> subprocess.Popen:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:  # the child keeps its own handle
        return subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )


def server_env(settings: Settings, host: str) -> dict[str, str]:
    """Return the server's environment: its own PREFECT_HOME under the nightscore home, UI on, no telemetry.

    The UI finds the API through PREFECT_UI_API_URL, which Prefect derives from PREFECT_SERVER_API_PORT,
    not from `--port`: without it a UI on another port than 4200 cannot reach its own API.
    """
    env = child_environment(
        settings,
        {
            "PREFECT_HOME": str(Path(settings.home).resolve() / "prefect"),
            "PREFECT_UI_ENABLED": "true",
            "PREFECT_SERVER_API_HOST": host,
            "PREFECT_SERVER_API_PORT": str(settings.ops.prefect_port),
            "PREFECT_UI_API_URL": f"http://{host}:{settings.ops.prefect_port}/api",
        },
    )
    env.pop("PREFECT_API_URL", None)
    return env


def worker_env(settings: Settings, api_url: str) -> dict[str, str]:
    """Return the worker's environment: the API URL and the settings (NIGHTSCORE_*) its flow runs inherit."""
    # Polling every 2 s instead of Prefect's 10 s cuts the trigger-to-running latency of on-demand runs.
    return child_environment(settings, {"PREFECT_API_URL": api_url, "PREFECT_WORKER_QUERY_SECONDS": "2"})


def worker_online(pool: str) -> bool:
    """Return whether a worker of the pool has sent a heartbeat."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return any(w.status == "ONLINE" or w.last_heartbeat_time for w in client.read_workers_for_work_pool(pool))


def read_state(settings: Settings) -> dict[str, Any] | None:
    """Return what `up` recorded under the home (pids, URLs), or None."""
    path = Path(settings.home) / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else None


def up(settings: Settings, host: str = "127.0.0.1", timeout_s: float = 180) -> dict[str, Any]:
    """Start a Prefect server, register the deployments, start a worker; return pids and URLs once all are ready."""
    from deployments.deploy import deploy_all, require_inputs  # imported here for start-up speed: Prefect loads in seconds

    require_inputs(settings)
    running = read_state(settings)
    if running and healthy(running["api_url"], _auth()):
        raise StackError(f"nightscore is already up at {running['ui_url']}: run `nightscore down` first")
    home = Path(settings.home).resolve()
    base = f"http://{host}:{settings.ops.prefect_port}"
    api_url = f"{base}/api"
    if healthy(api_url, _auth()):
        raise StackError(f"something already answers at {api_url}: set NIGHTSCORE_PREFECT_PORT or stop it")
    server = _start(
        [_bin("prefect"), "server", "start", "--host", host, "--port", str(settings.ops.prefect_port)],
        server_env(settings, host),
        home / "logs" / "prefect-server.log",
    )
    state = {"server_pid": server.pid, "api_url": api_url, "ui_url": base, "home": str(home)}
    _save(home, state)
    _wait(lambda: healthy(api_url, _auth()), server, "Prefect server", home / "logs" / "prefect-server.log", timeout_s)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        state["deployments"] = {name: str(i) for name, i in deploy_all(settings).items()}
        worker = _start(
            [_bin("prefect"), "worker", "start", "--pool", settings.ops.work_pool, "--type", "process"],
            worker_env(settings, api_url),
            home / "logs" / "prefect-worker.log",
        )
        state["worker_pid"] = worker.pid
        _save(home, state)
        _wait(
            lambda: worker_online(settings.ops.work_pool),
            worker,
            "Prefect worker",
            home / "logs" / "prefect-worker.log",
            timeout_s,
        )
    return state


def _save(home: Path, state: dict[str, Any]) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / STATE_FILE).write_text(json.dumps(state, indent=2))


def _stop(pid: int | None, what: str, timeout_s: float = 30) -> bool:
    """SIGTERM a process group, SIGKILL it after timeout_s; return whether something was running."""
    if not pid:
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    log.warning("%s (pid %d) ignored SIGTERM for %.0f s: killing it", what, pid, timeout_s)
    os.killpg(pid, signal.SIGKILL)
    return True


def down(settings: Settings) -> list[str]:
    """Stop what `up` started, the worker before the server (the other order hangs the worker); return what stopped."""
    state = read_state(settings)
    if state is None:
        return []
    stopped = [name for name, key in (("worker", "worker_pid"), ("server", "server_pid")) if _stop(state.get(key), name)]
    (Path(settings.home) / STATE_FILE).unlink(missing_ok=True)
    return stopped


@contextmanager
def prefect_api(settings: Settings) -> Iterator[str]:
    """Talk to the Prefect API of PREFECT_API_URL, else the one `nightscore up` started, inside the block."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    url = get_current_settings().api.url or (read_state(settings) or {}).get("api_url")
    if not url:
        raise UsageError("no Prefect server: run `nightscore up` or set PREFECT_API_URL")
    if not healthy(url, _auth()):
        raise StackError(f"the Prefect API at {url} does not answer (is the server up? `nightscore up`, PREFECT_API_URL)")
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield url
