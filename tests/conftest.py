"""Shared test fixtures: isolated NIGHTSCORE_HOME per test, one Prefect test server and one engine cache per session."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from tests.helpers import CLI_CALIBRATION, OPENVINO_CALIBRATION
from tests.tiny_model import FOLDER, NAME, write_tiny_model


def pytest_configure(config: pytest.Config) -> None:
    """Make every test process offline, quiet and independent of the developer's Prefect profile."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_UI_ENABLED", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")


# Tiers in the order the workers should take them (make test runs xdist with --dist loadfile --no-loadscope-reorder):
# the few long modules (servers, subprocess runs, the real model) first, the many short ones last to fill the tail.
# xdist's own order (most tests first) started the longest modules last, and one worker ran them alone.
TIER_ORDER = ("flow", "model", "cli", "service", "storage", "contract", "unit")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the collected tests tier by tier (TIER_ORDER), keeping each module's own order."""

    def tier(item: pytest.Item) -> int:
        parts = item.path.relative_to(Path(__file__).parent).parts
        return TIER_ORDER.index(parts[0]) if len(parts) > 1 and parts[0] in TIER_ORDER else len(TIER_ORDER)

    items.sort(key=tier)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Return a fresh NIGHTSCORE_HOME for this test (exported, so flow tasks see it)."""
    path = tmp_path / "home"
    monkeypatch.setenv("NIGHTSCORE_HOME", str(path))
    monkeypatch.setenv("NIGHTSCORE_ENGINE_CACHE_DIR", str(tmp_path / "engine"))  # never the user's shared cache
    for name in ("NIGHTSCORE_LAKE_URL", "NIGHTSCORE_WAREHOUSE_URL", "NIGHTSCORE_CACHE_URL"):
        monkeypatch.delenv(name, raising=False)
    return path


@pytest.fixture(scope="session", autouse=True)
def tiny_model(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """Return the folder of the session's tiny random encoder (tests/tiny_model.py), written once for all workers."""
    folder = write_tiny_model(_session_root(tmp_path_factory, worker_id) / NAME)
    FOLDER[:] = [folder]
    return folder


def _harness_services_off() -> dict[Any, bool]:
    """Return the settings that turn off the test server's event consumers (its subprocess reads them at its start).

    They turn the clients' events into task-run rows and the events feed (and match automations), which no code of ours
    and no test reads: flow runs, their states, artifacts and deployments go through the API and stay. They were the
    largest part of the server's CPU, which the flow tier's runs share with the two workers on a 2-core host. The
    servers that stand for production (`nightscore up`, `make demo`'s, tests/servers.py's) keep Prefect's defaults.
    """
    from prefect import settings

    return {
        settings.PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED: False,
        settings.PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED: False,
        settings.PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED: False,
    }


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """Run this worker's flows against one temporary Prefect server (SQLite in a temp dir); return its API URL, which
    the flow tier's `nightscore` subprocesses are given too (a server per module cost ~6 s to start, and CPU while idle)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    # No flow-run heartbeats in this process: a flow's end joins the heartbeat thread, which sleeps in whole seconds,
    # and every in-process run measured 3.09 s with them against 2.4-3.1 s without. Nothing here tests crash detection;
    # the `nightscore` subprocesses, the workers' runs and `make demo` keep Prefect's default.
    with (
        temporary_settings(_harness_services_off()),
        prefect_test_harness(server_startup_timeout=120),
        temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
    ):
        yield str(PREFECT_API_URL.value())


@dataclass(frozen=True)
class SharedInt8:
    """An engine cache that holds MiniLM's searched OpenVINO int8 model, and what the search cost."""

    cache_dir: Path
    search_seconds: float


def _session_root(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """Return the folder of this test session common to its xdist workers."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


def _calibrated(root: Path, name: str, fields: dict[str, object]) -> Path:
    """Return the engine cache `name` under root after MiniLM's `auto` calibrated there once with these encoder
    settings (one worker measures, under a file lock: two at once doubled the time and memory)."""
    cache, marker = root / name, root / f"{name}-calibrated.json"
    with FileLock(str(root / f"{name}.lock")):
        if not marker.exists():
            from core.settings import EncoderSettings, Settings
            from models.encoder.loader import load_encoder
            from models.encoder.spec import EncoderSpec

            encoder_settings = EncoderSettings(engine_cache_dir=cache, **fields)
            encoder = load_encoder(EncoderSpec.from_settings(Settings(encoder=encoder_settings)))
            marker.write_text(json.dumps({"mode": encoder.mode.label}))
    return cache


@pytest.fixture(scope="session")
def calibrated_engine_cache(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """Return the session's engine cache with `auto` calibrated once under CLI_CALIBRATION (what a CLI run given
    those settings reads): the torch backend's precisions at one budget, seconds where the whole machine's
    calibration takes minutes (tests/unit/test_calibration_policy.py and tests/model/ test the rest of auto)."""
    return _calibrated(_session_root(tmp_path_factory, worker_id), "engine-cache-torch", CLI_CALIBRATION)


@pytest.fixture(scope="session")
def minilm_int8(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> SharedInt8:
    """Return the engine cache with MiniLM's static int8 as auto searched it on the OpenVINO backend, and what the
    search cost (auto narrowed to OpenVINO at one budget: int8 is searched only where it can beat float).

    Where auto refused OpenVINO int8 on this machine (all-int8 no faster than float: no VNNI), skip with its note.
    """
    cache = _calibrated(_session_root(tmp_path_factory, worker_id), "engine-cache-openvino", OPENVINO_CALIBRATION)
    reports = sorted(cache.glob("converted/*/openvino-*-int8-floor0.99/quantization.json"))
    if not reports:
        pytest.skip(f"auto did not keep OpenVINO int8 here: {_calibration_note(cache, 'openvino/int8')}")
    return SharedInt8(cache, float(json.loads(reports[0].read_text())["seconds"]))


def _calibration_note(cache: Path, mode: str) -> str:
    """Return the persisted calibration's note on a mode (why it was skipped or dropped)."""
    for stored in cache.glob("calibration/*/*.json"):
        for row in json.loads(stored.read_text())["table"]:
            if row["mode"].startswith(f"{mode}@"):
                return str(row["note"])
    return f"no {mode} row in the calibration"
