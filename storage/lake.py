"""The lake adapter: Parquet files under a local folder or an s3:// prefix, through fsspec/s3fs."""

from __future__ import annotations

import json
import logging
import posixpath
import uuid

import fsspec
import polars as pl
import pyarrow.lib
from fsspec.core import url_to_fs

from nightscore.errors import InputUnreadable

log = logging.getLogger(__name__)


class Lake:
    """A lake root (local path or s3://bucket/prefix): resolves URIs, reads and atomically writes Parquet."""

    def __init__(self, root: str, storage_options: dict | None = None) -> None:
        self.root = root.rstrip("/")
        self.fs, self._root_path = url_to_fs(self.root, **(storage_options or {}))
        self.is_local = "file" in self.fs.protocol

    def uri(self, *parts: str) -> str:
        """Return the URI of a path under the lake root."""
        return posixpath.join(self.root, *parts)

    def exists(self, uri: str) -> bool:
        """Return whether a file exists at uri."""
        fs, path = self._fs_path(uri)
        return fs.exists(path)

    def read_parquet(
        self, uri: str, dataset: str = "file", columns: list[str] | None = None, where: pl.Expr | None = None
    ) -> pl.DataFrame:
        """Return the Parquet file at uri (only ``columns`` that exist, rows matching ``where``); unreadable -> InputUnreadable.

        Local files are scanned lazily so only the wanted columns and row groups are read; remote ones through s3fs.
        """
        fs, path = self._fs_path(uri)
        if not fs.exists(path):
            raise InputUnreadable(f"{dataset} file {uri}: not found")
        try:
            if self.is_local and fs is self.fs:
                frame = pl.scan_parquet(path)
            else:
                with fs.open(path, "rb") as handle:
                    frame = pl.read_parquet(handle).lazy()
            names = frame.collect_schema().names()
            if where is not None:
                frame = frame.filter(where)
            return frame.select([c for c in names if columns is None or c in columns]).collect()
        except (pl.exceptions.PolarsError, pyarrow.lib.ArrowException, OSError, ValueError) as exc:
            raise InputUnreadable(f"{dataset} file {uri}: not a readable Parquet file ({_first_line(exc)})") from exc

    def write_parquet(self, frame: pl.DataFrame, uri: str) -> str:
        """Write frame to uri atomically (temporary name, then rename) and return uri."""
        fs, path = self._fs_path(uri)
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        if not self.is_local:
            with fs.open(path, "wb") as handle:  # an S3 object appears whole or not at all
                frame.write_parquet(handle)
            return uri
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            with fs.open(tmp, "wb") as handle:
                frame.write_parquet(handle)
            fs.mv(tmp, path)
        finally:
            if fs.exists(tmp):
                fs.rm(tmp)
        return uri

    def write_json(self, payload: dict, uri: str) -> str:
        """Write a small JSON document atomically (temporary name, then rename) and return uri."""
        fs, path = self._fs_path(uri)
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        data = json.dumps(payload, sort_keys=True, default=str).encode()
        if not self.is_local:
            fs.pipe_file(path, data)
            return uri
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        fs.pipe_file(tmp, data)
        fs.mv(tmp, path)
        return uri

    def read_json(self, uri: str) -> dict | None:
        """Return the JSON document at uri, or None if there is none."""
        fs, path = self._fs_path(uri)
        if not fs.exists(path):
            return None
        return json.loads(fs.cat_file(path))

    def _fs_path(self, uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
        if uri.startswith(self.root) or "://" not in uri:
            return self.fs, self.fs._strip_protocol(uri)
        return url_to_fs(uri)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
