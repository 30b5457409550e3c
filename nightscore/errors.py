"""Named failures of a nightscore run, and the one place that maps them to CLI exit codes."""

from __future__ import annotations


class NightscoreError(Exception):
    """Base of every failure nightscore reports to a user (never a bare traceback)."""

    exit_code: int = 1


class UsageError(NightscoreError):
    """Bad arguments or settings (exit 2)."""

    exit_code = 2


class ContractViolation(NightscoreError):
    """A data contract failed: bad inputs or outputs; nothing is published (exit 3)."""

    exit_code = 3


class InputUnreadable(ContractViolation):
    """An input file is missing, corrupt, empty or lacks required columns (exit 3)."""


class ModelLoadError(NightscoreError):
    """The encoder's files could not be found or loaded (exit 1)."""


class PublishError(NightscoreError):
    """The warehouse or the cache refused a publication; the previous one stays current (exit 1)."""


class CacheUnavailable(NightscoreError):
    """The cache server could not be reached (exit 1; HTTP 503 in serving)."""


class StackError(NightscoreError):
    """`nightscore up`/`down` could not start or reach the Prefect server or worker (exit 1)."""

    exit_code = 1


class RunFailed(NightscoreError):
    """A triggered flow run ended in a state other than Completed (exit 1)."""

    exit_code = 1


class RunInterrupted(NightscoreError):
    """The run was asked to stop (SIGTERM, cancellation); finished shards are kept for a resume (exit 143)."""

    exit_code = 143


EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_CONTRACT = 3


def exit_code_for(exc: BaseException) -> int:
    """Return the CLI exit code for an exception raised by a run or a command."""
    if isinstance(exc, NightscoreError):
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return 130
    return EXIT_FAILURE
