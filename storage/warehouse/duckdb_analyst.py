"""Analysts' SQL on DuckDB: a snapshot of the warehouse file, a sandboxed connection, one statement that is watched.

DuckDB has one writer per file, and a read-only connection of another process keeps the writer out as long as
it is open: an analyst's long query would make the nightly's publication wait and fail. Analysts therefore
read a snapshot, a copy of the file beside it (``<file>.snapshot``), made on the first query after the
warehouse changed while the file is held read-only for the copy alone (a second or so on a demo warehouse),
then renamed over the old copy. While a writer holds the file, a query answers from the snapshot there is.

The statement runs on a worker thread so that the caller can stop it: at the query timeout, or on Ctrl-C
(DuckDB checks for a signal only now and then: ``interrupt`` stops it at once).
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from core.errors import NightscoreError, QueryRefused
from storage.warehouse.analyst import RowStream, leading_keyword, timed_out

# The analysts' DuckDB connection: no file, network or extension access beyond the database file itself
# (COPY, EXPORT, ATTACH, read_csv/read_text/glob and INSTALL are refused by DuckDB); `sandboxed` freezes its
# settings once it has turned the progress bar off (a connection-only setting).
ANALYST_DUCKDB_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_unsigned_extensions": False,
}
_EXPLAIN = re.compile(r"\A\s*EXPLAIN\s*(?:\([^)]*\)\s*)?(?:ANALY[SZ]E\b\s*)?", re.IGNORECASE)
_SET_ADVICE = re.compile(r"\bSET\s+\w+")  # DuckDB's errors suggest a SET the sandbox refuses (lock_configuration)
_POLL_S = 0.2  # how often a waiting caller looks at the clock (Ctrl-C interrupts the wait at once)
_DONE = object()


def snapshot_path(path: str) -> Path:
    """Return where analysts' copy of a DuckDB warehouse file lives: beside it, ``<file>.snapshot``."""
    return Path(f"{path}.snapshot")


def is_current(source: Path, snapshot: Path) -> bool:
    """Return whether snapshot was copied from the warehouse as it is now (a copy carries its source's stamp)."""
    try:
        return snapshot.stat().st_mtime_ns == _stamp(source)
    except FileNotFoundError:
        return False


def copy_snapshot(source: Path, snapshot: Path) -> None:
    """Copy the warehouse file over snapshot, atomically; the caller holds it read-only, so no writer changes it.

    A write-ahead log beside the file (a writer that crashed) is copied too and folded into the copy.
    """
    tmp = snapshot.with_name(f"{snapshot.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    stamp = _stamp(source)
    try:
        shutil.copyfile(source, tmp)
        if Path(f"{source}.wal").exists():
            shutil.copyfile(f"{source}.wal", f"{tmp}.wal")
            duckdb.connect(str(tmp)).close()  # replays the log into the copy and checkpoints it
        os.utime(tmp, ns=(time.time_ns(), stamp))
        os.replace(tmp, snapshot)
    except OSError as exc:
        raise NightscoreError(f"cannot write the analysts' snapshot {snapshot}: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
        Path(f"{tmp}.wal").unlink(missing_ok=True)


def _stamp(source: Path) -> int:
    """Return the warehouse's change stamp: the newest modification time of its file and write-ahead log."""
    wal = Path(f"{source}.wal")
    return max(source.stat().st_mtime_ns, wal.stat().st_mtime_ns if wal.exists() else 0)


def sandboxed(path: Path) -> duckdb.DuckDBPyConnection:
    """Return a read-only connection to path in the analysts' sandbox (ANALYST_DUCKDB_CONFIG), its settings locked."""
    con = duckdb.connect(str(path), read_only=True, config=ANALYST_DUCKDB_CONFIG)
    try:
        con.execute("SET enable_progress_bar = false")  # DuckDB draws it on stdout, in the middle of the rows
        con.execute("SET lock_configuration = true")  # from here on every SET is refused
    except BaseException:
        con.close()
        raise
    return con


def check_analyst_sql(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Raise QueryRefused unless sql is one SELECT (or EXPLAIN of one) over the warehouse's (or DuckDB's catalog) own tables."""
    statements = _statements(con, sql)
    if len(statements) != 1:
        raise QueryRefused(f"query refused: give exactly one statement, got {len(statements)}")
    statement = statements[0]
    if statement.type == duckdb.StatementType.EXPLAIN:
        inner = _EXPLAIN.sub("", statement.query, count=1)
        explained = _statements(con, inner)
        if len(explained) != 1 or explained[0].type != duckdb.StatementType.SELECT:
            _refuse(f"EXPLAIN {leading_keyword(inner)}")
    elif statement.type != duckdb.StatementType.SELECT:
        _refuse(leading_keyword(statement.query) or statement.type.name)
    known = {
        str(row[0])
        for row in con.execute("SELECT table_name FROM duckdb_tables() UNION SELECT view_name FROM duckdb_views()").fetchall()
    }
    foreign = sorted(name for name in con.get_table_names(sql) if name not in known)
    if foreign:
        raise QueryRefused(f"query refused: {', '.join(foreign)} is not a warehouse table or view")


def _statements(con: duckdb.DuckDBPyConnection, sql: str) -> list[Any]:
    try:
        return list(con.extract_statements(sql))
    except duckdb.Error as exc:
        raise QueryRefused(f"query failed: {sandbox_message(exc)}") from exc


def _refuse(name: str) -> None:
    raise QueryRefused(f"query refused: only a read-only SELECT (or WITH ... SELECT, EXPLAIN SELECT) is allowed, got {name}")


def sandbox_message(exc: BaseException) -> str:
    """Return a DuckDB error on one line, without advice to SET a setting (the sandbox refuses every SET)."""
    sentences = re.split(r"(?<=\.)\s+", " ".join(str(exc).split()))
    kept = [sentence for sentence in sentences if not _SET_ADVICE.search(sentence)]
    text = " ".join(kept)
    if len(kept) < len(sentences):
        text += " (settings are fixed in the query sandbox: simplify the query instead)"
    return text[:300]


class _Statement(threading.Thread):
    """One statement run on a worker thread: its columns, then its row batches, handed over a small queue."""

    def __init__(self, con: duckdb.DuckDBPyConnection, sql: str, limit: int) -> None:
        super().__init__(name="analyst-query", daemon=True)
        self.con, self.sql, self.limit = con, sql, limit
        self.handed: queue.Queue[Any] = queue.Queue(maxsize=2)  # two batches ahead of the reader at most
        self.stopping = threading.Event()

    def run(self) -> None:
        """Execute the statement and hand over its columns and batches (or its error), until done or stopped."""
        try:
            cursor = self.con.execute(self.sql)
            if not self._hand([d[0] for d in cursor.description or []]):
                return
            fetched = 0
            while size := RowStream.next_fetch(self.limit, fetched):
                batch = cursor.fetchmany(size)
                if not batch or not self._hand(batch):
                    break
                fetched += len(batch)
        except duckdb.Error as exc:
            self._hand(exc)
            return
        self._hand(_DONE)

    def _hand(self, item: object) -> bool:
        """Put item on the queue, waiting while the reader is behind; return False once the reader has stopped."""
        while not self.stopping.is_set():
            try:
                self.handed.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def take(self, deadline: float | None, timeout_s: float | None) -> Any:
        """Return the next item (re-raising the statement's error); QueryTimeout past the deadline."""
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0 and timeout_s is not None:
                raise timed_out(timeout_s)
            try:
                item = self.handed.get(timeout=_POLL_S if left is None else min(_POLL_S, left))
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise item
            return item

    def stop(self) -> None:
        """Stop the statement (interrupting DuckDB if it still runs) and wait a moment for the thread to end."""
        self.stopping.set()
        if self.is_alive():
            self.con.interrupt()
            self.join(timeout=5)


@contextmanager
def watched(
    con: duckdb.DuckDBPyConnection, sql: str, limit: int, timeout_s: float | None
) -> Iterator[tuple[list[str], Iterator[Sequence[tuple[Any, ...]]]]]:
    """Run sql on con in a worker thread; yield its columns and an iterator over its row batches.

    The statement is interrupted at the deadline (QueryTimeout) and when the caller stops early or fails,
    Ctrl-C (KeyboardInterrupt) included: the caller waits on a queue, which a signal interrupts at once.
    """
    statement = _Statement(con, sql, limit)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    statement.start()

    def batches() -> Iterator[Sequence[tuple[Any, ...]]]:
        while (item := statement.take(deadline, timeout_s)) is not _DONE:
            yield item

    try:
        yield statement.take(deadline, timeout_s), batches()
    finally:
        statement.stop()
