"""Named failures of nightscore and the one table that maps them to CLI exit codes.

HTTP statuses of the online ranker are mapped in one function too: `serving.errors.status_for`.
"""

from __future__ import annotations


class NightscoreError(Exception):
    """Base of every failure nightscore reports to a user as one line (never a bare traceback)."""


class UsageError(NightscoreError):
    """Bad arguments or settings, or nothing to act on yet (exit 2)."""


class ContractViolation(NightscoreError):
    """A data contract failed: bad inputs or outputs; nothing is published (exit 3)."""


class InputUnreadable(ContractViolation):
    """An input file is missing, corrupt, empty or lacks required columns (exit 3)."""


class LakeUnavailable(NightscoreError, ConnectionError):
    """The lake's storage could not be reached (connection reset, refused, timeout) after retries (exit 1).

    A ConnectionError too, so the retry rule of I/O tasks (tasks/retries.py) treats it as transient.
    """


class ModelLoadError(NightscoreError):
    """The encoder's or the ranker's files could not be found or loaded (exit 1)."""


class PublishError(NightscoreError):
    """The warehouse or the cache refused a publication; the previous one stays current (exit 1)."""


class WarehouseMissing(UsageError):
    """No warehouse exists yet at the configured location: nothing has run there (exit 2)."""


class WarehouseBusy(PublishError):
    """Another process held the warehouse's lock for longer than the bounded wait (exit 1): try again later.

    Reads and writes alike (a write that meets it publishes nothing, hence a PublishError too); never
    WarehouseMissing, so a locked warehouse is not taken for "no warehouse yet".
    """


class RunBusy(NightscoreError):
    """Another live attempt holds the run date's lease beyond the bounded wait (exit 1); the message names it."""


class QueryRefused(UsageError):
    """An analyst's SQL is not one read-only statement over the warehouse's tables and views, or it failed (exit 2)."""


class QueryTimeout(QueryRefused):
    """An analyst's statement ran past the query timeout (NIGHTSCORE_QUERY_TIMEOUT_S) and was stopped (exit 2)."""


class CacheUnavailable(NightscoreError):
    """The cache server could not be reached (exit 1; HTTP 503 in serving)."""


class StackError(NightscoreError):
    """`nightscore up`/`down` could not start or reach the Prefect server or worker, or a run its temporary server
    (exit 1)."""


class RunFailed(NightscoreError):
    """A triggered flow run ended in a state other than Completed (exit 1)."""


class RunInterrupted(NightscoreError):
    """The run was asked to stop (SIGTERM, cancellation); finished shards are kept for a resume (exit 143)."""


EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_CONTRACT = 3
EXIT_INTERRUPTED = 143
EXIT_KEYBOARD = 130

# The one table of exit codes: the first entry an exception is an instance of wins (subclasses first).
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (ContractViolation, EXIT_CONTRACT),
    (UsageError, EXIT_USAGE),
    (RunInterrupted, EXIT_INTERRUPTED),
    (KeyboardInterrupt, EXIT_KEYBOARD),
    (NightscoreError, EXIT_FAILURE),
)

# Failures a user can act on from their one-line message; anything else is a bug or an outage and its
# traceback goes to the log file.
EXPECTED: tuple[type[BaseException], ...] = (ContractViolation, UsageError, RunInterrupted, KeyboardInterrupt)


def exit_code_for(exc: BaseException) -> int:
    """Return the CLI exit code of an exception (EXIT_CODES; 1 for anything not listed)."""
    return next((code for kind, code in EXIT_CODES if isinstance(exc, kind)), EXIT_FAILURE)


def is_expected(exc: BaseException) -> bool:
    """Return whether a failure is one a user fixes from its message (no traceback is shown for it)."""
    return isinstance(exc, EXPECTED)
