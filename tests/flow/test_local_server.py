"""Prefect's temporary server, started before a command imports its flow (tasks/local_server.py)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.helpers import fresh_interpreter_output

# A command's order: the server first, then the flow's imports (left out here), then the wait; the run must use that
# same server.
EPHEMERAL_RUN = """
import sys
from tasks.local_server import start_local_server
started = start_local_server()
from prefect.server.api.server import SubprocessASGIServer
server = SubprocessASGIServer()
spawned = server.server_process is not None and "flows.nightly" not in sys.modules
url = started.result()
from prefect.client.orchestration import get_client
with get_client(sync_client=True) as client:
    healthy = client.api_healthcheck() is None
    print(spawned, url == str(client.api_url).rstrip("/"), healthy, len(SubprocessASGIServer._instances), url)
"""


def test_the_temporary_server_starts_before_the_flow_imports_and_is_the_one_its_runs_use(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1")
    spawned, same, healthy, servers, url = fresh_interpreter_output(EPHEMERAL_RUN, env=env).splitlines()[-1].split()
    assert spawned == "True", "the server's process had not started when the flow's imports began"
    assert (same, healthy, servers) == ("True", "True", "1"), f"the run's client did not use the started server {url}"
    assert url.startswith("http://127.0.0.1:") and url.endswith("/api")


def test_a_configured_api_is_returned_and_starts_no_server(prefect_server: str) -> None:
    from prefect.server.api.server import SubprocessASGIServer

    from tasks.local_server import start_local_server

    before = dict(SubprocessASGIServer._instances)
    started = start_local_server()
    assert started.done() and started.result() == prefect_server
    assert SubprocessASGIServer._instances == before
