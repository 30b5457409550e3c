"""`nightscore query` and `nightscore runs`: the warehouse read from the command line."""

from __future__ import annotations

from pathlib import Path

import typer

from nightscore.cli.app import HomeOption, OutputFormat, command_settings
from nightscore.output import render
from storage.resources import query_warehouse_for, warehouse_for


def query(
    sql: str = typer.Argument(..., help="Read-only SQL over the warehouse tables and views."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table, csv or json (an array of row objects)."),
    home: Path | None = HomeOption,
) -> None:
    """Run one read-only SELECT on the warehouse's tables and views (sandboxed) and print the result."""
    cfg = command_settings(home, "query")
    typer.echo(render(query_warehouse_for(cfg).analyst_query(sql), fmt.value))


def runs(limit: int = typer.Option(20, "--limit", min=1), home: Path | None = HomeOption) -> None:
    """List recent runs with their status and counts."""
    cfg = command_settings(home, "runs")
    typer.echo(render(warehouse_for(cfg).recent_runs(limit), "table"))
