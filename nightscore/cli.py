"""The nightscore command line: demo-data, run nightly, query, runs. Exit codes: 0, 1, 2 (usage), 3 (contract)."""

from __future__ import annotations

import logging
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import click
import pydantic
import typer

from nightscore.errors import EXIT_USAGE, NightscoreError, RunInterrupted, UsageError, exit_code_for
from nightscore.settings import Settings, load_settings

log = logging.getLogger("nightscore")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Nightly and on-demand batch scoring.")
run_app = typer.Typer(no_args_is_help=True, help="Run a scoring flow.")
app.add_typer(run_app, name="run")

class OutputFormat(str, Enum):
    """Output formats of `nightscore query`."""

    table = "table"
    csv = "csv"
    json = "json"


HomeOption = typer.Option(None, "--home", help="Folder of the embedded defaults (NIGHTSCORE_HOME, default ./.nightscore).")


def _settings(home: Optional[Path]) -> Settings:
    """Return settings with --home applied; the home is also exported so the flow's tasks see it."""
    if home is not None:
        os.environ["NIGHTSCORE_HOME"] = str(home.resolve())
    from nightscore.runtime import configure_logging, configure_runtime

    cfg = load_settings()
    configure_runtime(cfg)
    configure_logging()
    return cfg


@app.command("demo-data")
def demo_data(
    out: Path = typer.Option(..., "--out", help="Folder to write items.parquet and interactions.parquet to."),
    items: int = typer.Option(2000, "--items", min=1), users: int = typer.Option(500, "--users", min=1),
    seed: int = typer.Option(0, "--seed"), home: Optional[Path] = HomeOption,
) -> None:
    """Write the deterministic demo inputs (items with text, user interactions) to a folder."""
    _settings(home)
    from nightscore.demo_data import generate_demo_data
    from storage.lake import Lake

    lake = Lake(str(out))
    item_frame, interactions = generate_demo_data(items, users, seed)
    lake.write_parquet(item_frame, lake.uri("items.parquet"))
    lake.write_parquet(interactions, lake.uri("interactions.parquet"))
    typer.echo(f"wrote {item_frame.height} items and {interactions.height} interactions to {out}")


@run_app.command("nightly")
def run_nightly(
    items: Optional[str] = typer.Option(None, "--items", help="Items Parquet URI (default: demo data in the lake)."),
    interactions: Optional[str] = typer.Option(None, "--interactions", help="Interactions Parquet URI."),
    run_date: Optional[str] = typer.Option(None, "--run-date", help="YYYY-MM-DD (default: today, UTC)."),
    resume: Optional[str] = typer.Option(
        None, "--resume", help="RUN_ID of an unfinished run to resume. Default: the unfinished run of the same date and inputs."),
    home: Optional[Path] = HomeOption,
) -> None:
    """Run the nightly scoring flow once, now, and print its summary (SIGTERM stops it gracefully)."""
    from nightscore.run_context import parse_run_date
    from datetime import date

    parse_run_date(run_date, date.today())  # bad dates are usage errors before anything starts
    _settings(home)
    from flows.nightly import nightly
    from flows.params import NightlyParams
    from nightscore.output import progress_bar, summary_text
    from nightscore.stop import install_signal_handlers

    from prefect.exceptions import TerminationSignal

    install_signal_handlers()
    params = NightlyParams(run_date=run_date, items_uri=items, interactions_uri=interactions, resume=resume)
    try:
        with progress_bar():
            summary = nightly(params)
    except TerminationSignal as exc:  # Prefect turns SIGTERM into this in the flow's thread
        raise RunInterrupted(
            "run interrupted by SIGTERM: finished shards are kept; run the same command again (or --resume RUN_ID) to finish it"
        ) from exc
    typer.echo(summary_text(summary))


@run_app.command("train-ranker")
def run_train_ranker(
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Published run to train on (default: the latest)."),
    home: Optional[Path] = HomeOption,
) -> None:
    """Train the online ranker on a published run and print its offline metrics."""
    _settings(home)
    from flows.params import TrainRankerParams
    from flows.train_ranker import train_ranker

    result = train_ranker(TrainRankerParams(run_id=run_id))
    metrics = ", ".join(f"{k} {v:.3f}" for k, v in sorted(result["metrics"].items()) if isinstance(v, float))
    typer.echo(f"ranker {result['version']} saved to {result['path']}\n  {metrics}")


@app.command("serve")
def serve(
    port: int = typer.Option(8000, "--port", min=1, max=65535), host: str = typer.Option("127.0.0.1", "--host"),
    home: Optional[Path] = HomeOption,
) -> None:
    """Serve GET /v1/users/{user_id}/recommendations from the cache with the trained ranker."""
    cfg = _settings(home)
    from nightscore.stages.ranking import ITEM_FILE, MODEL_FILE, USER_FILE
    from serving.app import run_server
    from serving.config import serving_config

    root = cfg.serving_root
    config = serving_config(cfg, root / MODEL_FILE, root / ITEM_FILE, root / USER_FILE,
                            max_in_flight=cfg.serving_max_in_flight, fallback_on_cache_error=cfg.serving_fallback)
    run_server(config, host=host, port=port)


@app.command("query")
def query(
    sql: str = typer.Argument(..., help="Read-only SQL over the warehouse tables and views."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table, csv or json (an array of row objects)."),
    home: Optional[Path] = HomeOption,
) -> None:
    """Run read-only SQL on the warehouse and print the result."""
    cfg = _settings(home)
    from nightscore.output import render
    from storage.resources import warehouse_for

    typer.echo(render(warehouse_for(cfg).query(sql), fmt.value))


@app.command("runs")
def runs(limit: int = typer.Option(20, "--limit", min=1), home: Optional[Path] = HomeOption) -> None:
    """List recent runs with their status and counts."""
    cfg = _settings(home)
    from nightscore.output import render
    from storage.resources import warehouse_for

    sql = ("SELECT run_id, run_date, status, rows_in, rows_quarantined, rows_scored, rows_reused, rows_computed, "
           "users_with_candidates, round(wall_seconds, 1) AS wall_s, message FROM scoring_runs ORDER BY started_at DESC LIMIT ?")
    typer.echo(render(warehouse_for(cfg).query(sql, [limit]), "table"))


contracts_app = typer.Typer(no_args_is_help=True, help="Data contracts of the inputs.")
app.add_typer(contracts_app, name="contracts")


@contracts_app.command("check")
def contracts_check(
    items: str = typer.Option(..., "--items", help="Items Parquet URI."),
    interactions: str = typer.Option(..., "--interactions", help="Interactions Parquet URI."),
    home: Optional[Path] = HomeOption,
) -> None:
    """Validate input files against the contracts without scoring; exit 3 when a run would refuse them."""
    cfg = _settings(home)
    from nightscore.stages.check import check_inputs, check_report
    from storage.resources import lake_for

    check = check_inputs(lake_for(cfg), cfg, items, interactions)
    typer.echo(check_report(check, cfg.quarantine_max_share))
    if not check.passed(cfg.quarantine_max_share):
        raise typer.Exit(3)


cache_app = typer.Typer(no_args_is_help=True, help="Inspect or move the published candidate cache.")
app.add_typer(cache_app, name="cache")


@cache_app.command("rollback")
def cache_rollback(home: Optional[Path] = HomeOption) -> None:
    """Point the cache and the warehouse's latest_* views back to the previous published run, together."""
    cfg = _settings(home)
    from nightscore.stages.publish import rollback
    from storage.resources import cache_for, warehouse_for

    with cache_for(cfg) as cache:
        rolled_back, latest = rollback(warehouse_for(cfg), cache)
    typer.echo(f"rolled back {rolled_back}; latest is now {latest} (warehouse views and cache pointer)")


@app.command("prune")
def prune(
    keep_runs: Optional[int] = typer.Option(None, "--keep-runs", min=1, help="Keep the rows of the newest N published runs."),
    keep_days: Optional[int] = typer.Option(None, "--keep-days", min=0, help="Keep the rows of runs dated within N days."),
    home: Optional[Path] = HomeOption,
) -> None:
    """Delete the rows of old runs from the warehouse (never the latest published run)."""
    cfg = _settings(home)
    from storage.resources import warehouse_for

    typer.echo(f"pruned {warehouse_for(cfg).prune(keep_runs, keep_days)} run(s)")


@app.command("up")
def up(host: str = typer.Option("127.0.0.1", "--host", help="Address the Prefect server listens on."),
       home: Optional[Path] = HomeOption) -> None:
    """Start a Prefect server (port NIGHTSCORE_PREFECT_PORT, default 4200), the deployments and a worker; print the UI URL."""
    cfg = _settings(home)
    from deployments.stack import up as start

    state = start(cfg, host)
    typer.echo(f"nightscore is up: Prefect UI {state['ui_url']}  (API {state['api_url']})\n"
               f"  deployments: {', '.join(state['deployments'])}; worker pool {cfg.work_pool}; logs in {state['home']}/logs\n"
               f"  export PREFECT_API_URL={state['api_url']}   # for prefect commands and nightscore trigger/status")


@app.command("down")
def down(home: Optional[Path] = HomeOption) -> None:
    """Stop the worker and the Prefect server that `nightscore up` started."""
    cfg = _settings(home)
    from deployments.stack import down as stop

    stopped = stop(cfg)
    typer.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was up")


@app.command("deploy")
def deploy(home: Optional[Path] = HomeOption) -> None:
    """Register the work pool, queues, gpu limit and deployments with the server at PREFECT_API_URL."""
    cfg = _settings(home)
    _api_url(cfg)
    from deployments.deploy import deploy_all

    for name, deployment_id in deploy_all(cfg).items():
        typer.echo(f"{name}: {deployment_id}")


def _api_url(cfg: Settings) -> str:
    """Return the Prefect API to talk to: PREFECT_API_URL, else the one `nightscore up` started (exported for Prefect)."""
    from deployments.stack import read_state

    url = os.environ.get("PREFECT_API_URL") or (read_state(cfg) or {}).get("api_url")
    if not url:
        raise UsageError("no Prefect server: run `nightscore up` or set PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    return url


trigger_app = typer.Typer(no_args_is_help=True, help="Start a deployment's run through the Prefect API.")
app.add_typer(trigger_app, name="trigger")


@trigger_app.command("on-demand")
def trigger_on_demand(
    items: Optional[str] = typer.Option(None, "--items", help="Items Parquet URI (default: the latest published run's)."),
    interactions: Optional[str] = typer.Option(None, "--interactions", help="Interactions Parquet URI."),
    item_ids: Optional[list[str]] = typer.Option(None, "--item-id", help="Score only this item id (repeatable)."),
    run_date: Optional[str] = typer.Option(None, "--run-date", help="YYYY-MM-DD (default: today, UTC)."),
    callback_url: Optional[str] = typer.Option(None, "--callback-url", help="URL the run POSTs its result to."),
    key: Optional[str] = typer.Option(None, "--idempotency-key", help="Same key = same run (default: parameters + today's date)."),
    wait: bool = typer.Option(False, "--wait", help="Wait for the run to finish; exit 1 unless it completed."),
    timeout: float = typer.Option(3600, "--timeout", help="Seconds --wait waits."),
    home: Optional[Path] = HomeOption,
) -> None:
    """Trigger the on-demand deployment; print the flow run id (and its final state with --wait)."""
    cfg = _settings(home)
    _api_url(cfg)
    from deployments.trigger import default_idempotency_key, trigger, wait_for_run
    from flows.params import OnDemandParams

    params = OnDemandParams(items_uri=items, interactions_uri=interactions, item_ids=item_ids or None,
                            run_date=run_date, callback_url=callback_url)
    created = trigger("on-demand", params, key or default_idempotency_key("on-demand", params))
    typer.echo(created["flow_run_id"])
    log.info("flow run %s (%s), idempotency key %s", created["flow_run_id"], created["name"], created["idempotency_key"])
    if wait:
        state = wait_for_run(created["flow_run_id"], timeout)
        typer.echo(f"{state['state_name']}")


@app.command("status")
def status(flow_run_id: str = typer.Argument(..., help="Flow run id printed by `nightscore trigger`."),
           home: Optional[Path] = HomeOption) -> None:
    """Print a flow run's state (from the Prefect API) and its counts (from the warehouse)."""
    cfg = _settings(home)
    _api_url(cfg)
    from deployments.trigger import flow_run_state, run_counts
    from storage.resources import warehouse_for

    state = flow_run_state(flow_run_id)
    typer.echo(f"{state['name']}: {state['state_name']}" + (f" ({state['message']})" if state["message"] else ""))
    try:
        counts = run_counts(warehouse_for(cfg), flow_run_id)
    except NightscoreError:
        counts = None
    for name, value in (counts or {}).items():
        typer.echo(f"  {name}: {value}")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code; failures print one line, never a bare traceback."""
    try:
        result = app(args=argv, standalone_mode=False)
        return int(result) if isinstance(result, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.UsageError as exc:
        exc.show()
        return EXIT_USAGE
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'parameters'}: {e['msg']}" for e in exc.errors())
        typer.echo(f"nightscore: error: invalid parameters: {problems}", err=True)
        return EXIT_USAGE
    except click.Abort:
        typer.echo("nightscore: aborted", err=True)
        return 130
    except NightscoreError as exc:
        typer.echo(f"nightscore: error: {exc}", err=True)
        return exit_code_for(exc)
    except Exception as exc:  # noqa: BLE001 - the one place unexpected errors become exit 1
        log.debug("unexpected error", exc_info=True)
        typer.echo(f"nightscore: unexpected error: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", err=True)
        return exit_code_for(exc)


def entrypoint() -> None:
    """Console-script entry point."""
    sys.exit(main())
