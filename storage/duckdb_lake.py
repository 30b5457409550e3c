"""DuckDB on the lake's Hive partitions (``<lake>/outputs/<table>/run_date=YYYY-MM-DD/part-0.parquet``).

On an s3:// lake the lake's own s3fs filesystem is registered with DuckDB (``register_filesystem``), so DuckDB
reads and writes ``s3://`` through s3fs with the lake's endpoint and credentials; DuckDB's httpfs extension is
not needed (it cannot be downloaded on our hosts). A local lake is read by DuckDB directly.

Analysts::

    from core.settings import load_settings
    from storage.duckdb_lake import connect, read_partitions
    from storage.resources import lake_for

    lake = lake_for(load_settings())
    con = connect(lake)
    read_partitions(con, lake, "item_scores").filter("run_date = date '2026-11-30'").limit(5).show()
"""

from __future__ import annotations

import logging
import posixpath
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import pyarrow as pa

from core.errors import PublishError
from storage.lake import Lake

log = logging.getLogger(__name__)

OUTPUTS = "outputs"
PARTITION_COLUMN = "run_date"
STAGING = "_staging"  # beside the tables, so a table's glob never matches a staged file
# A partition file's row group: DuckDB's default (122,880 rows) is 180 MB of embeddings per row group, and a
# COPY of 1M items then peaked at 4.2 GB; 16,384 rows (25 MB) peaks at 1.3 GB, 0.7 GB under LAKE_MEMORY_LIMIT.
ROW_GROUP_ROWS = 16_384
LAKE_MEMORY_LIMIT = "512MB"  # DuckDB's buffer pool for lake writes (its default is 80% of RAM)


def connect(lake: Lake, database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """Return a DuckDB connection that reads and writes the lake's URIs (s3:// through the lake's s3fs)."""
    con = duckdb.connect(database)
    if not lake.is_local:
        con.register_filesystem(lake.fs)
    return con


def table_uri(lake: Lake, table: str) -> str:
    """Return the folder of a published table's partitions."""
    return lake.uri(OUTPUTS, table)


def partitions_glob(lake: Lake, table: str) -> str:
    """Return the glob of every partition file of a published table."""
    return lake.uri(OUTPUTS, table, "*", "*.parquet")


def read_partitions(con: duckdb.DuckDBPyConnection, lake: Lake, table: str) -> duckdb.DuckDBPyRelation:
    """Return a relation over every partition of a published table, run_date (a DATE) from the folder names."""
    glob = _quote(partitions_glob(lake, table))
    return con.sql(f"select * from read_parquet({glob}, hive_partitioning = true)")


def write_partitions(con: duckdb.DuckDBPyConnection, lake: Lake, table: str, rows: pa.Table | str) -> list[str]:
    """Write rows as Hive partitions by run_date with DuckDB's COPY; return the partition files' URIs.

    rows: an Arrow table, or the URI of a Parquet file in the lake, which DuckDB then streams from the lake
    without the rows ever being a Python frame. `stage_partitions`, then `move_staged`: see there.
    """
    staging = stage_partitions(con, lake, table, rows)
    try:
        return move_staged(lake, staging, table)
    finally:
        remove_staging(lake, staging)


def stage_partitions(con: duckdb.DuckDBPyConnection, lake: Lake, table: str, rows: pa.Table | str) -> str:
    """Write rows' partitions into a staging folder of the lake (nothing a reader sees yet); return that folder.

    One plain COPY per run_date (a run has one) writes into the staging folder; COPY ... PARTITION_BY is not used
    because DuckDB buffers a partitioned write whole (7.7 GB at 1M items × 384 floats, and it cannot spill), while a
    plain COPY streams (through the registered filesystem on S3). The connection's buffer pool is capped at
    LAKE_MEMORY_LIMIT and row groups kept at ROW_GROUP_ROWS, so the write's memory does not grow with the run.
    A failed staging removes what it wrote.
    """
    con.execute(f"SET memory_limit = '{LAKE_MEMORY_LIMIT}'")
    staging = lake.uri(OUTPUTS, STAGING, f"{table}-{uuid.uuid4().hex[:12]}")
    try:
        with _source(con, rows) as source:
            if PARTITION_COLUMN not in con.sql(f"select * from {source} limit 0").columns:
                raise PublishError(f"cannot partition {table}: it has no {PARTITION_COLUMN} column")
            for value in _partition_values(con, source):
                folder = f"{staging}/{PARTITION_COLUMN}={value}"
                if lake.is_local:  # DuckDB writes the file, not its folders
                    lake.fs.makedirs(lake.fs._strip_protocol(folder), exist_ok=True)
                _copy_partition(con, source, value, f"{folder}/part-0.parquet")
    except BaseException:
        remove_staging(lake, staging)
        raise
    return staging


def move_staged(lake: Lake, staging: str, table: str) -> list[str]:
    """Move a staged table's files into place (a rename locally, one server-side copy on S3); return their URIs.

    A reader sees a partition's old file or its new one, never half a file. Files of a rewritten partition that
    this write did not produce are removed.
    """
    return _move_into_place(lake, staging, table_uri(lake, table))


def remove_staging(lake: Lake, staging: str) -> None:
    """Remove a staging folder (whatever a failed or finished write left there)."""
    _remove_tree(lake, staging)


def remove_partition(lake: Lake, table: str, run_date: str) -> bool:
    """Remove one run_date's partition folder of a table; return whether there was one."""
    path = lake.fs._strip_protocol(lake.uri(OUTPUTS, table, f"{PARTITION_COLUMN}={run_date}"))
    if not lake.fs.exists(path):
        return False
    lake.fs.rm(path, recursive=True)
    return True


def _partition_values(con: duckdb.DuckDBPyConnection, source: str) -> list[str]:
    """Return the distinct run_dates of source as YYYY-MM-DD, in order."""
    return [str(row[0]) for row in con.sql(f"select distinct {PARTITION_COLUMN} from {source} order by 1").fetchall()]


def _copy_partition(con: duckdb.DuckDBPyConnection, source: str, value: str, uri: str) -> None:
    """Stream the rows of one run_date, without the run_date column (it is in the folder name), to one Parquet file."""
    con.execute(
        f"COPY (select * exclude ({PARTITION_COLUMN}) from {source} where {PARTITION_COLUMN} = ?::date) "
        f"TO {_quote(uri)} (FORMAT parquet, ROW_GROUP_SIZE {ROW_GROUP_ROWS})",
        [value],
    )


@contextmanager
def _source(con: duckdb.DuckDBPyConnection, rows: pa.Table | str) -> Iterator[str]:
    """Yield SQL naming rows: a registered Arrow table (unregistered after) or a read_parquet of a URI."""
    if isinstance(rows, str):
        yield f"(select * from read_parquet({_quote(rows)}))"
        return
    name = f"nightscore_rows_{uuid.uuid4().hex[:8]}"
    con.register(name, rows)
    try:
        yield name
    finally:
        con.unregister(name)


def _move_into_place(lake: Lake, staging: str, target: str) -> list[str]:
    """Move every staged partition file to the same relative path under target; drop stale files there."""
    fs = lake.fs
    staged_root = fs._strip_protocol(staging)
    target_root = fs._strip_protocol(target)
    moved = []
    for path in sorted(fs.find(staged_root)):
        relative = posixpath.relpath(path, staged_root)
        destination = posixpath.join(target_root, relative)
        if lake.is_local:
            fs.makedirs(posixpath.dirname(destination), exist_ok=True)
        fs.mv(path, destination)
        moved.append(relative)
    _remove_stale(lake, target_root, moved)
    log.info("lake: wrote %d partition file(s) under %s", len(moved), target)
    return [posixpath.join(target, relative) for relative in moved]


def _remove_stale(lake: Lake, target_root: str, written: list[str]) -> None:
    """Remove the files of rewritten partitions that this write did not produce (from a larger earlier write)."""
    for partition in {posixpath.dirname(relative) for relative in written}:
        folder = posixpath.join(target_root, partition)
        keep = {posixpath.join(target_root, relative) for relative in written}
        for path in lake.fs.find(folder):
            if path not in keep:
                lake.fs.rm(path)


def _remove_tree(lake: Lake, uri: str) -> None:
    """Remove a folder of the lake if it exists (staging leftovers)."""
    path = lake.fs._strip_protocol(uri)
    if lake.fs.exists(path):
        lake.fs.rm(path, recursive=True)


def _quote(text: str) -> str:
    """Return text as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"
