"""The nightscore command line: demo-data, run nightly, query, runs. Exit codes: 0, 1, 2 (usage), 3 (contract)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import pydantic
import typer

from core.environment import apply_runtime_defaults
from core.errors import (
    EXIT_USAGE,
    ContractViolation,
    NightscoreError,
    RunInterrupted,
    StackError,
    UsageError,
    WarehouseMissing,
    exit_code_for,
    is_expected,
)
from core.settings import Settings, load_settings

if TYPE_CHECKING:
    from core.records import Published
    from flows.params import OnDemandParams

log = logging.getLogger("nightscore")


@dataclass
class Invocation:
    """What this command line asked for beyond its arguments: verbosity, and the log file once one is set up."""

    verbose: bool = False
    log_file: Path | None = None
    started: float = field(default_factory=time.monotonic)


INVOCATION = Invocation()

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help="Nightly and on-demand batch scoring."
)


@app.callback()
def _options(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at DEBUG and show tracebacks.")) -> None:
    """Nightly and on-demand batch scoring."""
    INVOCATION.verbose = verbose


run_app = typer.Typer(no_args_is_help=True, help="Run a scoring flow.")
app.add_typer(run_app, name="run")


class OutputFormat(StrEnum):
    """Output formats of `nightscore query`."""

    table = "table"
    csv = "csv"
    json = "json"


HomeOption = typer.Option(None, "--home", help="Folder of the embedded defaults (NIGHTSCORE_HOME, default ./.nightscore).")


def _settings(home: Path | None, command: str = "command") -> Settings:
    """Return settings with --home applied (handed to flows with settings_scope, never through the environment).

    Also sets the libraries' process switches and the logging: the console gets one line per failure, the
    command's log file (<home>/logs/<time>-<command>.log, created on first record) everything.
    """
    from core.logs import configure_logging, log_file_path

    cfg = load_settings(home=home.resolve() if home is not None else None)
    apply_runtime_defaults(cfg)
    INVOCATION.log_file = log_file_path(cfg.logs_dir, command)
    configure_logging(INVOCATION.verbose, INVOCATION.log_file)
    return cfg


@app.command("demo-data")
def demo_data(
    out: Path = typer.Option(..., "--out", help="Folder to write items.parquet and interactions.parquet to."),
    items: int = typer.Option(2000, "--items", min=1),
    users: int = typer.Option(500, "--users", min=1),
    seed: int = typer.Option(0, "--seed"),
    home: Path | None = HomeOption,
) -> None:
    """Write the deterministic demo inputs (items with text, user interactions) to a folder."""
    _settings(home, "demo-data")
    from nightscore.demo import generate_demo_data
    from storage.lake import Lake

    lake = Lake(str(out))
    item_frame, interactions = generate_demo_data(items, users, seed)
    lake.write_parquet(item_frame, lake.uri("items.parquet"))
    lake.write_parquet(interactions, lake.uri("interactions.parquet"))
    typer.echo(f"wrote {item_frame.height} items and {interactions.height} interactions to {out}")


@run_app.command("nightly")
def run_nightly(
    items: str | None = typer.Option(None, "--items", help="Items Parquet URI (default: demo data in the lake)."),
    interactions: str | None = typer.Option(None, "--interactions", help="Interactions Parquet URI."),
    run_date: str | None = typer.Option(None, "--run-date", help="YYYY-MM-DD (default: today, UTC)."),
    resume: str | None = typer.Option(
        None, "--resume", help="RUN_ID of an unfinished run to resume. Default: the unfinished run of the same date and inputs."
    ),
    home: Path | None = HomeOption,
) -> None:
    """Run the nightly scoring flow once, now, and print its summary (SIGTERM stops it gracefully)."""
    from datetime import date

    from core.run_context import parse_run_date

    parse_run_date(run_date, date.today())  # bad dates are usage errors before anything starts
    cfg = _settings(home, "run-nightly")
    from core.settings import settings_scope
    from core.stop import install_signal_handlers
    from flows.nightly import nightly
    from flows.params import NightlyParams
    from nightscore.output import progress_bar, summary_text

    install_signal_handlers()
    params = NightlyParams(run_date=run_date, items_uri=items, interactions_uri=interactions, resume=resume)
    with _interruptible(), settings_scope(cfg), progress_bar():
        published = nightly(params)
    typer.echo(summary_text(published, time.monotonic() - INVOCATION.started, **_run_notes(cfg, published)))


def _run_notes(cfg: Settings, published: Published) -> dict[str, Any]:
    """Return what the summary adds from the warehouse: quarantine per rule, and the latest run when this one is not it."""
    from core.errors import NightscoreError
    from storage.resources import warehouse_for

    warehouse = warehouse_for(cfg)
    try:
        rules = warehouse.query(
            "SELECT dataset, rule, count(*), min(row_key) FROM quarantine WHERE run_id = ? "
            "GROUP BY dataset, rule ORDER BY 3 DESC, 1, 2",
            [published.run_id],
        ).rows
        latest = warehouse.latest_published()
    except NightscoreError as exc:  # the run is published; a busy warehouse only shortens its summary
        log.warning("summary without the warehouse's notes: %s", exc)
        return {}
    return {
        "quarantine": [tuple(row) for row in rules],
        "latest_run": latest.run_id if latest else None,
        "max_tokens": cfg.encoder.max_seq_length,
    }


@contextmanager
def _interruptible() -> Iterator[None]:
    """Turn Prefect's TerminationSignal (how it stops a flow's thread on SIGTERM) into RunInterrupted (exit 143)."""
    from prefect.exceptions import TerminationSignal

    try:
        yield
    except TerminationSignal as exc:
        from tasks.start import last_started

        run_id = last_started()
        how = f"run the same command again (or --resume {run_id})" if run_id else "run the same command again"
        raise RunInterrupted(
            f"run {run_id or '(not started yet)'} interrupted by SIGTERM: finished shards are kept; {how} to finish it"
        ) from exc


@run_app.command("train-ranker")
def run_train_ranker(
    run_id: str | None = typer.Option(None, "--run-id", help="Published run to train on (default: the latest)."),
    home: Path | None = HomeOption,
) -> None:
    """Train the online ranker on a published run and print its offline metrics."""
    cfg = _settings(home, "run-train-ranker")
    from core.settings import settings_scope
    from flows.params import TrainRankerParams
    from flows.train_ranker import train_ranker

    with settings_scope(cfg):
        trained = train_ranker(TrainRankerParams(run_id=run_id))
    metrics = ", ".join(f"{k} {v:.3f}" for k, v in sorted(trained.metrics.items()))
    typer.echo(f"ranker {trained.version} trained on {trained.trained_on}, saved to {trained.uri}\n  {metrics}")


@app.command("serve")
def serve(
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    host: str = typer.Option("127.0.0.1", "--host"),
    workers: int = typer.Option(1, "--workers", min=1, help="Worker processes (each loads and warms up its own app)."),
    home: Path | None = HomeOption,
) -> None:
    """Serve GET /v1/users/{user_id}/recommendations and POST /v1/events from the cache with each run's ranker."""
    cfg = _settings(home, "serve")
    from serving.app import run_server
    from serving.config import serving_config

    run_server(serving_config(cfg), host=host, port=port, workers=workers)


@app.command("query")
def query(
    sql: str = typer.Argument(..., help="Read-only SQL over the warehouse tables and views."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table, csv or json (an array of row objects)."),
    home: Path | None = HomeOption,
) -> None:
    """Run one read-only SELECT on the warehouse's tables and views (sandboxed) and print the result."""
    cfg = _settings(home, "query")
    from nightscore.output import render
    from storage.resources import query_warehouse_for

    typer.echo(render(query_warehouse_for(cfg).analyst_query(sql), fmt.value))


@app.command("runs")
def runs(limit: int = typer.Option(20, "--limit", min=1), home: Path | None = HomeOption) -> None:
    """List recent runs with their status and counts."""
    cfg = _settings(home, "runs")
    from nightscore.output import render
    from storage.resources import warehouse_for

    sql = (
        "SELECT run_id, run_date, status, rows_in, rows_quarantined, rows_scored, rows_reused, rows_computed, "
        "users_with_candidates, round(wall_seconds, 1) AS wall_s, message FROM scoring_runs ORDER BY started_at DESC LIMIT ?"
    )
    typer.echo(render(warehouse_for(cfg).query(sql, [limit]), "table"))


contracts_app = typer.Typer(no_args_is_help=True, help="Data contracts of the inputs.")
app.add_typer(contracts_app, name="contracts")


@contracts_app.command("check")
def contracts_check(
    items: str = typer.Option(..., "--items", help="Items Parquet URI."),
    interactions: str = typer.Option(..., "--interactions", help="Interactions Parquet URI."),
    home: Path | None = HomeOption,
) -> None:
    """Validate input files against the contracts without scoring; exit 3 when a run would refuse them."""
    cfg = _settings(home, "contracts-check")
    from nightscore.check import check_inputs, check_report
    from storage.resources import lake_for

    check = check_inputs(lake_for(cfg), cfg, items, interactions)
    typer.echo(check_report(check, cfg.contracts.quarantine_max_share))
    if not check.passed(cfg.contracts.quarantine_max_share):
        raise ContractViolation("the input contracts failed (table above): a run on these files would stop")


cache_app = typer.Typer(no_args_is_help=True, help="Inspect or move the published candidate cache.")
app.add_typer(cache_app, name="cache")


@cache_app.command("rollback")
def cache_rollback(home: Path | None = HomeOption) -> None:
    """Point the cache and the warehouse's latest_* views back to the previous published run, together."""
    cfg = _settings(home, "cache-rollback")
    from storage.publication import rollback
    from storage.resources import cache_for, warehouse_for

    with cache_for(cfg) as cache:
        rolled_back, latest = rollback(warehouse_for(cfg), cache)
    typer.echo(f"rolled back {rolled_back}; latest is now {latest} (warehouse views and cache pointer)")


events_app = typer.Typer(no_args_is_help=True, help="The online service's interaction events.")
app.add_typer(events_app, name="events")


@events_app.command("export")
def events_export(
    run_date: str = typer.Option(..., "--run-date", help="UTC day (YYYY-MM-DD) whose events are written."),
    home: Path | None = HomeOption,
) -> None:
    """Write a day's events to the lake (events/date=D/interactions.parquet): the nightly runs of D and D+1 read them."""
    cfg = _settings(home, "events-export")
    import asyncio
    from datetime import date

    from serving.config import serving_config
    from storage.cache_async import open_stores
    from storage.events import export_day
    from storage.resources import lake_for

    day, options = date.fromisoformat(run_date), serving_config(cfg)

    async def export() -> tuple[str | None, int]:
        reader, store = open_stores(
            options.cache_location,
            options.cache_prefix,
            options.cache_timeout_s,
            1,
            options.events_retention_s,
            options.events_max,
        )
        try:
            return await export_day(store, lake_for(cfg), day)
        finally:
            await store.close()
            await reader.close()

    uri, rows = asyncio.run(export())
    typer.echo(f"exported {rows} events of {day} to {uri}" if uri else f"no events on {day}: nothing written")


@app.command("prune")
def prune(
    keep_runs: int | None = typer.Option(None, "--keep-runs", min=1, help="Keep the rows of the newest N published runs."),
    keep_days: int | None = typer.Option(None, "--keep-days", min=0, help="Keep the rows of runs dated within N days."),
    home: Path | None = HomeOption,
) -> None:
    """Delete old runs' rows from the warehouse and their folders from the lake (never the latest published run)."""
    cfg = _settings(home, "prune")
    from storage.pruning import prune as prune_all
    from storage.resources import lake_for, warehouse_for

    report = prune_all(warehouse_for(cfg), lake_for(cfg), keep_runs, keep_days)
    typer.echo(f"pruned {report.runs} run(s); removed {report.folders} lake folder(s), {report.bytes_freed / 1e6:.1f} MB")


@app.command("up")
def up(
    host: str = typer.Option("127.0.0.1", "--host", help="Address the Prefect server listens on."), home: Path | None = HomeOption
) -> None:
    """Start a Prefect server (port NIGHTSCORE_PREFECT_PORT, default 4200), the deployments and a worker; print the UI URL."""
    cfg = _settings(home, "up")
    from deployments.stack import up as start

    state = start(cfg, host)
    typer.echo(
        f"nightscore is up: Prefect UI {state['ui_url']}  (API {state['api_url']})\n"
        f"  deployments: {', '.join(state['deployments'])}; worker pool {cfg.ops.work_pool}; logs in {state['home']}/logs\n"
        f"  export PREFECT_API_URL={state['api_url']}   # for prefect commands and nightscore trigger/status"
    )


@app.command("down")
def down(home: Path | None = HomeOption) -> None:
    """Stop the worker and the Prefect server that `nightscore up` started."""
    cfg = _settings(home, "down")
    from deployments.stack import down as stop

    stopped = stop(cfg)
    typer.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was up")


@app.command("deploy")
def deploy(home: Path | None = HomeOption) -> None:
    """Register the work pool, queues, gpu limit and deployments with the server at PREFECT_API_URL."""
    cfg = _settings(home, "deploy")
    from deployments.deploy import deploy_all

    with _prefect_api(cfg):
        for name, deployment_id in deploy_all(cfg).items():
            typer.echo(f"{name}: {deployment_id}")


@contextmanager
def _prefect_api(cfg: Settings) -> Iterator[str]:
    """Talk to the Prefect API of PREFECT_API_URL, else the one `nightscore up` started, inside the block."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    from deployments.stack import healthy, read_state

    url = get_current_settings().api.url or (read_state(cfg) or {}).get("api_url")
    if not url:
        raise UsageError("no Prefect server: run `nightscore up` or set PREFECT_API_URL")
    secret = get_current_settings().api.auth_string
    if not healthy(url, secret.get_secret_value() if secret is not None else None):
        raise StackError(f"the Prefect API at {url} does not answer (is the server up? `nightscore up`, PREFECT_API_URL)")
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield url


trigger_app = typer.Typer(no_args_is_help=True, help="Start a deployment's run through the Prefect API.")
app.add_typer(trigger_app, name="trigger")


@trigger_app.command("on-demand")
def trigger_on_demand(
    items: str | None = typer.Option(None, "--items", help="Items Parquet URI (default: the latest published run's)."),
    interactions: str | None = typer.Option(None, "--interactions", help="Interactions Parquet URI."),
    item_ids: list[str] | None = typer.Option(None, "--item-id", help="Score only this item id (repeatable)."),
    run_date: str | None = typer.Option(None, "--run-date", help="YYYY-MM-DD (default: today, UTC)."),
    callback_url: str | None = typer.Option(None, "--callback-url", help="URL the run POSTs its result to."),
    key: str | None = typer.Option(None, "--idempotency-key", help="Same key = same run (default: parameters + today's date)."),
    wait: bool = typer.Option(False, "--wait", help="Wait for the run to finish; exit 1 unless it completed."),
    timeout: float = typer.Option(3600, "--timeout", help="Seconds --wait waits."),
    home: Path | None = HomeOption,
) -> None:
    """Trigger the on-demand deployment; print the flow run id (and its final state with --wait)."""
    cfg = _settings(home, "trigger")
    from core.settings import settings_scope
    from deployments.trigger import existing_run, trigger, wait_for_run
    from flows.params import OnDemandParams

    with settings_scope(cfg):  # the models check callback_url against these settings
        params = OnDemandParams(
            items_uri=items,
            interactions_uri=interactions,
            item_ids=item_ids or None,
            run_date=run_date,
            callback_url=callback_url,
        )
    with _prefect_api(cfg):
        key = key or _request_key(cfg, params)
        existing = existing_run("on-demand", key)
        created = trigger("on-demand", params, key)
        typer.echo(created["flow_run_id"])
        if existing is not None:
            typer.echo(
                f"nightscore: returned the existing flow run {existing['flow_run_id']} ({existing['state']}, created "
                f"{existing['created']:%Y-%m-%d %H:%M:%S %Z}) for the same request and inputs; give "
                "--idempotency-key to start another",
                err=True,
            )
        log.info("flow run %s (%s), idempotency key %s", created["flow_run_id"], created["name"], created["idempotency_key"])
        if wait:
            state = wait_for_run(created["flow_run_id"], timeout)
            typer.echo(f"{state['state_name']}")


def _request_key(cfg: Settings, params: OnDemandParams) -> str:
    """Return the default idempotency key: the parameters and the inputs' identity (size, ETag/mtime, via the lake)."""
    from core.errors import NightscoreError
    from deployments.trigger import default_idempotency_key, inputs_identity
    from storage.resources import lake_for, warehouse_for

    latest = None
    if not (params.items_uri or params.interactions_uri):
        try:
            found = warehouse_for(cfg).latest_published()
            latest = found.run_id if found else None
        except NightscoreError as exc:  # a warehouse this machine cannot see: the key covers the parameters only
            log.info("idempotency key without the latest run: %s", exc)
    inputs = inputs_identity(lake_for(cfg), [params.items_uri, params.interactions_uri], latest)
    return default_idempotency_key("on-demand", params, inputs)


@app.command("status")
def status(
    flow_run_id: str = typer.Argument(..., help="Flow run id printed by `nightscore trigger`."), home: Path | None = HomeOption
) -> None:
    """Print a flow run's state (from the Prefect API) and its counts (from the warehouse)."""
    cfg = _settings(home, "status")
    from deployments.trigger import flow_run_state, run_counts
    from storage.resources import warehouse_for

    with _prefect_api(cfg):
        state = flow_run_state(flow_run_id)
    typer.echo(f"{state['name']}: {state['state_name']}" + (f" ({state['message']})" if state["message"] else ""))
    try:
        counts = run_counts(warehouse_for(cfg), flow_run_id)
    except WarehouseMissing:
        counts = None
    for name, value in (counts or {}).items():
        typer.echo(f"  {name}: {value}")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code; failures print one line, never a bare traceback (see core/logs.py)."""
    global INVOCATION
    INVOCATION = Invocation()
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
        return _fail(UsageError(f"invalid parameters: {problems}"))
    except click.Abort:
        return _fail(KeyboardInterrupt())
    except BaseException as exc:
        if isinstance(exc, SystemExit):
            raise
        return _fail(exc)


def _fail(exc: BaseException) -> int:
    """Print a failure's one line (the traceback of an unexpected one goes to the log file); return its exit code."""
    text = " ".join(str(exc).split())[:500]
    if isinstance(exc, KeyboardInterrupt):
        typer.echo("nightscore: aborted", err=True)
    elif is_expected(exc) or isinstance(exc, NightscoreError):
        typer.echo(f"nightscore: error: {text}", err=True)
        log.debug("failure details", exc_info=exc)
    else:
        from core.logs import to_log_file

        if INVOCATION.verbose:  # console and log file
            log.error("unexpected error: %s: %s", type(exc).__name__, text, exc_info=exc)
        logged = INVOCATION.verbose or to_log_file(f"unexpected error: {type(exc).__name__}: {text}", exc)
        where = f" (traceback in {INVOCATION.log_file})" if logged and not INVOCATION.verbose else ""
        typer.echo(f"nightscore: unexpected error: {type(exc).__name__}: {text}{where}", err=True)
    return exit_code_for(exc)


def entrypoint() -> None:
    """Console-script entry point."""
    sys.exit(main())
