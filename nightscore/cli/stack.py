"""Commands on a Prefect server: `up`/`down` on this machine, `deploy` to one, `trigger` and `status` of its runs."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from core.errors import WarehouseMissing
from core.settings import Settings, settings_scope
from nightscore.cli.app import HomeOption, command_settings

log = logging.getLogger("nightscore")

DemoOption = typer.Option(
    False, "--demo", help="Schedule the demo data (written to <lake>/inputs/demo/ once) when no inputs are configured."
)


def with_demo_inputs(cfg: Settings, demo: bool) -> Settings:
    """Return cfg with the demo inputs as the scheduled runs' inputs when --demo asked for them."""
    from nightscore.demo import ensure_demo_inputs  # on use: every command line imports this module (start-up speed)
    from storage.resources import lake_for

    return cfg.with_inputs(*ensure_demo_inputs(lake_for(cfg))) if demo else cfg


def up(
    host: str = typer.Option("127.0.0.1", "--host", help="Address the Prefect server listens on."),
    demo: bool = DemoOption,
    home: Path | None = HomeOption,
) -> None:
    """Start a Prefect server (port NIGHTSCORE_PREFECT_PORT, default 4200), the deployments and a worker; print the UI URL."""
    cfg = with_demo_inputs(command_settings(home, "up"), demo)
    from deployments.stack import up as start  # imported here for start-up speed: Prefect loads in seconds

    state = start(cfg, host)
    typer.echo(
        f"nightscore is up: Prefect UI {state['ui_url']}  (API {state['api_url']})\n"
        f"  deployments: {', '.join(state['deployments'])}; worker pool {cfg.ops.work_pool}; logs in {state['home']}/logs\n"
        f"  export PREFECT_API_URL={state['api_url']}   # for prefect commands and nightscore trigger/status"
    )


def down(home: Path | None = HomeOption) -> None:
    """Stop the worker and the Prefect server that `nightscore up` started."""
    cfg = command_settings(home, "down")
    from deployments.stack import down as stop  # imported here for start-up speed

    stopped = stop(cfg)
    typer.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was up")


def deploy(demo: bool = DemoOption, home: Path | None = HomeOption) -> None:
    """Register the work pool, queues, gpu limit and deployments with the server at PREFECT_API_URL."""
    cfg = with_demo_inputs(command_settings(home, "deploy"), demo)
    from deployments.deploy import deploy_all, require_inputs  # imported here for start-up speed
    from deployments.stack import prefect_api

    require_inputs(cfg)
    with prefect_api(cfg):
        for name, deployment_id in deploy_all(cfg).items():
            typer.echo(f"{name}: {deployment_id}")


def trigger_on_demand(
    items: str | None = typer.Option(None, "--items", help="Items Parquet URI (default: the latest published run's)."),
    interactions: str | None = typer.Option(None, "--interactions", help="Interactions Parquet URI."),
    item_ids: list[str] | None = typer.Option(None, "--item-id", help="Score only this item id (repeatable)."),
    run_date: str | None = typer.Option(None, "--run-date", help="YYYY-MM-DD (default: today, UTC)."),
    callback_url: str | None = typer.Option(None, "--callback-url", help="URL the run POSTs its result to."),
    key: str | None = typer.Option(None, "--idempotency-key", help="Same key = same run (default: parameters + the inputs)."),
    wait: bool = typer.Option(False, "--wait", help="Wait for the run to finish; exit 1 unless it completed."),
    timeout: float = typer.Option(3600, "--timeout", help="Seconds --wait waits."),
    home: Path | None = HomeOption,
) -> None:
    """Trigger the on-demand deployment; print the flow run id (and its final state with --wait)."""
    cfg = command_settings(home, "trigger")
    from deployments.stack import prefect_api  # imported here for start-up speed: Prefect loads in seconds
    from deployments.trigger import request_key, submit, wait_for_run
    from flows.params import OnDemandParams

    with settings_scope(cfg):  # the models check callback_url against these settings
        params = OnDemandParams(
            items_uri=items,
            interactions_uri=interactions,
            item_ids=item_ids or None,
            run_date=run_date,
            callback_url=callback_url,
        )
    with prefect_api(cfg):
        submission = submit("on-demand", params, key or request_key(cfg, "on-demand", params))
        created = submission.run
        typer.echo(created["flow_run_id"])
        if submission.reused is not None:
            existing = submission.reused
            typer.echo(
                f"nightscore: returned the existing flow run {existing['flow_run_id']} ({existing['state']}, created "
                f"{existing['created']:%Y-%m-%d %H:%M:%S %Z}) for the same request and inputs; give "
                "--idempotency-key to start another",
                err=True,
            )
        if submission.replaced is not None:
            dead = submission.replaced
            typer.echo(
                f"nightscore: the same request's run {dead['flow_run_id']} ended {dead['state']}: started a new one", err=True
            )
        log.info("flow run %s (%s), idempotency key %s", created["flow_run_id"], created["name"], created["idempotency_key"])
        if wait:
            typer.echo(wait_for_run(created["flow_run_id"], timeout)["state_name"])


def status(
    flow_run_id: str = typer.Argument(..., help="Flow run id printed by `nightscore trigger`."), home: Path | None = HomeOption
) -> None:
    """Print a flow run's state (from the Prefect API) and its counts (from the warehouse)."""
    cfg = command_settings(home, "status")
    from deployments.stack import prefect_api  # imported here for start-up speed
    from deployments.trigger import flow_run_state
    from storage.resources import warehouse_for

    with prefect_api(cfg):
        state = flow_run_state(flow_run_id)
    typer.echo(f"{state['name']}: {state['state_name']}" + (f" ({state['message']})" if state["message"] else ""))
    try:
        counts = warehouse_for(cfg).flow_run_counts(flow_run_id)
    except WarehouseMissing:
        counts = None
    for name, value in (counts or {}).items():
        typer.echo(f"  {name}: {value}")
