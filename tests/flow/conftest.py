"""Fixtures of the flow tier: a fast in-process configuration, and the URL of the worker's Prefect server for the
modules that run the `nightscore` CLI in subprocesses."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny_model import tiny_environment


@pytest.fixture
def tiny(home: Path, monkeypatch: pytest.MonkeyPatch, prefect_server: str) -> Path:
    """Return a home configured for fast flow runs: tiny encoder, shards of 64, K=20."""
    for name, value in tiny_environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NIGHTSCORE_SHARD_SIZE", "64")
    monkeypatch.setenv("NIGHTSCORE_TOP_K", "20")
    return home  # the default candidate gate: a demo log this small has too few held-out users to gate


@pytest.fixture(scope="session")
def prefect_api(prefect_server: str) -> str:
    """Return the URL of this worker's Prefect server, for the modules that run the `nightscore` CLI in subprocesses."""
    return prefect_server
