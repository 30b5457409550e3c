"""Prefect's temporary server, started before a command imports its flow (tasks/local_server.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import fresh_interpreter_output

# A command's order: the server first, then the flow's imports (left out here), then the wait; the run, inside
# api_scope, must use that same server, and this process must never have imported Prefect's server modules. The first
# spawn stands in for a server that lost its port (uvicorn exits with 3 when it cannot bind; a real lost port costs a
# whole server start before the bind fails): the wait must start another on a new port.
EPHEMERAL_RUN = """
import subprocess, sys
from tasks import local_server
from tasks.local_server import api_scope, prefect_api_url, start_local_server
real, ports = local_server._spawn, []
def spawn(port):
    ports.append(port)
    return real(port) if len(ports) > 1 else subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
local_server._spawn = spawn
started = start_local_server()
spawned = "flows.nightly" not in sys.modules and "prefect.server.api.server" not in sys.modules
url = started.result()
from prefect.client.orchestration import get_client
with api_scope(url):
    with get_client(sync_client=True) as client:
        healthy = client.api_healthcheck() is None
        same = url == str(client.api_url).rstrip("/")
    ephemeral = prefect_api_url() is None
respawned = len(ports) == 2 and url.endswith(f":{ports[-1]}/api")
print(spawned, same, healthy, ephemeral, "prefect.server.api.server" not in sys.modules, respawned, url)
"""


@pytest.fixture
def ephemeral_environment(tmp_path: Path) -> dict[str, str]:
    """Return a child's environment with no Prefect API configured and a Prefect home of its own."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return env | {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}


def test_the_temporary_server_starts_before_the_flow_imports_moves_off_a_taken_port_and_is_the_one_its_runs_use(
    ephemeral_environment: dict[str, str],
) -> None:
    output = fresh_interpreter_output(EPHEMERAL_RUN, env=ephemeral_environment)
    spawned, same, healthy, ephemeral, light, respawned, url = output.splitlines()[-1].split()
    assert spawned == "True", "the server's process had not started when the flow's imports began"
    assert (same, healthy) == ("True", "True"), f"the run's client did not use the started server {url}"
    assert ephemeral == "True", "the started server counts as a configured API (a Ray run would take it)"
    assert light == "True", "the client process imported Prefect's server modules (2.3 s of CPU)"
    assert respawned == "True", "a server that lost its port was not started again on another"
    assert url.startswith("http://127.0.0.1:") and url.endswith("/api")


def test_a_configured_api_is_returned_and_starts_no_server(prefect_server: str) -> None:
    from tasks.local_server import prefect_api_url, start_local_server

    started = start_local_server()
    assert started.done() and started.result() == prefect_server == prefect_api_url()


def test_a_server_that_exits_fails_the_future_with_its_status(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    from core.errors import StackError
    from tasks import local_server

    monkeypatch.setattr(local_server, "prefect_api_url", lambda: None)
    monkeypatch.setattr(local_server, "_spawn", lambda port: subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"]))
    with pytest.raises(StackError, match="exited with status 7"):
        local_server.start_local_server().result(timeout=30)


def test_a_server_that_keeps_losing_its_port_is_tried_a_bounded_number_of_times(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    from core.errors import StackError
    from tasks import local_server

    ports: list[int] = []

    def lost(port: int) -> subprocess.Popen[bytes]:
        ports.append(port)
        return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])

    monkeypatch.setattr(local_server, "prefect_api_url", lambda: None)
    monkeypatch.setattr(local_server, "_spawn", lost)
    with pytest.raises(StackError, match=f"lost its port {local_server.SPAWNS} times"):
        local_server.start_local_server().result(timeout=60)
    assert len(ports) == local_server.SPAWNS
