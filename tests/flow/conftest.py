"""Fixtures of the flow tier: a fast in-process configuration and demo input folders."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def tiny(home: Path, monkeypatch: pytest.MonkeyPatch, prefect_server: None) -> Path:
    """Return a home configured for fast flow runs: tiny encoder, shards of 64, K=20."""
    monkeypatch.setenv("NIGHTSCORE_ENCODER", "tiny")
    monkeypatch.setenv("NIGHTSCORE_SHARD_SIZE", "64")
    monkeypatch.setenv("NIGHTSCORE_TOP_K", "20")
    return home
