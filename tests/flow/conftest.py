"""Fixtures of the flow tier: a fast in-process configuration (the modules that run the `nightscore` CLI in
subprocesses give them the worker's Prefect server, `prefect_server` in tests/conftest.py)."""

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
