"""Commands on the data around the runs: demo inputs, input contracts, the service's events, the cache, pruning."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import typer

from core.errors import ContractViolation
from core.run_context import parse_run_date
from nightscore.cli.app import HomeOption, command_settings

# Each command imports what it uses in its body: every command line imports this module to build the parser, and
# polars, pyarrow, redis and the storage adapters cost most of a second there (tests/cli/test_query_cli.py checks
# what a read loads).


def demo_data(
    out: Path = typer.Option(..., "--out", help="Folder to write items.parquet and interactions.parquet to."),
    items: int = typer.Option(2000, "--items", min=1),
    users: int = typer.Option(500, "--users", min=1),
    seed: int = typer.Option(0, "--seed"),
    home: Path | None = HomeOption,
) -> None:
    """Write the deterministic demo inputs (items with text, user interactions) to a folder."""
    command_settings(home, "demo-data")
    from nightscore.demo import generate_demo_data
    from storage.lake import Lake

    lake = Lake(str(out))
    item_frame, interactions = generate_demo_data(items, users, seed)
    lake.write_parquet(item_frame, lake.uri("items.parquet"))
    lake.write_parquet(interactions, lake.uri("interactions.parquet"))
    typer.echo(f"wrote {item_frame.height} items and {interactions.height} interactions to {out}")


def contracts_check(
    items: str = typer.Option(..., "--items", help="Items Parquet URI."),
    interactions: str = typer.Option(..., "--interactions", help="Interactions Parquet URI."),
    home: Path | None = HomeOption,
) -> None:
    """Validate input files against the contracts without scoring; exit 3 when a run would refuse them."""
    cfg = command_settings(home, "contracts-check")
    from nightscore.check import check_inputs, check_report  # imported here for start-up speed: pandera and GX load slowly
    from storage.resources import lake_for, warehouse_for

    check = check_inputs(lake_for(cfg), cfg, items, interactions, warehouse=warehouse_for(cfg))
    typer.echo(check_report(check, cfg.contracts.quarantine_max_share))
    if not check.passed(cfg.contracts.quarantine_max_share):
        raise ContractViolation("the input contracts failed (table above): a run on these files would stop")


def cache_rollback(home: Path | None = HomeOption) -> None:
    """Point the cache and the warehouse's latest_* views back to the previous published run, together."""
    cfg = command_settings(home, "cache-rollback")
    from storage.publication import rollback
    from storage.resources import cache_for, warehouse_for

    with cache_for(cfg) as cache:
        rolled_back, latest = rollback(warehouse_for(cfg), cache)
    typer.echo(f"rolled back {rolled_back}; latest is now {latest} (warehouse views and cache pointer)")


def events_export(
    run_date: str = typer.Option(..., "--run-date", help="UTC day (YYYY-MM-DD) whose events are written."),
    home: Path | None = HomeOption,
) -> None:
    """Write a day's events to the lake (events/date=D/interactions.parquet): the nightly runs of D and D+1 read them."""
    day = date.fromisoformat(parse_run_date(run_date, date.today()))  # a bad date is a usage error (exit 2)
    cfg = command_settings(home, "events-export")
    from storage.resources import export_events

    uri, rows = export_events(cfg, day)
    typer.echo(f"exported {rows} events of {day} to {uri}" if uri else f"no events on {day}: nothing written")


def prune(
    keep_runs: int | None = typer.Option(None, "--keep-runs", min=1, help="Keep the rows of the newest N published runs."),
    keep_days: int | None = typer.Option(None, "--keep-days", min=0, help="Keep the rows of runs dated within N days."),
    home: Path | None = HomeOption,
) -> None:
    """Delete old runs' rows from the warehouse and their folders from the lake (never the latest published run)."""
    cfg = command_settings(home, "prune")
    from storage.pruning import prune as prune_all
    from storage.resources import lake_for, warehouse_for

    report = prune_all(warehouse_for(cfg), lake_for(cfg), keep_runs, keep_days)
    typer.echo(f"pruned {report.runs} run(s); removed {report.folders} lake folder(s), {report.bytes_freed / 1e6:.1f} MB")
