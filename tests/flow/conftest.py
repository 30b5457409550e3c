"""Fixtures of the flow tier: a fast in-process configuration, and a real Prefect server per module for the
modules that run the `nightscore` CLI in subprocesses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import servers
from tests.tiny_model import tiny_environment


@pytest.fixture
def tiny(home: Path, monkeypatch: pytest.MonkeyPatch, prefect_server: None) -> Path:
    """Return a home configured for fast flow runs: tiny encoder, shards of 64, K=20."""
    for name, value in tiny_environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NIGHTSCORE_SHARD_SIZE", "64")
    monkeypatch.setenv("NIGHTSCORE_TOP_K", "20")
    return home  # the default candidate gate: a demo log this small has too few held-out users to gate


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Return the URL of a Prefect server started for this module (SQLite in a temp folder)."""
    with servers.prefect_server(tmp_path_factory.mktemp("prefect")) as url:
        yield url
