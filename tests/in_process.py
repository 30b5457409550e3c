"""The `nightscore` command line run inside the test process, for the runs whose test is not about the process.

A console-script run pays a new interpreter's imports (Prefect, torch, Great Expectations, matplotlib: about 5 s
on a 2-core Xeon, 6-11 s on slower hosts) before its flow starts; the same `main(argv)` called here pays them once
per worker. What a child process would not share with this one is set up and undone around the call: the
NIGHTSCORE_ variables, the signal handlers and stop flag, and the root logger's handlers that each command configures.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import TextIO

from core import stop
from core.logs import RUN_LOGGERS


def cli_in_process(argv: list[str], env: dict[str, str], log: Path) -> int:
    """Return the exit code of `nightscore ARGV` run in this process with env's variables, its output appended to log.

    PREFECT_API_URL is this process's own (the worker's Prefect server): Prefect read its settings at import.
    """
    with open(log, "a") as out:
        return _main(argv, env, out, out)


def cli_captured(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Return `nightscore ARGV` run in this process as subprocess.run would: the exit code, stdout and stderr apart.

    PREFECT_API_URL is this process's own, as for cli_in_process.
    """
    out, err = io.StringIO(), io.StringIO()
    code = _main(argv, env, out, err)
    return subprocess.CompletedProcess(["nightscore", *argv], code, out.getvalue(), err.getvalue())


def _main(argv: list[str], env: dict[str, str], out: TextIO, err: TextIO) -> int:
    """Return the exit code of the CLI's main(argv) run with a child's environment, signals and logging, out and err
    in place of stdout and stderr."""
    from nightscore.cli.entry import main

    with _child_environment(env), _signals(), _logging(), redirect_stdout(out), redirect_stderr(err):
        return main(argv)


@contextmanager
def _child_environment(env: dict[str, str]) -> Iterator[None]:
    """Give the process a child's environment (only env's NIGHTSCORE_ variables); restore the old one after."""
    saved = dict(os.environ)
    try:
        for name in [name for name in os.environ if name.startswith("NIGHTSCORE_")]:
            del os.environ[name]
        os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def _signals() -> Iterator[None]:
    """Restore SIGTERM's and SIGINT's handlers and clear the stop flag after the command (it installs its own)."""
    saved = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)
        stop.reset()


@contextmanager
def _logging() -> Iterator[None]:
    """Restore the root logger (level, handlers and their levels, formatters and filters) and the run loggers'
    formatters after the command configured them for itself."""
    root = logging.getLogger()
    handlers = [(h, h.level, h.formatter, list(h.filters)) for h in root.handlers]
    run_formatters = [(h, h.formatter) for name in RUN_LOGGERS for h in logging.getLogger(name).handlers]
    level = root.level
    try:
        yield
    finally:
        for added in [h for h in root.handlers if h not in {saved for saved, *_ in handlers}]:
            root.removeHandler(added)
            added.close()
        for handler, handler_level, formatter, filters in handlers:
            root.addHandler(handler)  # a no-op unless the command removed it
            handler.setLevel(handler_level)
            handler.setFormatter(formatter)
            handler.filters[:] = filters
        for handler, formatter in run_formatters:
            handler.setFormatter(formatter)
        root.setLevel(level)
