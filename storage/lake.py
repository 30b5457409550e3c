"""The lake adapter: Parquet files under a local folder or an s3:// prefix, through fsspec/s3fs.

Two kinds of failure are told apart everywhere: a file that is missing, corrupt or malformed is the data's
fault (InputUnreadable, a contract failure: exit 3); a connection that is reset, refused or times out is the
transport's (`transport_error`): the operation is retried with exponential backoff (``retries``, then
``backoff_s`` doubling), and what still fails raises LakeUnavailable (exit 1) naming the cause. A stream that
already yielded rows is not retried here (the task that reads it may be).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import posixpath
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TypeVar

import fsspec
import polars as pl
import pyarrow as pa
import pyarrow.lib
import pyarrow.parquet as pq
from fsspec.core import url_to_fs

from core.errors import InputUnreadable, LakeUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
TRANSPORT_ERRNOS = {
    errno.ECONNRESET,
    errno.ECONNREFUSED,
    errno.ECONNABORTED,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ENETDOWN,
    errno.EPIPE,
}


def _transport_types() -> tuple[type[BaseException], ...]:
    """Return the exception types of a failed connection in the libraries under s3fs (botocore, aiohttp, fsspec)."""
    types: list[type[BaseException]] = [ConnectionError, TimeoutError]
    try:
        from botocore import exceptions as boto

        types += [boto.EndpointConnectionError, boto.ConnectionClosedError, boto.ReadTimeoutError, boto.ConnectTimeoutError]
    except ImportError:  # a local lake: nothing but the OS's errors
        pass
    try:
        import aiohttp

        types += [aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, aiohttp.ServerTimeoutError]
    except ImportError:
        pass
    from fsspec.exceptions import FSTimeoutError

    return (*types, FSTimeoutError)


def transport_error(exc: BaseException) -> BaseException | None:
    """Return the connection failure (reset, refused, timeout) in an exception's chain, or None when there is none."""
    types, seen = _transport_types(), set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, types) or (isinstance(current, OSError) and current.errno in TRANSPORT_ERRNOS):
            return current
        current = current.__cause__ or current.__context__
    return None


class Lake:
    """A lake root (local path or s3://bucket/prefix): resolves URIs, reads and atomically writes Parquet."""

    def __init__(self, root: str, storage_options: dict | None = None, retries: int = 3, backoff_s: float = 0.5) -> None:
        self.root = root.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.fs, self._root_path = url_to_fs(self.root, **self.storage_options)
        self.is_local = "file" in self.fs.protocol
        self.retries, self.backoff_s = retries, backoff_s

    def _io(self, what: str, uri: str, action: Callable[[], T]) -> T:
        """Run one lake operation, retrying transport failures with backoff; LakeUnavailable when they persist."""
        for attempt in range(self.retries + 1):
            try:
                return action()
            except Exception as exc:
                cause = transport_error(exc)
                if cause is None:
                    raise
                if attempt == self.retries:
                    raise LakeUnavailable(
                        f"lake unavailable: {what} {uri} failed {attempt + 1} time(s): "
                        f"{type(cause).__name__}: {_first_line(cause)}"
                    ) from exc
                delay = self.backoff_s * 2**attempt
                log.warning(
                    "lake: %s %s failed (%s: %s), retrying in %.1f s", what, uri, type(cause).__name__, _first_line(cause), delay
                )
                time.sleep(delay)
        raise AssertionError("unreachable")  # the loop returns or raises

    def uri(self, *parts: str) -> str:
        """Return the URI of a path under the lake root."""
        return posixpath.join(self.root, *parts)

    def exists(self, uri: str) -> bool:
        """Return whether a file exists at uri."""
        fs, path = self._fs_path(uri)
        return self._io("checking", uri, lambda: bool(fs.exists(path)))

    def read_parquet(
        self, uri: str, dataset: str = "file", columns: list[str] | None = None, where: pl.Expr | None = None
    ) -> pl.DataFrame:
        """Return the Parquet file at uri (only ``columns`` that exist, rows matching ``where``); unreadable -> InputUnreadable.

        Local files are scanned lazily so only the wanted columns and row groups are read; remote ones through s3fs.
        """
        fs, path = self._fs_path(uri)

        def read() -> pl.DataFrame:
            if not fs.exists(path):
                raise InputUnreadable(f"{dataset} file {uri}: not found")
            try:
                try:
                    frame = pl.scan_parquet(path) if self.is_local and fs is self.fs else _remote_frame(fs, path)
                    names = frame.collect_schema().names()
                    picked = frame.filter(where) if where is not None else frame
                    return picked.select([c for c in names if columns is None or c in columns]).collect()
                except pl.exceptions.ComputeError as exc:
                    if "utf-8" not in str(exc).lower():
                        raise
                    table = _arrow_table(fs, path, columns)  # polars refuses the file; arrow hands it over, bytes flagged
                    return table.filter(where) if where is not None else table
            except (pl.exceptions.PolarsError, pyarrow.lib.ArrowException, OSError, ValueError) as exc:
                if transport_error(exc) is not None:
                    raise  # the transport's fault: retried by _io
                raise _unreadable(exc, dataset, uri) from exc

        return self._io("reading", uri, read)

    def write_parquet(self, frame: pl.DataFrame, uri: str) -> str:
        """Write frame to uri atomically (temporary name, then rename; on S3 one upload of a finished file) and return uri."""
        with self._staged_file(uri) as tmp:
            frame.write_parquet(tmp)
        return uri

    @contextmanager
    def _staged_file(self, uri: str) -> Iterator[str]:
        """Yield a local temporary path to write uri's file into; once written, it becomes uri whole.

        Local: a temporary name beside the target, then a rename. Remote: a local temporary file, then one
        upload (not fs.open("wb"): closing a remote file on an exception would commit the part written so far),
        retried on transport failures. A failed write leaves no file at uri.
        """
        fs, path = self._fs_path(uri)
        local = "file" in fs.protocol
        if local:
            fs.makedirs(posixpath.dirname(path), exist_ok=True)
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        else:
            handle, tmp = tempfile.mkstemp(suffix=".parquet", prefix="nightscore-")
            os.close(handle)
        try:
            yield tmp
            if local:
                fs.mv(tmp, path)
            else:
                self._io("writing", uri, lambda: fs.put_file(tmp, path))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def put_dir(self, local_dir: str | Path, uri: str) -> list[str]:
        """Copy every file under a local folder to the folder uri (same relative paths); return their URIs."""
        fs, path = self._fs_path(uri)
        files = sorted(p for p in Path(local_dir).rglob("*") if p.is_file())
        for file in files:
            target = posixpath.join(path, file.relative_to(local_dir).as_posix())
            if "file" in fs.protocol:
                fs.makedirs(posixpath.dirname(target), exist_ok=True)
            self._io("writing", target, lambda f=file, t=target: fs.put_file(str(f), t))  # type: ignore[misc]
        log.debug("lake: copied %d files from %s to %s", len(files), local_dir, uri)
        return [posixpath.join(uri, f.relative_to(local_dir).as_posix()) for f in files]

    def write_json(self, payload: dict, uri: str) -> str:
        """Write a small JSON document atomically (temporary name, then rename) and return uri."""
        return self.write_bytes(json.dumps(payload, sort_keys=True, default=str).encode(), uri)

    def identity(self, uri: str) -> dict[str, str] | None:
        """Return what tells one version of a file from another (size, and ETag or modification time); None if absent."""
        fs, path = self._fs_path(uri)

        def info() -> dict[str, str] | None:
            try:
                found = fs.info(path)
            except FileNotFoundError:
                return None
            keys = ("size", "ETag", "etag", "mtime", "LastModified", "last_modified", "VersionId")
            return {key: str(found[key]) for key in keys if found.get(key) is not None}

        return self._io("reading", uri, info)

    def read_json(self, uri: str) -> dict | None:
        """Return the JSON document at uri, or None if there is none."""
        fs, path = self._fs_path(uri)

        def read() -> dict | None:
            try:
                return json.loads(fs.cat_file(path))
            except FileNotFoundError:
                return None

        return self._io("reading", uri, read)

    def read_bytes(self, uri: str) -> bytes:
        """Return a small file's bytes; InputUnreadable when there is none."""
        fs, path = self._fs_path(uri)

        def read() -> bytes:
            try:
                return bytes(fs.cat_file(path))
            except FileNotFoundError as exc:
                raise InputUnreadable(f"{uri}: not found") from exc

        return self._io("reading", uri, read)

    def write_bytes(self, data: bytes, uri: str) -> str:
        """Write a small file (a PNG, a model) whole and atomically (temporary name, then rename; one PUT on S3)."""
        fs, path = self._fs_path(uri)
        if "file" not in fs.protocol:
            self._io("writing", uri, lambda: fs.pipe_file(path, data))
            return uri
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        fs.pipe_file(tmp, data)
        fs.mv(tmp, path)
        return uri

    def remove_tree(self, uri: str) -> int:
        """Delete a folder of the lake and everything under it; return the bytes freed (0 when there was none)."""
        fs, path = self._fs_path(uri)

        def remove() -> int:
            if not fs.exists(path):
                return 0
            size = int(fs.du(path, total=True))
            fs.rm(path, recursive=True)
            return size

        return self._io("removing", uri, remove)

    def _fs_path(self, uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """Return the filesystem and path of uri: the lake's own for its paths and for URIs of its protocol."""
        if uri.startswith(self.root) or "://" not in uri:
            return self.fs, self.fs._strip_protocol(uri)
        protocol = uri.split("://", 1)[0]
        protocols = (self.fs.protocol,) if isinstance(self.fs.protocol, str) else self.fs.protocol
        if protocol in protocols:  # e.g. inputs in another bucket: same endpoint and credentials
            return self.fs, self.fs._strip_protocol(uri)
        return url_to_fs(uri)

    def iter_frames(
        self, uri: str, dataset: str = "file", columns: list[str] | None = None, batch_size: int = 65_536
    ) -> Iterator[pl.DataFrame]:
        """Yield the Parquet file at uri as frames of at most batch_size rows, streamed (unreadable -> InputUnreadable).

        Opening the file (and reading up to its first batch) is retried on transport failures; a failure after a
        batch was yielded raises LakeUnavailable at once (the rows already handed on cannot be taken back here).
        """
        fs, path = self._fs_path(uri)
        batches = self._io("reading", uri, lambda: _first_batch(fs, path, uri, dataset, columns, batch_size))
        if batches is None:
            return
        try:
            yield from batches
        except Exception as exc:
            cause = transport_error(exc)
            if cause is None:
                raise
            raise LakeUnavailable(
                f"lake unavailable: reading {uri} failed midway: {type(cause).__name__}: {_first_line(cause)}"
            ) from exc

    def parquet_rows(self, uri: str) -> int:
        """Return the row count of the Parquet file at uri from its footer (no rows read)."""
        fs, path = self._fs_path(uri)

        def rows() -> int:
            with fs.open(path, "rb") as handle:
                return int(pq.ParquetFile(handle).metadata.num_rows)

        return self._io("reading", uri, rows)

    def write_parquet_streams(
        self, rows: Iterable[Sequence[pl.DataFrame]], uris: Sequence[str], schemas: Sequence[pl.Schema]
    ) -> list[str]:
        """Write several files in one pass: each item of rows holds one frame per file (a row group each); return uris.

        Each file is written atomically as write_parquet_frames writes one; a failure leaves none of them.
        """
        with ExitStack() as stack:
            paths = [stack.enter_context(self._staged_file(uri)) for uri in uris]
            writers: list[pq.ParquetWriter] = [
                stack.enter_context(pq.ParquetWriter(path, schema.to_arrow()))
                for path, schema in zip(paths, schemas, strict=True)
            ]
            for frames in rows:
                for writer, frame in zip(writers, frames, strict=True):
                    table = frame.to_arrow()
                    writer.write_table(table.cast(writer.schema))
        return list(uris)

    def write_parquet_frames(self, frames: Iterable[pl.DataFrame], uri: str, schema: pl.Schema | None = None) -> str:
        """Write frames one row group at a time to uri atomically (local temporary file, then rename or upload); return uri.

        Only one frame is in memory at a time. With no frames, an empty file of ``schema`` is written.
        """
        with self._staged_file(uri) as tmp:
            _write_frames(frames, tmp, schema)
        return uri


def binary_unless_utf8(batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch | pa.Table:
    """Return batch with each string column whose bytes are not all valid UTF-8 viewed as binary.

    Arrow does not check string data a Parquet file declares UTF-8, and polars would take invalid bytes into its
    strings (and fail later, far from the cause); as binary they reach the input contracts, which decode them row
    by row and quarantine the rows that are not UTF-8 (data_contracts/inputs.py).
    """
    columns, changed = [], False
    for field, column in zip(batch.schema, batch.columns, strict=True):
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            try:
                column.validate(full=True)
            except pa.ArrowInvalid:
                column, changed = _as_binary(column, pa.binary() if pa.types.is_string(field.type) else pa.large_binary()), True
        columns.append(column)
    if not changed:
        return batch
    if isinstance(batch, pa.Table):
        return pa.Table.from_arrays(columns, names=batch.schema.names)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _as_binary(column: pa.Array | pa.ChunkedArray, binary: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """Return a string column's bytes as a binary column of the same layout (no copy)."""
    if isinstance(column, pa.ChunkedArray):
        return pa.chunked_array([chunk.view(binary) for chunk in column.chunks], type=binary)
    return column.view(binary)


def _remote_frame(fs: fsspec.AbstractFileSystem, path: str) -> pl.LazyFrame:
    with fs.open(path, "rb") as handle:
        return pl.read_parquet(handle).lazy()


def _arrow_table(fs: fsspec.AbstractFileSystem, path: str, columns: list[str] | None) -> pl.DataFrame:
    """Return a Parquet file read by Arrow (only the wanted columns that exist), invalid UTF-8 columns as binary."""
    with fs.open(path, "rb") as handle:
        parquet = pq.ParquetFile(handle)
        names = [c for c in parquet.schema_arrow.names if columns is None or c in columns]
        return pl.from_arrow(binary_unless_utf8(parquet.read(columns=names)))  # type: ignore[return-value]


def _unreadable(exc: BaseException, dataset: str, uri: str) -> InputUnreadable:
    """Return the contract failure of a file that is there but cannot be read as Parquet."""
    return InputUnreadable(f"{dataset} file {uri}: not a readable Parquet file ({_first_line(exc)})")


def _first_batch(
    fs: fsspec.AbstractFileSystem, path: str, uri: str, dataset: str, columns: list[str] | None, batch_size: int
) -> Iterator[pl.DataFrame] | None:
    """Open a Parquet file and read its first batch; return an iterator of every batch (None when it has none)."""
    if not fs.exists(path):
        raise InputUnreadable(f"{dataset} file {uri}: not found")
    batches = _batches(fs, path, uri, dataset, columns, batch_size)
    try:
        first = next(batches)
    except StopIteration:
        return None
    return _chain(first, batches)


def _chain(first: pl.DataFrame, rest: Iterator[pl.DataFrame]) -> Iterator[pl.DataFrame]:
    yield first
    yield from rest


def _batches(
    fs: fsspec.AbstractFileSystem, path: str, uri: str, dataset: str, columns: list[str] | None, batch_size: int
) -> Iterator[pl.DataFrame]:
    """Yield the file's batches; a corrupt file raises InputUnreadable, a transport failure itself."""
    try:
        with fs.open(path, "rb") as handle:
            parquet = pq.ParquetFile(handle, pre_buffer=False)  # pre-buffering reads every row group up front
            names = [c for c in parquet.schema_arrow.names if columns is None or c in columns]
            for batch in parquet.iter_batches(batch_size=batch_size, columns=names):
                yield pl.from_arrow(binary_unless_utf8(batch))  # type: ignore[misc]
    except (pyarrow.lib.ArrowException, OSError, ValueError) as exc:
        if transport_error(exc) is not None:
            raise
        raise _unreadable(exc, dataset, uri) from exc


def _write_frames(frames: Iterable[pl.DataFrame], path: str, schema: pl.Schema | None) -> None:
    """Write frames to a local Parquet file, one row group each, cast to the first frame's Arrow schema."""
    writer = None
    try:
        for frame in frames:
            table = frame.to_arrow()
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema)
            writer.write_table(table.cast(writer.schema))
        if writer is None:
            pl.DataFrame(schema=schema).write_parquet(path)
    finally:
        if writer is not None:
            writer.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
