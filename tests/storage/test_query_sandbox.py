"""Storage tier: analysts' SQL (`nightscore query`) runs sandboxed on DuckDB and as a checked read-only role on PostgreSQL.

Every attack below worked before the sandbox (issue 18, item 1): it wrote or read files of the host, tried to
download an extension, or ran several statements in one call.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import psycopg
import pytest

from core.errors import QueryRefused, UsageError
from storage.resources import open_warehouse
from storage.warehouse.base import Warehouse
from storage.warehouse.duckdb_warehouse import DuckDBWarehouse
from tests.storage.conftest import DIM
from tests.storage.test_warehouse import publish

SECRET = "the host's secret"


@pytest.fixture
def duck(tmp_path: Path) -> DuckDBWarehouse:
    """Return a DuckDB warehouse with one published run, and a file beside it that must stay unreadable."""
    path = tmp_path / "w.duckdb"
    publish(DuckDBWarehouse(str(path), embedding_dim=DIM), "r1", date(2026, 11, 30), n=4)
    (tmp_path / "secret.csv").write_text(f"a\n{SECRET}\n")
    return DuckDBWarehouse(str(path))


def attacks(folder: Path) -> list[str]:
    """Return statements that read or write the host's files, load code, or smuggle a second statement."""
    secret, out = folder / "secret.csv", folder / "out"
    return [
        f"COPY item_scores TO '{out}.csv'",
        f"COPY (SELECT * FROM item_scores) TO '{out}.parquet' (FORMAT parquet)",
        f"EXPORT DATABASE '{out}'",
        f"SELECT * FROM read_csv('{secret}')",
        f"SELECT * FROM read_text('{secret}')",
        f"SELECT * FROM read_blob('{secret}')",
        f"SELECT * FROM glob('{folder}/*')",
        f"SELECT * FROM '{secret}'",
        f"SELECT * FROM read_parquet('{folder}/*.parquet')",
        f"ATTACH '{out}.db' AS other",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "PRAGMA database_list",
        "CALL pragma_version()",
        "SELECT 1; DELETE FROM item_scores",
        "DELETE FROM item_scores",
        "CREATE TABLE x AS SELECT 1",
        f"SELECT * FROM query('SELECT * FROM read_csv(''{secret}'')')",
    ]


def test_duckdb_refuses_every_attack_with_one_line_and_touches_nothing(duck: DuckDBWarehouse, tmp_path: Path) -> None:
    for sql in attacks(tmp_path):
        with pytest.raises(QueryRefused) as refused:
            duck.analyst_query(sql)
        message = str(refused.value)
        assert "\n" not in message and message.startswith(("query refused", "query failed")), (sql, message)
        assert SECRET not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.csv", "w.duckdb"]  # nothing written beside it
    assert duck.analyst_query("SELECT count(*) FROM item_scores").rows == [(4,)]


def test_duckdb_accepts_one_select_over_its_own_tables_views_and_table_functions(duck: DuckDBWarehouse) -> None:
    assert duck.analyst_query("select run_id, rows_in from latest_run").rows == [("r1", 4)]
    assert duck.analyst_query(
        "WITH t AS (SELECT topic, count(*) AS n FROM latest_item_scores GROUP BY topic) SELECT sum(n) FROM t"
    ).rows == [(4,)]
    assert duck.analyst_query("SELECT count(*) FROM range(3) r JOIN item_scores s ON true").rows == [(12,)]
    assert duck.analyst_query("SELECT count(*) FROM information_schema.tables WHERE table_name = 'quarantine'").rows == [(1,)]
    assert duck.analyst_query("FROM scoring_runs SELECT status").rows == [("published",)]


def test_duckdb_sql_error_is_a_refusal_and_the_internal_path_stays_open(duck: DuckDBWarehouse) -> None:
    with pytest.raises(QueryRefused, match="no_such_table is not a warehouse table or view"):
        duck.analyst_query("select * from no_such_table")
    with pytest.raises(QueryRefused, match="query failed"):
        duck.analyst_query("selec 1")
    latest = duck.latest_published()  # nightscore's own reads keep their unsandboxed, parameterised path
    assert latest is not None and latest.run_id == "r1"
    assert duck.query("SELECT count(*) FROM item_scores WHERE run_id = ?", ["r1"]).rows == [(4,)]


# --- PostgreSQL -------------------------------------------------------------------------------


def role_url(schema_url: str, role: str) -> str:
    """Return the schema's warehouse URL for another login role (trust auth on the test server)."""
    return schema_url.replace("postgres@", f"{role}@", 1)


@pytest.fixture
def pg_roles(pg_schema: str) -> Iterator[dict[str, str]]:
    """Yield warehouse URLs of a read-only analyst role, a writer role and a server-file role on the schema."""
    publish(open_warehouse(pg_schema, embedding_dim=DIM), "r1", date(2026, 11, 30), n=4)
    schema = pg_schema.rsplit("%3D", 1)[1]
    tag = uuid.uuid4().hex[:8]
    roles = {"reader": f"ns_reader_{tag}", "writer": f"ns_writer_{tag}", "files": f"ns_files_{tag}"}
    with psycopg.connect(pg_schema, autocommit=True) as admin:
        for role in roles.values():
            admin.execute(f"CREATE ROLE {role} LOGIN")
            admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
            admin.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}")
        admin.execute(f"GRANT INSERT, DELETE ON ALL TABLES IN SCHEMA {schema} TO {roles['writer']}")
        admin.execute(f"GRANT pg_read_server_files TO {roles['files']}")
    try:
        yield {name: role_url(pg_schema, role) for name, role in roles.items()}
    finally:
        with psycopg.connect(pg_schema, autocommit=True) as admin:
            for role in roles.values():
                admin.execute(f"DROP OWNED BY {role}")
                admin.execute(f"DROP ROLE {role}")


def test_postgres_refuses_a_superuser_and_a_server_file_role(pg_schema: str, pg_roles: dict[str, str]) -> None:
    with pytest.raises(UsageError, match="refusing analysts' SQL as a superuser"):
        open_warehouse(pg_schema).analyst_query("select pg_read_file('/etc/hostname')")
    with pytest.raises(UsageError, match="member of pg_read_server_files"):
        open_warehouse(pg_roles["files"]).analyst_query("select 1")
    assert open_warehouse(pg_schema).query("select count(*) from item_scores").rows == [(4,)]  # internal path unchanged


def test_postgres_read_only_role_reads_and_cannot_reach_files_or_write(pg_roles: dict[str, str]) -> None:
    reader: Warehouse = open_warehouse(pg_roles["reader"])
    assert reader.analyst_query("select run_id, rows_in from latest_run").rows == [("r1", 4)]
    for sql in (
        "select pg_read_file('/etc/hostname')",
        "select * from pg_ls_dir('.')",
        "select lo_import('/etc/hostname')",
        "copy item_scores to '/tmp/nightscore-out.csv'",
        "delete from item_scores",
        "with gone as (delete from item_scores returning 1) select count(*) from gone",
        "select 1; delete from item_scores",
        "set transaction read write",
    ):
        with pytest.raises(QueryRefused) as refused:
            reader.analyst_query(sql)
        assert "\n" not in str(refused.value), sql
    assert reader.analyst_query("select count(*) from item_scores").rows == [(4,)]
    assert not Path("/tmp/nightscore-out.csv").exists()


def test_postgres_writer_role_is_warned_about_and_still_read_only(
    pg_roles: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    writer = open_warehouse(pg_roles["writer"])
    with caplog.at_level(logging.WARNING, logger="storage.warehouse.postgres_warehouse"):
        assert writer.analyst_query("select count(*) from item_scores").rows == [(4,)]
    assert any("can write" in r.getMessage() and "item_scores" in r.getMessage() for r in caplog.records)
    with pytest.raises(QueryRefused, match="read-only"):
        writer.analyst_query("with gone as (delete from item_scores returning 1) select count(*) from gone")
