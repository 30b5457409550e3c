"""Logging of nightscore's commands and flow runs: one line per failure on the console, tracebacks in a file.

Expected failures (core.errors.EXPECTED: a contract violation, bad usage, an interruption) are shown
as their one-line message everywhere, the Prefect UI included. Unexpected ones show one line on the
console too; their full traceback goes to the command's log file (and to the console with --verbose,
and to the Prefect UI, where a developer reads it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.errors import is_expected

FORMAT = "%(asctime)s %(levelname)s %(name)s%(run)s: %(message)s"
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
# `extra` of a warning that `nightscore run nightly`'s summary repeats (quarantine per rule, truncated texts): the
# terminal shows it once, in the summary; the log file and the Prefect UI keep the run's own line
IN_SUMMARY: dict[str, object] = {"in_summary": True}


def run_formatter() -> logging.Formatter:
    """Return the FORMAT formatter; ``run`` defaults to "" where no RunNameFilter set it (a handler without one)."""
    return logging.Formatter(FORMAT, defaults={"run": ""})


NOISY = ("httpx", "urllib3", "filelock", "great_expectations")


class RunNameFilter(logging.Filter):
    """Adds ``record.run`` (" [task run name]" or " [flow run name]" from Prefect's run loggers, else "")."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Return True (keep every record) after setting its ``run`` field."""
        name = getattr(record, "task_run_name", None) or getattr(record, "flow_run_name", None)
        record.run = f" [{name}]" if name else ""
        return True


class SaidOnceOnConsole(logging.Filter):
    """A console handler's filter while a command's flow runs: drops the warnings the run's summary repeats and holds
    the run loggers' errors until the run ends, when `release` hands them on but those that repeat its failure."""

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__()
        self.handler = handler
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        """Return False for a record the summary repeats, or a run's error (held until the run ends)."""
        if getattr(record, "in_summary", False):
            return False
        if record.levelno >= logging.ERROR and record.name in RUN_LOGGERS:
            self.held.append(record)
            return False
        return True

    def release(self, failure: BaseException | None) -> None:
        """Hand the held errors to the handler, but those that repeat the run's expected failure (the command's last
        line says it, once)."""
        for record in self.held:
            if failure is None or not repeats(record, failure):
                self.handler.handle(record)
        self.held.clear()


def repeats(record: logging.LogRecord, failure: BaseException) -> bool:
    """Return whether a record says an expected failure again: its type and message, as Prefect's run logs quote them."""
    said = " ".join(str(failure).split())
    if not is_expected(failure) or not said:
        return False
    try:
        text = " ".join(record.getMessage().split())
    except (TypeError, ValueError):  # arguments that do not format: the handler reports the record, as it would have
        return False
    return type(failure).__name__ in text and (said in text or repr(str(failure))[1:-1] in text)


@contextmanager
def said_once_on_console(verbose: bool) -> Iterator[None]:
    """Say each thing of a command's flow run once on the console while the block runs: the warnings its summary
    repeats and the errors that repeat its expected failure stay in the log file and the Prefect UI (verbose: all
    of it on the console too, as it comes)."""
    consoles = [] if verbose else [h for h in logging.getLogger().handlers if not isinstance(h, logging.FileHandler)]
    filters = [SaidOnceOnConsole(handler) for handler in consoles]
    for each in filters:
        each.handler.addFilter(each)
    failure: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        failure = exc
        raise
    finally:
        for each in filters:
            each.handler.removeFilter(each)
            each.release(failure)


class OneLine(logging.Formatter):
    """Wraps a handler's formatter so a record renders without its traceback (all, or expected failures only).

    The record itself is never changed: other handlers (the log file) still see the traceback.
    """

    def __init__(self, inner: logging.Formatter | None, expected_only: bool) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()  # a handler without a formatter formats the message only
        self.expected_only = expected_only

    def format(self, record: logging.LogRecord) -> str:
        """Return the record's text; its traceback is left out unless it is kept for this handler."""
        error = record.exc_info[1] if record.exc_info else None
        if error is None or (self.expected_only and not is_expected(error)):
            return self.inner.format(record)
        # a copy: other handlers may format the same record at the same time in their own threads (Prefect's API log
        # worker does), so it is never changed, not even for a moment
        bare = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None, "stack_info": None})
        return self.inner.format(bare)


class LazyFileHandler(logging.FileHandler):
    """A file handler that makes its file's folder only when its first record comes (a read-only command leaves none)."""

    def _open(self) -> Any:
        """Open the log file, making its folder first."""
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def log_file_path(logs_dir: Path, command: str) -> Path:
    """Return a fresh log file path for one command: <logs>/<UTC time>-<command>.log."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return logs_dir / f"{stamp}-{command}.log"


def configure_logging(verbose: bool = False, log_file: Path | None = None, console_level: int = logging.WARNING) -> None:
    """Send warnings and failures to stderr (everything from DEBUG when verbose), one line per failure, and every record
    from INFO (DEBUG when verbose) to log_file.

    Call it after Prefect is imported (Prefect installs its own console handler at import): every console
    handler of the root logger then loses tracebacks unless verbose; the Prefect API handlers lose those
    of expected failures only.
    """
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    for handler in root.handlers:
        _console(handler, verbose, console_level)
    if log_file is not None:
        for old in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
            root.removeHandler(old)  # one log file per command (tests run many commands in one process)
            old.close()
        file_handler = LazyFileHandler(log_file, encoding="utf-8", delay=True)  # no file (nor folder) until a record comes
        file_handler.setFormatter(run_formatter())
        file_handler.addFilter(RunNameFilter())
        root.addHandler(file_handler)
    for name in RUN_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            if not isinstance(handler.formatter, OneLine):
                handler.setFormatter(OneLine(handler.formatter, expected_only=True))
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def to_log_file(message: str, exc: BaseException, logger: str = "nightscore") -> bool:
    """Write an error and its full traceback to the log file(s) only, not the console; return whether a file got it."""
    record = logging.LogRecord(logger, logging.ERROR, __file__, 0, message, None, (type(exc), exc, exc.__traceback__))
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    for handler in files:
        handler.handle(record)
    return bool(files)


def _console(handler: logging.Handler, verbose: bool, level: int = logging.WARNING) -> None:
    """Make a console handler name the Prefect run of each record, at WARNING (DEBUG when verbose: INFO on the console
    only when asked for; the log file keeps it), with tracebacks only when verbose."""
    if isinstance(handler, logging.FileHandler):
        return
    handler.addFilter(RunNameFilter())
    handler.setLevel(logging.DEBUG if verbose else level)
    if handler.formatter is None:
        handler.setFormatter(run_formatter())
    if not verbose and not isinstance(handler.formatter, OneLine):
        handler.setFormatter(OneLine(handler.formatter, expected_only=False))
