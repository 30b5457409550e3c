"""Fixtures of the storage tier: an empty warehouse on each backend (DuckDB file, PostgreSQL schema on loopback)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from storage.resources import open_warehouse
from storage.warehouse.base import Warehouse

DIM = 384
PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass(frozen=True)
class Backend:
    """Where one test's warehouse lives."""

    name: str
    location: str

    def open(self) -> Warehouse:
        """Return a fresh adapter on this warehouse."""
        return open_warehouse(self.location, embedding_dim=DIM)


@pytest.fixture(scope="session")
def pg_server() -> str:
    """Return the PostgreSQL URL, or skip when the server is unreachable."""
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL server at {PG_URL}: {' '.join(str(exc).split())[:120]}")
    return PG_URL


@pytest.fixture
def pg_schema(pg_server: str) -> Iterator[str]:
    """Yield a warehouse URL on a new empty schema; the schema is dropped after the test."""
    schema = f"nstest_{uuid.uuid4().hex}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield f"{pg_server}?options=-csearch_path%3D{schema}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["duckdb", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Return an empty warehouse on each backend."""
    if request.param == "duckdb":
        return Backend("duckdb", str(tmp_path / "nested" / "w.duckdb"))
    return Backend("postgres", request.getfixturevalue("pg_schema"))


@pytest.fixture
def wh(backend: Backend) -> Warehouse:
    """Return an adapter on an empty warehouse."""
    return backend.open()
