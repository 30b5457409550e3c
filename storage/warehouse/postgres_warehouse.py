"""The PostgreSQL warehouse adapter: the DuckDB tables, views and behaviour on a server.

Select a schema with the URL, as libpq does: ``postgresql://user@host/db?options=-csearch_path%3Dmyschema``.
Writes of one schema are serialised by an advisory lock (the server's equivalent of DuckDB's file
lock), so publications, rollbacks and prunes never interleave; readers are never blocked.

Analysts' SQL (`analyst_query`) runs in a read-only transaction that is always rolled back, as one prepared
statement, and only for a role that is neither a superuser nor a member of the server-file roles (those
could read or write the server's files with ``COPY``, ``pg_read_file`` or ``lo_import``); a role that can
write the warehouse tables is warned about.
"""

from __future__ import annotations

import logging
import re
import struct
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import errors as pg_errors

from core.errors import NightscoreError, PublishError, QueryRefused, UsageError, WarehouseBusy, WarehouseMissing
from storage.warehouse.base import QueryResult, present_columns
from storage.warehouse.schema import ddl, kind, object_names, upgrade_ddl
from storage.warehouse.sql import SqlWarehouse

log = logging.getLogger(__name__)

COPY_BATCH_ROWS = 10_000
FLOAT4_OID = 700
LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtext('nightscore.warehouse:' || current_schema()))"
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
_LEADING_NOISE = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/|\()*", re.DOTALL)
READ_KEYWORDS = ("select", "with", "values", "table")
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
        """Take this schema's writer lock for the current transaction, waiting at most lock_timeout_s."""
        conn.execute(f"SET LOCAL lock_timeout = '{int(self.lock_timeout_s * 1000)}ms'")
        try:
            conn.execute(LOCK_SQL)
        except pg_errors.LockNotAvailable as exc:
            raise WarehouseBusy(f"warehouse {self.where} is locked by another writer for over {self.lock_timeout_s:g}s") from exc

    def _ensure_tables(self, conn: psycopg.Connection[Any]) -> None:
        """Create the tables, views and indexes in the current schema unless they all exist (or require them)."""
        if self._tables_ready:
            return
        with conn.transaction():
            self._lock(conn)
            if not _schema_exists(conn):
                raise UsageError(f"warehouse {self.where}: no schema to write to (does the search_path schema exist?)")
            if _missing_objects(conn):
                if self.embedding_dim is None:
                    raise WarehouseMissing(f"no warehouse tables in {self.where}: run `nightscore run nightly` first")
                for statement in ddl(self.embedding_dim, "postgres"):
                    conn.execute(statement)
            if self.embedding_dim is not None:
                for statement in upgrade_ddl("postgres"):  # a warehouse made by an older nightscore: views, run_leases
                    conn.execute(statement)
                _check_width(conn, self.embedding_dim, self.where)
        self._tables_ready = True

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

    def analyst_query(self, sql: str) -> QueryResult:
        """Run one analyst statement as a checked role in a read-only, rolled-back transaction; QueryRefused otherwise."""
        keyword = re.match(r"[A-Za-z]+", _LEADING_NOISE.sub("", sql, count=1))
        if keyword is None or keyword.group(0).lower() not in READ_KEYWORDS:
            raise QueryRefused("query refused: only a read-only SELECT (or WITH ... SELECT) is allowed")
        with self._connect(NightscoreError) as conn:
            check_analyst_role(conn, self.where)
            try:
                return self._read_only(conn, sql)
            except psycopg.Error as exc:
                raise QueryRefused(f"query failed: {scrub(exc, self.url)}") from None

    def _read_only(self, conn: psycopg.Connection[Any], sql: str) -> QueryResult:
        """Run one unbound statement on conn in a read-only transaction that is always rolled back."""
        with conn.transaction(force_rollback=True):
            conn.execute("SET TRANSACTION READ ONLY")
            if _missing_objects(conn):
                raise WarehouseMissing(f"no warehouse tables in {self.where}: run `nightscore run nightly` first")
            cursor = conn.execute(pg_sql(sql, bind=False), prepare=True)
            columns = [column.name for column in cursor.description or []]
            return QueryResult(columns, cursor.fetchall() if cursor.description else [])


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
    row = conn.execute(
        "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c WHERE c.conrelid = to_regclass('item_scores') "
        "AND c.contype = 'c' AND pg_get_constraintdef(c.oid) LIKE '%cardinality(embedding)%'"
    ).fetchone()
    declared = re.search(r"=\s*(\d+)", row[0]) if row else None
    if declared and int(declared.group(1)) != width:
        raise PublishError(
            f"warehouse {where} holds {declared.group(1)}-wide embeddings and this run's model makes "
            f"{width}-wide ones: publish to a new schema or database (NIGHTSCORE_WAREHOUSE_URL)"
        )


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
