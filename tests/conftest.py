"""Shared test fixtures: isolated NIGHTSCORE_HOME per test, one Prefect test server and one engine cache per session."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock


def pytest_configure(config: pytest.Config) -> None:
    """Make every test process offline, quiet and independent of the developer's Prefect profile."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_UI_ENABLED", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Return a fresh NIGHTSCORE_HOME for this test (exported, so flow tasks see it)."""
    path = tmp_path / "home"
    monkeypatch.setenv("NIGHTSCORE_HOME", str(path))
    for name in ("NIGHTSCORE_LAKE_URL", "NIGHTSCORE_WAREHOUSE_URL", "NIGHTSCORE_CACHE_URL"):
        monkeypatch.delenv(name, raising=False)
    return path


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    """Run this session's flows against one temporary Prefect server (SQLite in a temp dir)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@dataclass(frozen=True)
class SharedInt8:
    """An engine cache that holds MiniLM's searched OpenVINO int8 model, and what the search cost."""

    cache_dir: Path
    search_seconds: float


def _session_root(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """Return the folder of this test session common to its xdist workers."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


@pytest.fixture(scope="session")
def minilm_int8(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> SharedInt8:
    """Return the session's engine cache with MiniLM's static int8 searched once for all workers (about 4 min).

    The search was the slowest step of the suite; two workers running it at once doubled its time and memory.
    """
    root = _session_root(tmp_path_factory, worker_id)
    cache, marker = root / "engine-cache", root / "engine-cache-int8.json"
    with FileLock(str(root / "engine-cache.lock")):
        if not marker.exists():
            from models.encoder import EncoderSpec, load_encoder

            spec = EncoderSpec(kind="minilm", device="cpu", backend="openvino", precision="int8", cache_dir=str(cache))
            marker.write_text(json.dumps({"search_seconds": load_encoder(spec).load_seconds}))
    return SharedInt8(cache, float(json.loads(marker.read_text())["search_seconds"]))


@pytest.fixture(scope="session")
def calibrated_engine_cache(minilm_int8: SharedInt8, tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """Return the session's engine cache with `auto` calibrated once on the default settings (what a CLI run reads)."""
    root = _session_root(tmp_path_factory, worker_id)
    marker = root / "engine-cache-calibrated.json"
    with FileLock(str(root / "engine-cache.lock")):
        if not marker.exists():
            from models.encoder import load_encoder
            from nightscore.settings import Settings
            from tasks.encode import encoder_spec

            encoder = load_encoder(encoder_spec(Settings(engine_cache_dir=minilm_int8.cache_dir)))
            marker.write_text(json.dumps({"mode": encoder.mode.label}))
    return minilm_int8.cache_dir
