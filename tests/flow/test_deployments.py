"""Flow tier, real server: `nightscore up` on PostgreSQL, deployments, REST and CLI triggers, artifacts, the UI in Chromium.

One module-scoped stack (Prefect server with its own PostgreSQL database, a process worker, the
deployments) serves every test here; runs use the tiny encoder so each takes well under a minute.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

from tests import prefect_rest as rest
from tests.helpers import UNGATED, demo_inputs
from tests.servers import free_port, prefect_server
from tests.tiny_model import tiny_environment

CLI = str(Path(sys.executable).with_name("nightscore"))
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def prefect_database() -> Iterator[str]:
    """Return the SQLAlchemy URL of a fresh PostgreSQL database for the Prefect server; drop it after."""
    name = f"nightscore_prefect_{uuid.uuid4().hex[:8]}"
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as con:
        con.execute(f"CREATE DATABASE {name}")
    yield f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as con:
        con.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    """Return the environment of a nightscore command: tiny encoder, small shards, its own home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTSCORE_", "PREFECT_API"))}
    # Callbacks go to a recorder on 127.0.0.1: a loopback address the default settings refuse.
    env.update(
        NIGHTSCORE_HOME=str(home),
        **tiny_environment(),
        **UNGATED,
        NIGHTSCORE_SHARD_SIZE="100",
        NIGHTSCORE_TOP_K="20",
        NIGHTSCORE_SCHEDULE_TIMEZONE="Europe/Berlin",
        NIGHTSCORE_CALLBACK_ALLOW_PRIVATE="true",
        **extra,
    )
    return env


def nightscore(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the nightscore CLI; return the finished process (stdout and stderr captured)."""
    return subprocess.run([CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, prefect_database: str) -> Iterator[dict[str, Any]]:
    """Return `nightscore up`'s state (API and UI URLs, home) for a stack on PostgreSQL; `nightscore down` after."""
    home = tmp_path_factory.mktemp("stack")
    env = cli_env(home, PREFECT_API_DATABASE_CONNECTION_URL=prefect_database, NIGHTSCORE_PREFECT_PORT=str(free_port()))
    started = nightscore("up", "--demo", env=env)
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        state = json.loads((home / "up.json").read_text())
        yield {**state, "env": {**env, "PREFECT_API_URL": state["api_url"]}, "home_path": home}
    finally:
        stopped = nightscore("down", env=env, timeout=120)
        assert stopped.returncode == 0, stopped.stderr[-2000:]


# A run killed while it holds a gpu slot: a flow on the stack's server holds a slot of its own limit through the encode
# task's gpu_slot with the settings' lease, and is SIGKILLed. The module's last test checks the slot came back.
SLOT_HOLDER = """
import time
from prefect import flow
from core.settings import load_settings
from tasks.encode import gpu_slot

@flow(name="gpu-lease-check")
def hold() -> None:
    with gpu_slot("gpu-lease-check", load_settings().ops.gpu_slot_lease_s):
        print("held", flush=True)
        time.sleep(3600)

hold()
"""


@pytest.fixture(scope="module", autouse=True)
def killed_slot_holder(stack: dict[str, Any]) -> float:
    """Return when a process holding a slot of the limit `gpu-lease-check` was SIGKILLed (at the module's start, so
    its lease runs out while the module's other tests run)."""
    api = stack["api_url"]
    made = rest.post(f"{api}/v2/concurrency_limits/", json={"name": "gpu-lease-check", "limit": 1}, timeout=10)
    assert made.status_code == 201, made.text
    child = subprocess.Popen([sys.executable, "-c", SLOT_HOLDER], env=stack["env"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    stuck = threading.Timer(180, child.kill)  # a holder that never gets its slot ends, and the fixture fails, not hangs
    stuck.start()
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    stuck.cancel()
    child.kill()
    child.wait(timeout=30)
    return time.monotonic()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a folder with demo inputs: 300 items, 60 users."""
    return demo_inputs(tmp_path_factory.mktemp("inputs"), seed=4)


class Callbacks:
    """A loopback HTTP server that records the JSON bodies POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/done"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def deployment(api: str, name: str) -> dict[str, Any]:
    """Return a deployment read by name through the REST API."""
    response = rest.get(f"{api}/deployments/name/{name}/{name}", timeout=10)
    response.raise_for_status()
    return response.json()


def wait_final(api: str, flow_run_id: str) -> dict[str, Any]:
    """Poll a flow run until it is final; return it."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        run = rest.get(f"{api}/flow_runs/{flow_run_id}", timeout=10).json()
        if run["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return run
        time.sleep(0.5)
    pytest.fail(f"flow run {flow_run_id} not final after {RUN_TIMEOUT_S}s")


def seconds_to_running(api: str, flow_run_id: str) -> float:
    """Return the seconds from a flow run's first state (Scheduled) to Running, from its state history."""
    states = rest.get(f"{api}/flow_run_states/", params={"flow_run_id": flow_run_id}, timeout=10).json()
    at = {s["type"]: datetime.fromisoformat(s["timestamp"].replace("Z", "+00:00")) for s in reversed(states)}
    return (at["RUNNING"] - min(at.values())).total_seconds()


@contextmanager
def holding_gpu_slot(api: str) -> Iterator[None]:
    """Hold the stack's one gpu concurrency slot through the REST API (as a competing run would) while the block runs."""
    taken = rest.post(
        f"{api}/v2/concurrency_limits/increment-with-lease",
        json={"names": ["gpu"], "slots": 1, "mode": "concurrency", "lease_duration": 600},
        timeout=10,
    )
    assert taken.status_code == 200, taken.text
    try:
        yield
    finally:
        rest.post(f"{api}/v2/concurrency_limits/decrement-with-lease", json={"lease_id": taken.json()["lease_id"]}, timeout=10)


def run_logs(api: str, flow_run_id: str) -> list[tuple[datetime, str]]:
    """Return (timestamp, message) of a flow run's logs from the API."""
    body = {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200}
    return [
        (datetime.fromisoformat(log["timestamp"].replace("Z", "+00:00")), log["message"])
        for log in rest.post(f"{api}/logs/filter", json=body, timeout=10).json()
    ]


def wait_for_log(api: str, flow_run_id: str, text: str, timeout_s: float = 180) -> None:
    """Wait until a flow run has logged a message containing text."""
    deadline = time.monotonic() + timeout_s
    while not any(text in message for _, message in run_logs(api, flow_run_id)):
        if time.monotonic() > deadline:
            pytest.fail(f"flow run {flow_run_id} never logged {text!r}")
        time.sleep(0.5)


def warehouse_rows(home: Path, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """Return rows of a read-only query on the stack's DuckDB warehouse."""
    with duckdb.connect(str(home / "warehouse.duckdb"), read_only=True) as con:
        return con.execute(sql, params).fetchall()


def test_up_registers_deployments_queues_schedule_and_gpu_limit(stack: dict[str, Any]) -> None:
    api = stack["api_url"]
    nightly = deployment(api, "nightly")
    assert [s["schedule"]["cron"] for s in nightly["schedules"]] == ["0 3 * * *"]
    assert nightly["schedules"][0]["schedule"]["timezone"] == "Europe/Berlin"
    assert nightly["work_queue_name"] == "scheduled" and nightly["enforce_parameter_schema"]
    assert deployment(api, "train-ranker")["schedules"][0]["schedule"]["cron"] == "0 5 * * 0"
    assert deployment(api, "on-demand")["schedules"] == [] and deployment(api, "backfill")["schedules"] == []
    schema = deployment(api, "on-demand")["parameter_openapi_schema"]
    fields = schema["definitions"]["OnDemandParams"]["properties"]
    assert set(fields) >= {"items_uri", "interactions_uri", "item_ids", "run_date", "callback_url"}
    assert all(f.get("description") for f in fields.values())
    queues = rest.post(f"{api}/work_pools/nightscore/queues/filter", json={}, timeout=10).json()
    priorities = {q["name"]: q["priority"] for q in queues}
    assert priorities["on-demand"] < priorities["scheduled"]
    gpu = rest.get(f"{api}/v2/concurrency_limits/gpu", timeout=10).json()
    assert gpu["limit"] == 1 and gpu["active"]
    assert rest.get(f"{api}/work_pools/nightscore", timeout=10).json()["concurrency_limit"] == 2  # the default


def test_rest_trigger_runs_to_completion_with_tables_artifacts_and_callback(stack: dict[str, Any], inputs: Path) -> None:
    api, callbacks = stack["api_url"], Callbacks()
    target = deployment(api, "on-demand")["id"]
    body = {
        "parameters": {
            "params": {
                "items_uri": str(inputs / "items.parquet"),
                "interactions_uri": str(inputs / "interactions.parquet"),
                "run_date": "2026-11-30",
                "callback_url": callbacks.url,
            }
        },
        "idempotency_key": "test-rest-1",
    }
    with holding_gpu_slot(api):  # another "run" holds the one gpu slot: this run must wait for it, visibly
        first = rest.post(f"{api}/deployments/{target}/create_flow_run", json=body, timeout=10)
        again = rest.post(f"{api}/deployments/{target}/create_flow_run", json=body, timeout=10)
        assert first.status_code == 201 and again.json()["id"] == first.json()["id"]  # same key: the same run
        wait_for_log(api, first.json()["id"], "waiting for a slot of global concurrency limit 'gpu'")
        time.sleep(2)
        released = datetime.now(UTC)

    run = wait_final(api, first.json()["id"])
    held = [at for at, message in run_logs(api, run["id"]) if message.startswith("holding a slot of 'gpu'")]
    assert held and min(held) >= released  # no shard encoded while the slot was taken
    assert run["state_type"] == "COMPLETED", run["state"]["message"]
    print(f"trigger-to-running latency: {seconds_to_running(api, run['id']):.1f} s")
    rows = warehouse_rows(
        stack["home_path"], "SELECT run_id, status, rows_scored FROM scoring_runs WHERE flow_run_id = ?", [run["id"]]
    )
    assert rows and rows[0][1:] == ("published", 300)
    assert warehouse_rows(stack["home_path"], "SELECT count(*) FROM latest_item_scores WHERE run_id = ?", [rows[0][0]]) == [
        (300,)
    ]

    artifacts = rest.post(
        f"{api}/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run["id"]]}}}, timeout=10
    ).json()
    by_key = {a["key"]: a for a in artifacts}
    assert {"on-demand-summary", "on-demand-stage-timings", "on-demand-encode-progress"} <= set(by_key)
    summary = by_key["on-demand-summary"]["data"]
    assert summary.count("data:image/png;base64,") == 4 and rows[0][0] in summary and "cost per 1k items" in summary
    assert by_key["on-demand-encode-progress"]["data"] == 100
    assert {r["stage"] for r in json.loads(by_key["on-demand-stage-timings"]["data"])} >= {"ingest", "encode", "publish"}

    assert [b["state"] for b in callbacks.bodies] == ["COMPLETED"]
    assert callbacks.bodies[0]["run_id"] == rows[0][0] and callbacks.bodies[0]["counts"]["rows_scored"] == 300


def test_parameter_schema_is_enforced(stack: dict[str, Any]) -> None:
    api = stack["api_url"]
    target = deployment(api, "backfill")["id"]
    refused = rest.post(
        f"{api}/deployments/{target}/create_flow_run",
        json={"parameters": {"params": {"start_date": "2026-11-01", "colour": "blue"}}},
        timeout=10,
    )
    assert refused.status_code in (409, 422), refused.text
    assert "end_date" in refused.text or "colour" in refused.text


@pytest.fixture
def catalogue_published(stack: dict[str, Any], inputs: Path) -> None:
    """Have the stack's whole demo catalogue published: in module order the REST trigger's run did it; a test run
    alone (`-k status`) triggers that run here, so its on-demand run of edited items has the rest to reuse."""
    if (stack["home_path"] / "warehouse.duckdb").exists():
        published = "SELECT count(*) FROM latest_item_scores"
        if warehouse_rows(stack["home_path"], published, [])[0][0] == 300:
            return
    full = ["--items", str(inputs / "items.parquet"), "--interactions", str(inputs / "interactions.parquet")]
    args = ("trigger", "on-demand", *full, "--run-date", "2026-11-30", "--wait")
    done = nightscore(*args, env=stack["env"], timeout=RUN_TIMEOUT_S + 60)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.usefixtures("catalogue_published")
def test_cli_trigger_item_ids_wait_and_status(stack: dict[str, Any], inputs: Path, tmp_path: Path) -> None:
    import polars as pl

    items = pl.read_parquet(inputs / "items.parquet")
    edited = items.head(40).with_columns((pl.col("body") + " Updated today with new details.").alias("body"))
    edited.write_parquet(tmp_path / "edited.parquet")
    ids = edited["item_id"].cast(pl.String).to_list()
    args = [
        "trigger",
        "on-demand",
        "--items",
        str(tmp_path / "edited.parquet"),
        "--interactions",
        str(inputs / "interactions.parquet"),
        "--run-date",
        "2026-11-29",
        *[a for i in ids for a in ("--item-id", i)],
    ]
    done = nightscore(*args, "--wait", env=stack["env"], timeout=RUN_TIMEOUT_S + 60)
    assert done.returncode == 0, done.stderr[-3000:]
    flow_run_id, final = done.stdout.split()[:2]
    assert final == "Completed"
    retried = nightscore(*args, env=stack["env"])  # same parameters, same files: the idempotency key finds the same run
    assert retried.stdout.split()[0] == flow_run_id and f"returned the existing flow run {flow_run_id}" in retried.stderr

    status = nightscore("status", flow_run_id, env=stack["env"])
    assert status.returncode == 0 and "Completed" in status.stdout
    # the whole catalog is published; only the 40 edited items were encoded, the rest reused
    assert "rows_scored: 300" in status.stdout and "rows_computed: 40" in status.stdout, status.stdout
    assert "status: published" in status.stdout
    assert nightscore("status", "not-a-uuid", env=stack["env"]).returncode == 2


def test_ui_deployments_page_shows_nightly(stack: dict[str, Any]) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (scripts/bootstrap.sh installs it when it can)")
    ARTIFACTS.mkdir(exist_ok=True)
    flags = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--window-size=1400,900",
        "--virtual-time-budget=20000",
    ]
    page = f"{stack['ui_url']}/deployments"
    dom = subprocess.run([*flags, "--dump-dom", page], capture_output=True, text=True, timeout=120).stdout
    assert "nightly" in dom and "Can't connect to Server API" not in dom
    shot = ARTIFACTS / "prefect-ui-deployments.png"
    subprocess.run([*flags, f"--screenshot={shot}", page], capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 10_000


def test_basic_auth_server_refuses_anonymous_and_deploys_with_the_auth_string(tmp_path: Path) -> None:
    with prefect_server(tmp_path, auth="ops:s3cret") as api:
        assert rest.post(f"{api}/deployments/filter", json={}, timeout=10).status_code == 401
        env = cli_env(tmp_path / "home", PREFECT_API_URL=api, PREFECT_API_AUTH_STRING="ops:s3cret")
        deployed = nightscore("deploy", "--demo", env=env)
        assert deployed.returncode == 0, deployed.stderr[-2000:]
        assert "nightly:" in deployed.stdout
        refused = nightscore("deploy", "--demo", env={**env, "PREFECT_API_AUTH_STRING": "ops:wrong"})
        assert refused.returncode != 0


def test_a_killed_runs_gpu_slot_comes_back_after_its_lease(stack: dict[str, Any], killed_slot_holder: float) -> None:
    # the lease is 60 s (NIGHTSCORE_GPU_SLOT_LEASE_S) and Prefect's repossessor looks every 15 s; Prefect's default
    # lease of 300 s held a killed run's slot, and so every later run's shards, for 5 minutes
    api, deadline = stack["api_url"], killed_slot_holder + 60 + 15 + 20
    while (held := rest.get(f"{api}/v2/concurrency_limits/gpu-lease-check", timeout=10).json()["active_slots"]) and (
        time.monotonic() < deadline
    ):
        time.sleep(1)
    assert held == 0, f"the killed holder's slot is still held {time.monotonic() - killed_slot_holder:.0f} s on"
