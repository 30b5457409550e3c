"""The nightscore command line's shared parts: the typer apps, the --home option, settings and logging per command.

No command logic lives here or in the command modules beside it: each command parses its options, calls one
function of a lower floor, and prints what it returned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import typer

from core.environment import apply_runtime_defaults
from core.errors import UsageError
from core.logs import configure_logging, log_file_path
from core.settings import Settings, load_settings


@dataclass
class Invocation:
    """What this command line asked for beyond its arguments: verbosity, and the log file once one is set up."""

    verbose: bool = False
    log_file: Path | None = None
    started: float = field(default_factory=time.monotonic)

    def reset(self) -> None:
        """Start a new command line (tests run many in one process): fresh verbosity, log file and clock."""
        self.verbose, self.log_file, self.started = False, None, time.monotonic()


INVOCATION = Invocation()


class OutputFormat(StrEnum):
    """Output formats of `nightscore query`."""

    table = "table"
    csv = "csv"
    json = "json"


HomeOption = typer.Option(None, "--home", help="Folder of the embedded defaults (NIGHTSCORE_HOME, default ./.nightscore).")


def command_settings(home: Path | None, command: str = "command") -> Settings:
    """Return settings with --home applied (handed to flows with settings_scope, never through the environment).

    Also sets the libraries' process switches and the logging: the console gets one line per failure, the
    command's log file (<home>/logs/<time>-<command>.log, created on first record) everything.
    """
    if home is not None and home.exists() and not home.is_dir():
        raise UsageError(f"--home {home} is a file: give the folder of the embedded defaults (made on the first run)")
    cfg = load_settings(home=home.resolve() if home is not None else None)
    apply_runtime_defaults(cfg)
    INVOCATION.log_file = log_file_path(cfg.logs_dir, command)
    configure_logging(INVOCATION.verbose, INVOCATION.log_file)
    return cfg
