"""Log lines name the Prefect run they come from; failures render as one line where tracebacks are not wanted."""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path

import pytest

from core.errors import ContractViolation, InputUnreadable, NightscoreError, RunInterrupted, UsageError, exit_code_for
from core.logs import IN_SUMMARY, OneLine, RunNameFilter, configure_logging, run_formatter, summary_repeats_off_console

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


@pytest.mark.parametrize("verbose", [False, True])
def test_a_warning_the_summary_repeats_stays_off_the_console_unless_verbose(tmp_path: Path, verbose: bool) -> None:
    root = logging.getLogger()
    saved, console = (root.handlers[:], root.level), io.StringIO()
    root.handlers = [logging.StreamHandler(console)]
    log_file, log = tmp_path / "run.log", logging.getLogger("nightscore.test-summary")
    try:
        configure_logging(verbose, log_file)
        with summary_repeats_off_console(verbose):
            log.warning("12 of the run's 300 texts are truncated", extra=IN_SUMMARY)
            log.warning("a warning the summary does not repeat")
        log.warning("a later repeat-marked warning", extra=IN_SUMMARY)  # outside the run: nothing repeats it
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers, root.level = saved
    shown, kept = console.getvalue(), log_file.read_text()
    assert ("truncated" in shown) is verbose and "does not repeat" in shown and "a later" in shown
    assert "12 of the run's 300 texts are truncated" in kept and "does not repeat" in kept
