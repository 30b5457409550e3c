"""The PostgreSQL warehouse adapter: the DuckDB tables, views and behaviour on a server.

Select a schema with the URL, as libpq does: ``postgresql://user@host/db?options=-csearch_path%3Dmyschema``.
Writes of one schema are serialised by a lock on a table of their own (LOCK_SQL: the server's equivalent of
DuckDB's file lock), so publications, rollbacks and prunes never interleave; readers are never blocked, and
a reader cannot block a writer: a read-only role can neither take that lock nor, once a writer has recorded
the schema's DDL version, hold anything a writer waits for.

Analysts' SQL (`analyst_rows`) runs in a read-only transaction that is always rolled back, as one statement
of the extended protocol (never two) sent as written (no parameters: ``%`` is an operator), under a statement
timeout, and only for a role that is neither a superuser nor a member of the server-file roles (those could
read or write the server's files with ``COPY``, ``pg_read_file`` or ``lo_import``); a role that can write the
warehouse tables is warned about.
"""

from __future__ import annotations

import itertools
import logging
import re
import struct
from collections.abc import Generator, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, cast
from urllib.parse import unquote, urlsplit, urlunsplit

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import errors as pg_errors

from core.errors import NightscoreError, PublishError, QueryRefused, UsageError, WarehouseBusy, WarehouseMissing
from storage.warehouse.analyst import BATCH_ROWS, RowStream, leading_keyword, timed_out
from storage.warehouse.base import QueryResult, present_columns
from storage.warehouse.schema import ddl, ddl_version, kind, object_names, upgrade_ddl
from storage.warehouse.sql import SqlWarehouse

log = logging.getLogger(__name__)

COPY_BATCH_ROWS = 10_000
FLOAT4_OID = 700
# Writers take this table in SHARE ROW EXCLUSIVE mode, which conflicts with itself: one writer per schema at a
# time. A read-only role cannot take that mode (it needs UPDATE, DELETE or TRUNCATE on the table, and a read-only
# transaction refuses it), and a SELECT's ACCESS SHARE does not conflict with it; an advisory lock anyone could take.
WRITER_LOCK_TABLE = "nightscore_writer_lock"
LOCK_SQL = f"LOCK TABLE {WRITER_LOCK_TABLE} IN SHARE ROW EXCLUSIVE MODE"
ARROW_TYPES = {"text": pa.string(), "date": pa.date32(), "int": pa.int32(), "bigint": pa.int64(), "double": pa.float64()}
# Binary COPY sends each field as bytes the server decodes by the column's type; vectors are
# pre-encoded with numpy (float4_arrays) and sent through the bytea dumper, ~5x faster than lists.
COPY_TYPES = {"text": "varchar", "date": "date", "int": "int4", "bigint": "int8", "double": "float8", "vector": "bytea"}
SERVER_FILE_ROLES = ("pg_read_server_files", "pg_write_server_files", "pg_execute_server_program")
# What the connected role could do beyond reading: superuser, server-file roles, write privileges on this schema's tables.
ROLE_SQL = (
    "SELECT r.rolsuper, ARRAY(SELECT g FROM unnest(%s::text[]) AS g WHERE pg_has_role(current_user, g, 'MEMBER')), "
    "ARRAY(SELECT c.relname::text FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace "
    "AND c.relkind = 'r' AND has_table_privilege(c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE') ORDER BY 1) "
    "FROM pg_roles r WHERE r.rolname = current_user"
)
READ_KEYWORDS = ("SELECT", "WITH", "VALUES", "TABLE", "EXPLAIN")  # EXPLAIN ANALYZE of a write fails: read-only
_LITERAL_OR_MARK = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*|/\*.*?\*/|\$(\w*)\$.*?\$\1\$|\?""", re.DOTALL)


class PostgresSession:
    """A write transaction on a psycopg connection."""

    row_lock = " FOR UPDATE"  # appended to reads of rows the transaction must keep others from changing

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Execute one statement with ``?`` placeholders; return its rows (none for plain DML)."""
        cursor = self.conn.execute(pg_sql(sql, bind=True), list(params))
        return cursor.fetchall() if cursor.description else []

    def insert(self, table: str, rows: pa.Table | pa.RecordBatchReader, columns: list[str]) -> None:
        """Append rows with one binary COPY, converting Arrow batches of COPY_BATCH_ROWS (or the stream's) at a time."""
        columns = present_columns(rows, columns)
        kinds = [kind(table, column) for column in columns]
        statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
        with self.conn.cursor() as cursor, cursor.copy(statement) as copy:
            copy.set_types([COPY_TYPES[k] for k in kinds])
            batches = (
                rows.select(columns).to_batches(max_chunksize=COPY_BATCH_ROWS)
                if isinstance(rows, pa.Table)
                else (batch.select(columns) for batch in rows)
            )  # a stream: one batch in memory at a time
            for batch in batches:
                for row in zip(*(copy_values(batch.column(i), k) for i, k in enumerate(kinds)), strict=True):
                    copy.write_row(row)


class PostgresWarehouse(SqlWarehouse):
    """A schema on a PostgreSQL server; one connection per operation, closed after it."""

    def __init__(
        self, url: str, embedding_dim: int | None = None, connect_timeout_s: int = 10, lock_timeout_s: float = 120.0
    ) -> None:
        self.url, self.where = url, redact(url)
        self.embedding_dim = embedding_dim
        self.connect_timeout_s, self.lock_timeout_s = connect_timeout_s, lock_timeout_s
        self._tables_ready = False

    def _connect(self, error: type[NightscoreError]) -> psycopg.Connection[Any]:
        """Open an autocommit connection; failures raise error (or UsageError for a bad URL), password redacted."""
        try:
            return psycopg.connect(self.url, autocommit=True, connect_timeout=self.connect_timeout_s)
        except psycopg.Error as exc:
            # `from None`: a DSN parse error may quote the password; the scrubbed text is kept instead.
            cls = error if isinstance(exc, psycopg.OperationalError) else UsageError
            raise cls(f"cannot connect to warehouse {self.where}: {scrub(exc, self.url)}") from None

    def _lock(self, conn: psycopg.Connection[Any]) -> None:
        """Take this schema's writer lock for the current transaction (creating its table), waiting at most lock_timeout_s."""
        conn.execute(f"SET LOCAL lock_timeout = '{int(self.lock_timeout_s * 1000)}ms'")
        try:
            _create_lock_table(conn)
            conn.execute(LOCK_SQL)
        except pg_errors.LockNotAvailable as exc:
            raise WarehouseBusy(f"warehouse {self.where} is locked by another writer for over {self.lock_timeout_s:g}s") from exc

    def _ensure_tables(self, conn: psycopg.Connection[Any]) -> None:
        """Create the tables, views and indexes in the current schema unless they all exist (or require them).

        A writer upgrades an existing schema (views, internal tables, new columns) only when the DDL version it
        recorded differs: CREATE OR REPLACE VIEW and ALTER TABLE would wait for every reader's query.
        """
        if self._tables_ready:
            return
        with conn.transaction():
            if not _schema_exists(conn):
                raise UsageError(f"warehouse {self.where}: no schema to write to (does the search_path schema exist?)")
            self._lock(conn)
            if _missing_objects(conn):
                if self.embedding_dim is None:
                    raise WarehouseMissing(f"no warehouse tables in {self.where}: run `nightscore run nightly` first")
                _run_ddl(conn, ddl(self.embedding_dim, "postgres"))
            elif self.embedding_dim is not None and _recorded_ddl_version(conn) != ddl_version("postgres"):
                self._upgrade(conn)
            if self.embedding_dim is not None:
                _check_width(conn, self.embedding_dim, self.where)
        self._tables_ready = True

    def _upgrade(self, conn: psycopg.Connection[Any]) -> None:
        """Bring a schema made by an older nightscore up to date (views, internal tables, new columns)."""
        try:
            _run_ddl(conn, upgrade_ddl("postgres"))
        except pg_errors.LockNotAvailable as exc:  # ALTER TABLE and CREATE OR REPLACE VIEW wait for readers' queries
            raise WarehouseBusy(
                f"warehouse {self.where}: its schema upgrade waited over {self.lock_timeout_s:g}s for queries that read "
                "its tables; it runs once, try again"
            ) from exc

    @contextmanager
    def _transaction(self, lock: bool = True) -> Iterator[PostgresSession]:
        with self._connect(PublishError) as conn:
            self._ensure_tables(conn)
            with conn.transaction():
                if lock:
                    self._lock(conn)
                yield PostgresSession(conn)

    def _lease_transaction(self) -> AbstractContextManager[PostgresSession]:
        """Return a transaction without the writers' schema lock: a heartbeat never waits for a long publication.

        Lease rows are serialised by their own row locks; a publication's fence check locks its lease row.
        """
        return self._transaction(lock=False)

    def query(self, sql: str, params: list[Any] | None = None) -> QueryResult:
        """Run one SQL statement in a read-only transaction that is always rolled back."""
        with self._connect(UsageError) as conn, conn.transaction(force_rollback=True):
            conn.execute("SET TRANSACTION READ ONLY")
            # This check also takes the snapshot, after which SET TRANSACTION READ WRITE is refused.
            if _missing_objects(conn):
                raise WarehouseMissing(f"no warehouse tables in {self.where}: run `nightscore run nightly` first")
            # prepare=True: a prepared statement holds exactly one command, so "...; COMMIT; ..." cannot escape.
            cursor = conn.execute(pg_sql(sql, bind=bool(params)), list(params or []), prepare=True)
            columns = [column.name for column in cursor.description or []]
            return QueryResult(columns, cursor.fetchall() if cursor.description else [])

    @contextmanager
    def analyst_rows(self, sql: str, limit: int = 0, timeout_s: float | None = None) -> Iterator[RowStream]:
        """Stream one analyst statement as a checked role in a read-only, rolled-back transaction; QueryRefused otherwise."""
        if leading_keyword(sql) not in READ_KEYWORDS:
            raise QueryRefused(
                "query refused: only a read-only SELECT (or WITH ... SELECT, EXPLAIN) is allowed, "
                f"got {leading_keyword(sql) or 'no statement'}"
            )
        with self._connect(NightscoreError) as conn:
            check_analyst_role(conn, self.where)
            try:
                with conn.transaction(force_rollback=True):
                    self._begin_analyst_read(conn, timeout_s)
                    cursor = conn.cursor()
                    rows = cast(Generator[Any, None, None], cursor.stream(sql, size=_stream_chunk()))  # sent as written
                    try:
                        yield _row_stream(cursor, sql, rows, limit)
                    finally:
                        rows.close()  # a stream left early is cancelled on the server
            except pg_errors.QueryCanceled as exc:
                if timeout_s is not None and "statement timeout" in str(exc):
                    raise timed_out(timeout_s) from None
                raise QueryRefused(f"query failed: {scrub(exc, self.url)}") from None
            except psycopg.Error as exc:
                raise QueryRefused(f"query failed: {scrub(exc, self.url)}") from None

    def _begin_analyst_read(self, conn: psycopg.Connection[Any], timeout_s: float | None) -> None:
        """Make the transaction read-only and bounded (statement and idle timeouts), on an existing warehouse."""
        conn.execute("SET TRANSACTION READ ONLY")
        if timeout_s is not None:
            bound = max(1, round(timeout_s * 1000))
            conn.execute(f"SET LOCAL statement_timeout = {bound}")
            conn.execute(f"SET LOCAL idle_in_transaction_session_timeout = {bound}")
        # This check also takes the snapshot, after which SET TRANSACTION READ WRITE is refused.
        if _missing_objects(conn):
            raise WarehouseMissing(f"no warehouse tables in {self.where}: run `nightscore run nightly` first")


def _stream_chunk() -> int:
    """Return how many rows the server sends at a time: a batch with libpq 17's chunked mode, else one."""
    return BATCH_ROWS if psycopg.pq.version() >= 170000 else 1


def _row_stream(cursor: psycopg.Cursor[Any], sql: str, rows: Iterator[tuple[Any, ...]], limit: int) -> RowStream:
    """Return a stream over rows; the statement runs now, so that its columns are known before any row is read."""
    first = next(rows, None)
    if first is None:  # psycopg keeps no description of a stream without rows: the server describes the statement
        return RowStream(_described_columns(cursor.connection, sql), iter([]), limit)
    columns = [column.name for column in cursor.description or []]
    return RowStream(columns, _in_batches(itertools.chain([first], rows), limit), limit)


def _in_batches(rows: Iterator[tuple[Any, ...]], limit: int) -> Iterator[list[tuple[Any, ...]]]:
    """Yield rows in batches, pulling no more than the limit and one more (0: all)."""
    fetched = 0
    while size := RowStream.next_fetch(limit, fetched):
        batch = list(itertools.islice(rows, size))
        if not batch:
            return
        fetched += len(batch)
        yield batch


def _described_columns(conn: psycopg.Connection[Any], sql: str) -> list[str]:
    """Return the column names of a statement as the server describes it (prepared unnamed, never run)."""
    prepared = conn.pgconn.prepare(b"", sql.encode())
    if prepared.status != psycopg.pq.ExecStatus.COMMAND_OK:
        return []
    described = conn.pgconn.describe_prepared(b"")
    return [(described.fname(i) or b"").decode() for i in range(described.nfields)]


def _create_lock_table(conn: psycopg.Connection[Any]) -> None:
    """Create the writers' lock table unless it exists (its one row: the DDL version last run on the schema)."""
    row = conn.execute("SELECT to_regclass(%s)", [WRITER_LOCK_TABLE]).fetchone()
    if row is not None and row[0] is not None:
        return
    try:
        with conn.transaction():  # a savepoint: a concurrent first writer may create it at the same moment
            conn.execute(f"CREATE TABLE IF NOT EXISTS {WRITER_LOCK_TABLE} (ddl_version text)")
    except (pg_errors.UniqueViolation, pg_errors.DuplicateTable):
        pass  # the other writer's table: LOCK_SQL waits for it


def _recorded_ddl_version(conn: psycopg.Connection[Any]) -> str | None:
    """Return the DDL version recorded in the schema (None before the first writer recorded one)."""
    row = conn.execute(f"SELECT max(ddl_version) FROM {WRITER_LOCK_TABLE}").fetchone()
    return row[0] if row else None


def _run_ddl(conn: psycopg.Connection[Any], statements: list[str]) -> None:
    """Run DDL statements in the writer's transaction and record the DDL version they bring the schema to."""
    for statement in statements:
        conn.execute(statement)
    conn.execute(f"DELETE FROM {WRITER_LOCK_TABLE}")
    conn.execute(f"INSERT INTO {WRITER_LOCK_TABLE} (ddl_version) VALUES (%s)", [ddl_version("postgres")])


def check_analyst_role(conn: psycopg.Connection[Any], where: str) -> None:
    """Refuse a superuser or a server-file role for analysts' SQL (UsageError); warn loudly about write privileges."""
    row = conn.execute(ROLE_SQL, [list(SERVER_FILE_ROLES)]).fetchone()
    superuser, file_roles, writable = (row[0], row[1], row[2]) if row else (False, [], [])
    fix = "connect `nightscore query` with a read-only role (README, 'Analysts on PostgreSQL'; NIGHTSCORE_QUERY_WAREHOUSE_URL)"
    if superuser:
        raise UsageError(
            f"warehouse {where}: refusing analysts' SQL as a superuser (it could read and write the server's files); {fix}"
        )
    if file_roles:
        raise UsageError(f"warehouse {where}: refusing analysts' SQL as a member of {', '.join(file_roles)}; {fix}")
    if writable:
        log.warning(
            "warehouse %s: the query role can write %s; the read-only transaction stops it, but %s",
            where,
            ", ".join(writable),
            fix,
        )


def _schema_exists(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT current_schema()").fetchone()
    return row is not None and row[0] is not None


def _check_width(conn: psycopg.Connection[Any], width: int, where: str) -> None:
    """Refuse a run whose embeddings do not fit the schema's item_scores.embedding check (cardinality = width)."""
    checks = [check for check in _check_constraints(conn, "item_scores") if "cardinality(embedding)" in check]
    declared = re.search(r"=\s*(\d+)", checks[0]) if checks else None
    if declared and int(declared.group(1)) != width:
        raise PublishError(
            f"warehouse {where} holds {declared.group(1)}-wide embeddings and this run's model makes "
            f"{width}-wide ones: publish to a new schema or database (NIGHTSCORE_WAREHOUSE_URL)"
        )


def _check_constraints(conn: psycopg.Connection[Any], table: str) -> list[str]:
    """Return the definitions of a table's CHECK constraints (none when the search_path has no such table).

    The table's oid is looked up first and pg_get_constraintdef runs in the select list only: in a WHERE clause a
    sequential scan of pg_constraint ran it on every check constraint of the database, before the conrelid test,
    and failed ("could not open relation with OID") on a table that another session was dropping.
    """
    row = conn.execute("SELECT to_regclass(%s)::oid", [table]).fetchone()
    if row is None or row[0] is None:
        return []
    definitions = "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s AND contype = 'c'"
    return [str(found[0]) for found in conn.execute(definitions, [row[0]]).fetchall()]


def _missing_objects(conn: psycopg.Connection[Any]) -> int:
    """Return how many warehouse tables, views and indexes the current schema lacks."""
    row = conn.execute(
        "SELECT count(*) FROM unnest(%s::text[]) AS name WHERE to_regclass(quote_ident(current_schema()) || '.' || name) IS NULL",
        [object_names("postgres")],
    ).fetchone()
    return int(row[0]) if row else 0


def copy_values(column: pa.Array, portable_kind: str) -> list[Any]:
    """Return one Arrow column as the Python values binary COPY writes for a warehouse type."""
    if portable_kind == "vector":
        return float4_arrays(column)
    return column.cast(ARROW_TYPES[portable_kind]).to_pylist()


def float4_arrays(vectors: pa.Array) -> list[bytes]:
    """Return each vector in PostgreSQL's binary real[] format (one dimension, lower bound 1, no NULLs)."""
    if len(vectors) == 0:
        return []
    lengths = pc.list_value_length(vectors).to_numpy(zero_copy_only=False)
    if vectors.null_count or lengths.min() != lengths.max():
        raise ValueError("embeddings must all be non-null and of one length")
    dim = int(lengths[0])
    cells = np.empty((len(vectors), dim), dtype=[("size", ">i4"), ("value", ">f4")])
    cells["size"] = 4
    cells["value"] = pc.list_flatten(vectors).to_numpy(zero_copy_only=False).reshape(len(vectors), dim)
    header = struct.pack(">5i", 1, 0, FLOAT4_OID, dim, 1)
    return [header + row.tobytes() for row in cells]


def pg_sql(sql: str, bind: bool) -> str:
    """Return SQL for psycopg: every % doubled and, when binding, each ? outside literals and comments made %s."""
    escaped = sql.replace("%", "%%")
    if not bind:
        return escaped
    return _LITERAL_OR_MARK.sub(lambda m: "%s" if m.group(0) == "?" else m.group(0), escaped)


def redact(url: str) -> str:
    """Return url with its password (in the user part or a password= parameter) replaced by ***."""
    parts = urlsplit(url)
    if parts.password is not None:
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{parts.netloc.rpartition('@')[2]}")
    return urlunsplit(parts._replace(query=re.sub(r"(password=)[^&]*", r"\1***", parts.query)))


def scrub(exc: BaseException, url: str) -> str:
    """Return an error's message on one line, without any password the URL holds."""
    message = " ".join(str(exc).split())[:300]
    parts = urlsplit(url)
    secrets = [parts.password or "", *re.findall(r"password=([^&]*)", parts.query)]
    for secret in filter(None, secrets):
        message = message.replace(secret, "***").replace(unquote(secret), "***")
    return message
