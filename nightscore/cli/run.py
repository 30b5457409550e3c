"""`nightscore run nightly` and `nightscore run train-ranker`: a flow run in this process, its summary printed."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from core.collector import imports_held
from core.errors import NightscoreError, RunInterrupted, UsageError
from core.logs import said_once_on_console
from core.run_context import parse_run_date, run_inputs
from core.settings import Settings, settings_scope
from core.stop import install_signal_handlers
from nightscore.cli.app import INVOCATION, HomeOption, command_settings

if TYPE_CHECKING:
    from core.records import Published

# The commands import the rest in their bodies: every command line imports this module to build the parser.

log = logging.getLogger("nightscore")


def run_nightly(
    items: str | None = typer.Option(None, "--items", help="Items Parquet URI (default: NIGHTSCORE_ITEMS_URI)."),
    interactions: str | None = typer.Option(None, "--interactions", help="Interactions Parquet URI."),
    demo: bool = typer.Option(False, "--demo", help="Score the demo data (written to <lake>/inputs/demo/ once)."),
    run_date: str | None = typer.Option(None, "--run-date", help="YYYY-MM-DD (default: today, UTC)."),
    resume: str | None = typer.Option(
        None, "--resume", help="RUN_ID of an unfinished run to resume. Default: the unfinished run of the same date and inputs."
    ),
    home: Path | None = HomeOption,
) -> None:
    """Run the nightly scoring flow once, now, and print its summary (SIGTERM stops it gracefully)."""
    from flows.params import NightlyParams
    from nightscore.demo import ensure_demo_inputs
    from nightscore.output import next_steps, progress_bar, summary_text
    from storage.resources import lake_for
    from tasks.local_server import api_scope, start_local_server

    parse_run_date(run_date, date.today())  # bad dates are usage errors before anything starts
    if demo and (items or interactions):
        raise UsageError("--demo scores the demo data: give it without --items/--interactions")
    params = NightlyParams(run_date=run_date, items_uri=items, interactions_uri=interactions, resume=resume)
    cfg = command_settings(home, "run-nightly")
    if demo:
        items_uri, interactions_uri = ensure_demo_inputs(lake_for(cfg))
        params = params.model_copy(update={"items_uri": items_uri, "interactions_uri": interactions_uri})
    elif not resume:
        run_inputs(cfg, items, interactions)  # no inputs anywhere: refused before Prefect starts
    server = start_local_server()  # without PREFECT_API_URL its process starts while the flow imports
    with imports_held():
        from flows.nightly import nightly  # imported here for start-up speed: Prefect loads in seconds

    api = server.result()
    install_signal_handlers()
    with api_scope(api), interruptible(), settings_scope(cfg), progress_bar(), said_once_on_console(INVOCATION.verbose):
        published = nightly(params)
    typer.echo(summary_text(published, time.monotonic() - INVOCATION.started, **run_notes(cfg, published)))
    typer.echo(next_steps(home))


def run_notes(cfg: Settings, published: Published) -> dict[str, Any]:
    """Return what the summary adds from the warehouse: quarantine per rule, and the latest run when this one is not it."""
    from storage.resources import warehouse_for

    warehouse = warehouse_for(cfg)
    try:
        rules = warehouse.quarantine_by_rule(published.run_id)
        latest = warehouse.latest_published()
    except NightscoreError as exc:  # the run is published; a busy warehouse only shortens its summary
        log.warning("summary without the warehouse's notes: %s", exc)
        return {}
    return {"quarantine": rules, "latest_run": latest.run_id if latest else None, "max_tokens": cfg.encoder.max_seq_length}


@contextmanager
def interruptible() -> Iterator[None]:
    """Turn Prefect's TerminationSignal (how it stops a flow's thread on SIGTERM) into RunInterrupted (exit 143)."""
    from prefect.exceptions import TerminationSignal  # imported here for start-up speed

    try:
        yield
    except TerminationSignal as exc:
        from tasks.start import last_started  # imported here for start-up speed (it loads Prefect)

        run_id = last_started()
        how = f"run the same command again (or --resume {run_id})" if run_id else "run the same command again"
        raise RunInterrupted(
            f"run {run_id or '(not started yet)'} interrupted by SIGTERM: finished shards are kept; {how} to finish it"
        ) from exc


def run_train_ranker(
    run_id: str | None = typer.Option(None, "--run-id", help="Published run to train on (default: the latest)."),
    home: Path | None = HomeOption,
) -> None:
    """Train the online ranker on a published run and print its offline metrics."""
    from flows.params import TrainRankerParams
    from nightscore.output import trained_summary
    from tasks.local_server import api_scope, start_local_server

    cfg = command_settings(home, "run-train-ranker")
    server = start_local_server()  # without PREFECT_API_URL its process starts while the flow imports
    with imports_held():
        from flows.train_ranker import train_ranker  # imported here for start-up speed: Prefect loads in seconds

    with api_scope(server.result()), settings_scope(cfg), said_once_on_console(INVOCATION.verbose):
        trained = train_ranker(TrainRankerParams(run_id=run_id))
    typer.echo(trained_summary(trained))
