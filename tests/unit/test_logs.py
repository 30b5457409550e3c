"""Log lines name the Prefect run they come from; failures render as one line where tracebacks are not wanted."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prefect.states import Failed

from core.errors import ContractViolation, InputUnreadable, NightscoreError, RunInterrupted, UsageError, exit_code_for
from core.logs import IN_SUMMARY, OneLine, RunNameFilter, configure_logging, repeats, run_formatter, said_once_on_console

FORMAT = "%(name)s%(run)s: %(message)s"


def formatted(**extra: str) -> str:
    """Return one record with extra attributes, formatted as configure_logging formats it."""
    record = logging.LogRecord("prefect.task_runs", logging.INFO, __file__, 1, "Finished in state Completed()", None, None)
    record.__dict__.update(extra)
    RunNameFilter().filter(record)
    return logging.Formatter(FORMAT).format(record)


def test_task_run_name_is_in_the_line() -> None:
    line = formatted(task_run_name="encode-shard-3", flow_run_name="brave-fox")
    assert line == "prefect.task_runs [encode-shard-3]: Finished in state Completed()"


def test_flow_run_name_when_no_task() -> None:
    assert formatted(flow_run_name="brave-fox") == "prefect.task_runs [brave-fox]: Finished in state Completed()"


def test_plain_records_are_unchanged() -> None:
    assert formatted() == "prefect.task_runs: Finished in state Completed()"


def failure_record(exc: BaseException) -> logging.LogRecord:
    """Return the record Prefect's engine logs for a failed task: its message with the exception's traceback."""
    try:
        raise exc
    except BaseException:  # noqa: BLE001 - the record must carry whatever was raised
        info = sys.exc_info()
    return logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, "Task run failed with exception: %r", (exc,), info)


@pytest.mark.parametrize("expected_only", [True, False])
def test_expected_failures_render_without_their_traceback(expected_only: bool) -> None:
    record = failure_record(ContractViolation("items: 40 of 200 rows quarantined"))
    text = OneLine(logging.Formatter("%(message)s"), expected_only).format(record)
    assert "Traceback" not in text and "40 of 200 rows quarantined" in text
    assert record.exc_info is not None  # the record is untouched: the log file still gets the traceback
    assert "Traceback" in logging.Formatter("%(message)s").format(record)


def test_unexpected_failures_keep_their_traceback_where_only_expected_ones_lose_it() -> None:
    record = failure_record(KeyError("boom"))
    assert "Traceback" in OneLine(logging.Formatter("%(message)s"), expected_only=True).format(record)
    assert "Traceback" not in OneLine(logging.Formatter("%(message)s"), expected_only=False).format(record)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ContractViolation("x"), 3),
        (InputUnreadable("x"), 3),
        (UsageError("x"), 2),
        (RunInterrupted("x"), 143),
        (KeyboardInterrupt(), 130),
        (NightscoreError("x"), 1),
        (KeyError("x"), 1),
    ],
)
def test_one_table_maps_errors_to_exit_codes(exc: BaseException, code: int) -> None:
    assert exit_code_for(exc) == code


def test_a_handler_without_formatter_or_run_filter_still_formats() -> None:
    # Prefect's API log handler has no formatter and no RunNameFilter: wrapping it once raised KeyError('run')
    # inside Prefect's emit, which printed a "--- Logging error ---" traceback on stderr.
    record = logging.LogRecord("prefect.flow_runs", logging.INFO, __file__, 1, "Finished in state %s", ("Failed()",), None)
    assert OneLine(None, expected_only=True).format(record) == "Finished in state Failed()"
    assert run_formatter().format(record).endswith("prefect.flow_runs: Finished in state Failed()")


@contextmanager
def root_logging(verbose: bool, log_file: Path) -> Iterator[io.StringIO]:
    """Yield the console of a root logger configured as a command configures it (log_file its log file); restore after."""
    root = logging.getLogger()
    saved, console = (root.handlers[:], root.level), io.StringIO()
    root.handlers = [logging.StreamHandler(console)]
    try:
        configure_logging(verbose, log_file)
        yield console
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers, root.level = saved


@pytest.mark.parametrize("verbose", [False, True])
def test_a_warning_the_summary_repeats_stays_off_the_console_unless_verbose(tmp_path: Path, verbose: bool) -> None:
    log_file, log = tmp_path / "run.log", logging.getLogger("nightscore.test-summary")
    with root_logging(verbose, log_file) as console:
        with said_once_on_console(verbose):
            log.warning("12 of the run's 300 texts are truncated", extra=IN_SUMMARY)
            log.warning("a warning the summary does not repeat")
        log.warning("a later repeat-marked warning", extra=IN_SUMMARY)  # outside the run: nothing repeats it
    shown, kept = console.getvalue(), log_file.read_text()
    assert ("truncated" in shown) is verbose and "does not repeat" in shown and "a later" in shown
    assert "12 of the run's 300 texts are truncated" in kept and "does not repeat" in kept


def run_error(message: str, exc: BaseException | None = None) -> None:
    """Log an ERROR as Prefect's task-run logger does, straight to the root's handlers (never to Prefect's API)."""
    exc_info = (type(exc), exc, None) if exc else None
    logging.getLogger().handle(logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, message, None, exc_info))


NO_RUN = "no published run to train the ranker on: run the nightly flow first"


@pytest.mark.parametrize(
    ("failure", "verbose", "said_once"),
    [
        (UsageError(NO_RUN), False, True),
        (ContractViolation("items file it's.parquet: missing required column(s) item_id"), False, True),
        (RuntimeError(NO_RUN), False, False),  # unexpected: Prefect's lines, which name the task, stay
        (UsageError(NO_RUN), True, False),  # verbose: everything, as it comes
    ],
)
def test_a_runs_errors_that_repeat_its_expected_failure_stay_off_the_console(
    tmp_path: Path, failure: Exception, verbose: bool, said_once: bool
) -> None:
    """The command's last line says an expected failure once; the log file keeps Prefect's three lines of it."""
    log_file, name = tmp_path / "run.log", type(failure).__name__
    with root_logging(verbose, log_file) as console:
        with pytest.raises(type(failure)), said_once_on_console(verbose):
            run_error("an upload failed: ConnectionError('reset by peer')")  # an error the failure does not repeat
            run_error(f"Task run failed with exception: {failure!r}", failure)
            run_error(f"Finished in state {Failed(message=f'Task run encountered an exception {name}: {failure}')}")
            run_error(f"Encountered exception during execution: {failure!r}", failure)
            assert console.getvalue().count("ERROR") == (4 if verbose else 0)  # held while the run runs
            raise failure
        shown = console.getvalue()
    assert run_errors(shown, name) == (0 if said_once else 3) and run_errors(shown, "reset by peer") == 1, shown
    assert run_errors(log_file.read_text(), name) == 3


def run_errors(text: str, about: str) -> int:
    """Return how many ERROR lines of the task-run logger in text mention about."""
    return sum(" ERROR prefect.task_runs: " in line and about in line for line in text.splitlines())


def test_a_runs_error_is_shown_when_the_run_ends_and_at_once_after_it(tmp_path: Path) -> None:
    with root_logging(False, tmp_path / "run.log") as console:
        with said_once_on_console(False):
            run_error("an upload failed: ConnectionError('reset by peer')", ConnectionError("reset by peer"))
            assert console.getvalue() == ""
        assert "reset by peer" in console.getvalue()
        run_error(f"Encountered exception during execution: {UsageError(NO_RUN)!r}", UsageError(NO_RUN))
        assert NO_RUN in console.getvalue()


def test_a_record_whose_arguments_do_not_format_repeats_nothing() -> None:
    record = logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, "UsageError: %d of %d", ("x",), None)
    assert not repeats(record, UsageError("x"))
    assert repeats(
        logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, "UsageError(%r)", ("x",), None), UsageError("x")
    )
