"""Flow tier, real Prefect server and worker: what a submission may carry, and how many runs execute at once
(issue 18, items 2, 3 and 7).

The deployments are registered by `nightscore deploy` with the default settings (no private callbacks, a work
pool limit), then driven through the REST API as a service would.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tasks.encode import limit_exists
from tests import prefect_rest as rest
from tests.flow.test_deployments import CLI, wait_final
from tests.helpers import UNGATED
from tests.in_process import cli_captured
from tests.servers import PREFECT
from tests.tiny_model import tiny_environment


@pytest.fixture(scope="module")
def deployed(prefect_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Register the work pool (limit 1) and deployments with the worker's server; return the API URL and the environment.

    After the module the gpu limit `deploy` created goes: the worker's later modules share this server, and a run they
    kill on purpose would hold its slot, so the run that resumes it would wait for the slot with no end.
    """
    home = tmp_path_factory.mktemp("submission") / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSCORE_")}
    env.update(
        PREFECT_API_URL=prefect_server,
        NIGHTSCORE_HOME=str(home),
        **tiny_environment(),
        **UNGATED,
        NIGHTSCORE_WORK_POOL_CONCURRENCY="1",
        PREFECT_WORKER_QUERY_SECONDS="1",
    )
    done = subprocess.run([CLI, "deploy", "--demo"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    yield {"api": prefect_server, "env": env, "home": home}
    removed = rest.delete(f"{prefect_server}/v2/concurrency_limits/gpu", timeout=10)
    assert removed.status_code in (200, 204), removed.text
    limit_exists.cache_clear()  # this process may have asked while the limit was there


@pytest.fixture(scope="module")
def worker(deployed: dict[str, Any]) -> Iterator[None]:
    """Run a process worker of the pool while the module's tests need one."""
    log = open(deployed["home"].parent / "worker.log", "w")  # noqa: SIM115 - the worker keeps writing to it
    proc = subprocess.Popen(
        [PREFECT, "worker", "start", "--pool", "nightscore", "--type", "process"],
        env=deployed["env"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)
        log.close()


def cancel(api: str, flow_run_id: str) -> None:
    """Force a flow run to Cancelled (its pool paused: no worker has it)."""
    done = rest.post(
        f"{api}/flow_runs/{flow_run_id}/set_state",
        json={"state": {"type": "CANCELLED", "name": "Cancelled"}, "force": True},
        timeout=10,
    )
    assert done.status_code in (200, 201) and done.json()["status"] == "ACCEPT", done.text


@contextmanager
def paused_pool(api: str, made: list[str]) -> Iterator[None]:
    """Pause the work pool while the block runs (a running worker takes nothing from it), then cancel the flow runs
    named in `made` and resume the pool: the module's later tests find it as they would have."""
    paused = rest.patch(f"{api}/work_pools/nightscore", json={"is_paused": True}, timeout=10)
    assert paused.status_code == 204, paused.text
    try:
        yield
    finally:
        for flow_run_id in made:
            cancel(api, flow_run_id)
        rest.patch(f"{api}/work_pools/nightscore", json={"is_paused": False}, timeout=10)


def create(api: str, name: str, parameters: dict[str, Any], **extra: Any) -> httpx.Response:
    """POST create_flow_run to a deployment by name; return the response."""
    found = rest.get(f"{api}/deployments/name/{name}/{name}", timeout=10)
    assert found.status_code == 200, f"deployment {name}: {found.status_code} {found.text[:500]}"
    deployment = found.json()
    return rest.post(
        f"{api}/deployments/{deployment['id']}/create_flow_run", json={"parameters": parameters, **extra}, timeout=10
    )


REFUSED = [
    ("on-demand", {"items_uri": "/data/items.parquet", "interactions_uri": "/data/interactions.parquet"}),  # not wrapped
    ("nightly", {"params": {}, "colour": "blue"}),
    ("nightly", {"params": {"run_date": "20261130"}}),
    ("nightly", {"params": {"run_date": "2026-11-31x"}}),
    ("nightly", {"params": {"run_date": "9999-12-31"}}),
    ("nightly", {"params": {"callback_url": "file:///etc/passwd"}}),
    ("nightly", {"params": {"callback_url": "http://169.254.169.254/latest/meta-data/"}}),
    ("on-demand", {"params": {"callback_url": "http://127.0.0.1:8080/done"}}),
    ("on-demand", {"params": {"callback_url": "http://[::1]/done"}}),
    ("on-demand", {"params": {"callback_url": "http://2130706433/done"}}),
    ("on-demand", {"params": {"item_ids": []}}),
    ("on-demand", {"params": {"item_ids": ["7", "  "]}}),
    ("backfill", {"params": {"start_date": "2026-11-01", "end_date": "2026-11-02", "colour": "blue"}}),
]


@pytest.mark.parametrize("name, parameters", REFUSED)
def test_the_server_refuses_bad_parameters_at_submission(deployed: dict[str, Any], name: str, parameters: dict[str, Any]) -> None:
    refused = create(deployed["api"], name, parameters)
    assert refused.status_code in (409, 422), refused.text


def test_the_server_accepts_good_parameters(deployed: dict[str, Any]) -> None:
    api = deployed["api"]
    cases: list[tuple[str, dict[str, Any]]] = [
        ("nightly", {}),
        ("nightly", {"params": {"run_date": "2026-11-30"}}),
        ("on-demand", {"params": {"callback_url": "https://hooks.example.com/scoring-done", "item_ids": ["7"]}}),
    ]
    for name, parameters in cases:
        created = create(api, name, parameters)
        assert created.status_code == 201, created.text
        rest.delete(f"{api}/flow_runs/{created.json()['id']}", timeout=10)  # no worker must run them
    pool = rest.get(f"{api}/work_pools/nightscore", timeout=10).json()
    assert pool["concurrency_limit"] == 1


class Recorder:
    """A loopback HTTP server that records what is POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/done"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_run_that_bypasses_the_schema_fails_cleanly_and_never_calls_an_internal_address(
    deployed: dict[str, Any], worker: None
) -> None:
    api, recorder = deployed["api"], Recorder()
    bypass = {"enforce_parameter_schema": False}  # what a client that switches enforcement off can still send
    runs = [
        create(api, "on-demand", {"params": {"item_ids": []}}, **bypass),
        create(api, "on-demand", {"params": {"callback_url": recorder.url}}, **bypass),
    ]
    for created in runs:
        assert created.status_code == 201, created.text
        final = wait_final(api, created.json()["id"])
        assert final["state_type"] == "FAILED", final["state"]
        assert "Validation of flow parameters failed" in final["state"]["message"]
    assert recorder.bodies == []  # the worker refused the loopback callback


def test_the_work_pool_runs_one_flow_run_at_a_time_and_queues_the_rest(deployed: dict[str, Any], worker: None) -> None:
    api = deployed["api"]
    # two runs created at once: the second must wait for the first (each fails fast: nothing is published)
    created = [create(api, "train-ranker", {}) for _ in range(2)]
    assert all(c.status_code == 201 for c in created), [c.text[:300] for c in created]
    ids = [c.json()["id"] for c in created]
    intervals = []
    for flow_run_id in ids:
        final = wait_final(api, flow_run_id)
        assert final["state_type"] in ("FAILED", "COMPLETED"), final["state"]
        states = rest.get(f"{api}/flow_run_states/", params={"flow_run_id": flow_run_id}, timeout=10).json()
        at = {s["type"]: datetime.fromisoformat(s["timestamp"].replace("Z", "+00:00")) for s in states}
        intervals.append((min(at.get("PENDING", at["RUNNING"]), at["RUNNING"]), at[final["state_type"]]))
    intervals.sort()
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert start >= end, f"two flow runs executed at once: {intervals}"  # each waited in the queue


def nightscore(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the CLI; return the finished process."""
    return subprocess.run([CLI, *args], env=env, capture_output=True, text=True, timeout=300)


def test_cli_failures_are_one_line_with_the_right_exit_code(deployed: dict[str, Any]) -> None:
    env = deployed["env"]
    unknown = nightscore("status", "8f2c0000-0000-4000-8000-000000000000", env=env)
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1 and "no flow run 8f2c0000" in unknown.stderr
    down = {**env, "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    for args in (("status", "8f2c0000-0000-4000-8000-000000000000"), ("trigger", "on-demand")):
        done = nightscore(*args, env=down)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert "the Prefect API at http://127.0.0.1:9/api does not answer" in done.stderr
    far = nightscore("run", "nightly", "--run-date", "9999-12-31", env=env)
    assert far.returncode == 2 and far.stderr.count("\n") == 1 and "9999-12-31" in far.stderr, far.stderr
    for bad in ("--callback-url=http://169.254.169.254/", "--callback-url=file:///etc/passwd"):
        refused = nightscore("trigger", "on-demand", bad, env=env)
        assert refused.returncode == 2 and refused.stderr.startswith("nightscore: error: invalid parameters: callback_url")


def test_cli_trigger_says_when_it_returns_an_existing_run_and_new_files_make_a_new_one(
    deployed: dict[str, Any], tmp_path: Path
) -> None:
    env = deployed["env"]  # the worker's own server: the triggers run in this process (cli_captured), 5 s of imports less each
    items, interactions = tmp_path / "items.parquet", tmp_path / "interactions.parquet"
    items.write_bytes(b"PAR1 not read by the trigger")
    interactions.write_bytes(b"PAR1 not read either")
    args = ("trigger", "on-demand", "--items", str(items), "--interactions", str(interactions), "--run-date", "2026-11-30")
    made: list[str] = []
    with paused_pool(deployed["api"], made):  # no worker takes these runs: a cancelled one stays cancelled
        first = cli_captured(list(args), env)
        assert first.returncode == 0 and "existing" not in first.stderr, first.stderr
        made.append(first.stdout.split()[0])
        again = cli_captured(list(args), env)
        assert again.stdout.split()[0] == first.stdout.split()[0]
        assert f"returned the existing flow run {first.stdout.split()[0]}" in again.stderr
        cancel(deployed["api"], first.stdout.split()[0])
        retried = cli_captured(list(args), env)  # the same request after its run was cancelled: a new run, and it says so
        assert retried.returncode == 0 and retried.stdout.split()[0] != first.stdout.split()[0], retried.stderr
        made.append(retried.stdout.split()[0])
        assert f"run {first.stdout.split()[0]} ended Cancelled: started a new one" in retried.stderr
        assert cli_captured(list(args), env).stdout.split()[0] == retried.stdout.split()[0]  # and that one answers retries
        items.write_bytes(b"PAR1 a new export under the same name")
        fresh = cli_captured(list(args), env)
        assert fresh.returncode == 0 and fresh.stdout.split()[0] != first.stdout.split()[0] and "existing" not in fresh.stderr
        made.append(fresh.stdout.split()[0])
    schema = nightscore("trigger", "on-demand", "--callback-url", "http://localhost./x", env=env)
    assert schema.returncode == 2 and schema.stderr.count("\n") == 1 and "callback_url" in schema.stderr, schema.stderr
    assert "^" not in schema.stderr and len(schema.stderr) < 300  # one line a person reads, never the schema's regex
