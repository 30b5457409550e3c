"""Storage tier: analysts' SQL (`nightscore query`) runs sandboxed on DuckDB and as a checked read-only role on PostgreSQL.

Every attack below worked before the sandbox (issue 18, item 1): it wrote or read files of the host, tried to
download an extension, or ran several statements in one call.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import cast

import psycopg
import pytest

from core.errors import QueryRefused, QueryTimeout, UsageError
from storage.resources import open_warehouse
from storage.warehouse.base import Warehouse
from storage.warehouse.duckdb_warehouse import DuckDBWarehouse
from storage.warehouse.postgres_warehouse import PostgresWarehouse
from storage.warehouse.schema import ddl_version
from tests.storage.conftest import DIM
from tests.storage.test_warehouse import hold_write_lock, publish

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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.csv", "w.duckdb", "w.duckdb.snapshot"]  # nothing else
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


# --- analysts never block a publication; timeouts, row caps, statements (issue 34) --------------

SLOW_DUCKDB = "SELECT count(*) FROM range(100000000000) t(i) WHERE i % 7 = 3"
ANALYST = """
import sys
from storage.warehouse.duckdb_warehouse import DuckDBWarehouse
print("querying", flush=True)
DuckDBWarehouse(sys.argv[1]).analyst_query(sys.argv[2])
"""


def test_duckdb_analyst_query_held_open_never_blocks_a_publication(duck: DuckDBWarehouse) -> None:
    analyst = subprocess.Popen([sys.executable, "-c", ANALYST, duck.path, SLOW_DUCKDB], stdout=subprocess.PIPE, text=True)
    try:
        assert analyst.stdout is not None and analyst.stdout.readline().strip() == "querying"
        time.sleep(1.5)  # the analyst's statement is running now
        started = time.monotonic()
        publish(DuckDBWarehouse(duck.path, embedding_dim=DIM, lock_timeout_s=5), "r2", date(2026, 12, 1), n=6)
        took = time.monotonic() - started
        assert analyst.poll() is None, "the analyst's query ended before the publication: nothing was held open"
    finally:
        analyst.kill()
        analyst.wait()
    assert took < 5
    assert duck.analyst_query("select run_id, rows_in from latest_run").rows == [("r2", 6)]  # the next query sees it


def test_duckdb_analysts_read_the_last_snapshot_while_a_writer_holds_the_file(duck: DuckDBWarehouse) -> None:
    assert duck.analyst_query("select run_id from latest_run").rows == [("r1",)]
    holder = hold_write_lock(Path(duck.path), 30)
    try:
        started = time.monotonic()
        patient = DuckDBWarehouse(duck.path, lock_timeout_s=20)
        assert patient.analyst_query("select count(*) from item_scores").rows == [(4,)]
        assert time.monotonic() - started < 3  # the snapshot answers; nobody waits for the writer
    finally:
        holder.kill()
        holder.wait()


def test_duckdb_snapshot_costs_one_copy_per_change(duck: DuckDBWarehouse) -> None:
    snapshot = Path(f"{duck.path}.snapshot")
    duck.analyst_query("select 1")
    made = snapshot.stat().st_ino
    duck.analyst_query("select 2")
    assert snapshot.stat().st_ino == made  # the warehouse did not change: no copy
    publish(DuckDBWarehouse(duck.path, embedding_dim=DIM), "r2", date(2026, 12, 1), n=6)
    assert duck.analyst_query("select run_id from latest_run").rows == [("r2",)]
    assert snapshot.stat().st_ino != made  # replaced (atomically: a new file renamed over the old one)


def test_duckdb_long_query_stops_at_its_timeout(duck: DuckDBWarehouse) -> None:
    started = time.monotonic()
    with pytest.raises(QueryTimeout, match=r"stopped after 1 s"):
        duck.analyst_query(SLOW_DUCKDB, timeout_s=1)
    assert time.monotonic() - started < 5
    assert duck.analyst_query("select count(*) from item_scores", timeout_s=1).rows == [(4,)]


def test_duckdb_rows_are_streamed_not_fetched_whole(duck: DuckDBWarehouse) -> None:
    started = time.monotonic()
    with duck.analyst_rows("SELECT i FROM range(1000000000) t(i)", limit=0, timeout_s=30) as stream:
        first = next(iter(stream))
    assert stream.columns == ["i"] and 0 < len(first) <= 10_000 and first[0] == (0,)
    assert time.monotonic() - started < 10  # a billion rows fetched whole would take minutes and gigabytes


@pytest.fixture(params=["duckdb", "postgres"])
def analyst(request: pytest.FixtureRequest) -> Warehouse:
    """Return a warehouse with one published run, as analysts reach it on each backend."""
    if request.param == "duckdb":
        return cast(Warehouse, request.getfixturevalue("duck"))
    return open_warehouse(request.getfixturevalue("pg_roles")["reader"])


def test_the_row_cap_cuts_a_result_and_says_so(analyst: Warehouse) -> None:
    sql = "SELECT i FROM generate_series(1, 25) t(i) ORDER BY i"
    cut = analyst.analyst_query(sql, limit=10)
    assert [row[0] for row in cut.rows] == list(range(1, 11)) and cut.truncated
    exact = analyst.analyst_query(sql, limit=25)
    assert len(exact.rows) == 25 and not exact.truncated
    whole = analyst.analyst_query(sql, limit=0)
    assert len(whole.rows) == 25 and not whole.truncated


def test_explain_of_a_select_is_allowed(analyst: Warehouse) -> None:
    plan = analyst.analyst_query("EXPLAIN SELECT count(*) FROM latest_item_scores")
    assert plan.rows and "\n" not in plan.columns[0]
    assert analyst.analyst_query("select count(*) from item_scores").rows == [(4,)]


def test_duckdb_refusals_name_the_statement_and_never_suggest_a_refused_set(duck: DuckDBWarehouse) -> None:
    with pytest.raises(QueryRefused, match="got INSTALL"):
        duck.analyst_query("INSTALL httpfs")
    with pytest.raises(QueryRefused, match="got EXPLAIN DELETE"):
        duck.analyst_query("EXPLAIN DELETE FROM item_scores")
    with pytest.raises(QueryRefused, match="expression depth") as deep:
        duck.analyst_query("SELECT " + "(" * 1100 + "1" + ")" * 1100)
    assert "SET" not in str(deep.value) and "settings are fixed" in str(deep.value)
    assert duck.analyst_query("EXPLAIN ANALYZE SELECT count(*) FROM item_scores").rows


def test_postgres_analysts_cannot_block_a_publication(pg_schema: str, pg_roles: dict[str, str]) -> None:
    """The read-only role takes the old advisory lock, and reads the views, while a new writer publishes."""
    reader, role = open_warehouse(pg_roles["reader"]), _role(pg_roles["reader"])
    holds = [
        "select pg_advisory_xact_lock(hashtext('nightscore.warehouse:' || current_schema())), pg_sleep(60)",
        "select count(*) from latest_item_scores, pg_sleep(60)",
    ]
    threads = [threading.Thread(target=_quietly, args=(reader, sql)) for sql in holds]
    for thread in threads:
        thread.start()
    try:
        _wait_for_sleepers(pg_schema, role, 2)
        started = time.monotonic()
        publish(PostgresWarehouse(pg_schema, embedding_dim=DIM, lock_timeout_s=2), "r2", date(2026, 12, 1), n=6)
        assert time.monotonic() - started < 10
        assert _wait_for_sleepers(pg_schema, role, 2) == 2, "the analysts' queries ended before the publication"
    finally:
        with psycopg.connect(pg_schema, autocommit=True) as admin:
            admin.execute("select pg_cancel_backend(pid) from pg_stat_activity where usename = %s", [role])
        for thread in threads:
            thread.join(timeout=30)
    assert reader.analyst_query("select run_id, rows_in from latest_run").rows == [("r2", 6)]


def test_postgres_long_query_stops_at_its_timeout_and_the_session_is_bounded(pg_roles: dict[str, str]) -> None:
    reader = open_warehouse(pg_roles["reader"])
    started = time.monotonic()
    with pytest.raises(QueryTimeout, match=r"stopped after 1 s"):
        reader.analyst_query("select pg_sleep(30)", timeout_s=1)
    assert time.monotonic() - started < 5
    settings = "select current_setting('statement_timeout'), current_setting('idle_in_transaction_session_timeout')"
    assert reader.analyst_query(settings, timeout_s=90).rows == [("90s", "90s")]


def test_postgres_sql_is_sent_as_written(pg_roles: dict[str, str]) -> None:
    reader = open_warehouse(pg_roles["reader"])
    assert reader.analyst_query("select '50%' as a, 100 % 7 as b, 'x?' as c").rows == [("50%", 2, "x?")]
    with pytest.raises(QueryRefused, match="read-only"):
        reader.analyst_query("explain analyze delete from item_scores")
    assert reader.analyst_query("select count(*) from item_scores").rows == [(4,)]


def _role(url: str) -> str:
    """Return the login role of a warehouse URL."""
    return url.split("://", 1)[1].split("@", 1)[0]


def _quietly(warehouse: Warehouse, sql: str) -> None:
    """Run an analyst query that the test cancels (its failure is expected)."""
    with contextlib.suppress(QueryRefused):
        warehouse.analyst_query(sql)


def _wait_for_sleepers(admin_url: str, role: str, count: int) -> int:
    """Wait (10 s at most) until exactly count queries of role are sleeping on the server; return how many are."""
    sleeping, deadline = -1, time.monotonic() + 10
    with psycopg.connect(admin_url, autocommit=True) as admin:
        while sleeping != count and time.monotonic() < deadline:
            row = admin.execute(
                "select count(*) from pg_stat_activity where usename = %s and state = 'active' and query like '%%pg_sleep%%'",
                [role],
            ).fetchone()
            sleeping = int(row[0]) if row else 0
            time.sleep(0.1)
    return sleeping


CRASHED_WRITER = """
import os, sys
import duckdb
con = duckdb.connect(sys.argv[1])
con.execute("UPDATE scoring_runs SET message = 'written before the crash'")
os._exit(0)  # no close, no checkpoint: the update is in the write-ahead log only
"""


def test_duckdb_snapshot_keeps_what_a_crashed_writer_committed_to_its_log(duck: DuckDBWarehouse) -> None:
    duck.analyst_query("select 1")  # a snapshot from before the crash
    subprocess.run([sys.executable, "-c", CRASHED_WRITER, duck.path], check=True)
    assert Path(f"{duck.path}.wal").exists()
    assert duck.analyst_query("select message from scoring_runs").rows == [("written before the crash",)]
    assert not Path(f"{duck.path}.snapshot.wal").exists()  # folded into the snapshot, which is one file


def test_postgres_schema_of_an_older_nightscore_gets_the_writer_lock_table(pg_schema: str) -> None:
    publish(open_warehouse(pg_schema, embedding_dim=DIM), "r1", date(2026, 11, 30), n=4)
    with psycopg.connect(pg_schema, autocommit=True) as admin:
        admin.execute("DROP TABLE nightscore_writer_lock")  # as an advisory-lock release left it
        admin.execute("CREATE OR REPLACE VIEW latest_run AS SELECT * FROM scoring_runs WHERE false")  # an old view
    publish(PostgresWarehouse(pg_schema, embedding_dim=DIM, lock_timeout_s=2), "r2", date(2026, 12, 1), n=6)
    with psycopg.connect(pg_schema, autocommit=True) as admin:
        assert admin.execute("select run_id from latest_run").fetchall() == [("r2",)]  # the view was upgraded
        versions = admin.execute("select ddl_version from nightscore_writer_lock").fetchall()
    assert versions == [(ddl_version("postgres"),)]


def test_postgres_ctrl_c_cancels_the_statement_on_the_server(pg_schema: str, pg_roles: dict[str, str], tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSCORE_")}
    env["NIGHTSCORE_QUERY_WAREHOUSE_URL"] = pg_roles["reader"]
    command = [sys.executable, "-c", "import sys; from nightscore.cli import main; sys.exit(main(sys.argv[1:]))"]
    proc = subprocess.Popen(
        [*command, "query", "select pg_sleep(60)", "--home", str(tmp_path / "home")],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _wait_for_sleepers(pg_schema, _role(pg_roles["reader"]), 1) == 1
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err == "nightscore: aborted\n"
    assert _wait_for_sleepers(pg_schema, _role(pg_roles["reader"]), 0) == 0  # gone from the server too
