"""Shared test fixtures: isolated NIGHTSCORE_HOME per test, one Prefect test server per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


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
