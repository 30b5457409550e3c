"""Log lines name the Prefect run they come from (the memory benchmark attributes RSS to task runs by it)."""

from __future__ import annotations

import logging

from nightscore.runtime import RunNameFilter

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
