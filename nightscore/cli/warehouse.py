"""`nightscore query` and `nightscore runs`: the warehouse read from the command line."""

from __future__ import annotations

from pathlib import Path

import typer

from nightscore.cli.app import HomeOption, OutputFormat, command_settings


def query(
    sql: str = typer.Argument(..., help="Read-only SQL over the warehouse tables and views."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table, csv or json (an array of row objects)."),
    limit: int | None = typer.Option(
        None, "--limit", min=0, help="Rows to print at most; 0: all. Default: NIGHTSCORE_QUERY_MAX_ROWS."
    ),
    home: Path | None = HomeOption,
) -> None:
    """Run one read-only SELECT on the warehouse's tables and views (sandboxed, timed out) and print its rows as they come."""
    cfg = command_settings(home, "query")
    from nightscore.output import cut_notice, echo_stream, render_stream, terminal_width  # on use: start-up speed
    from storage.resources import query_warehouse_for

    cap = cfg.warehouse.query_max_rows if limit is None else limit
    with query_warehouse_for(cfg).analyst_rows(sql, cap, cfg.warehouse.query_timeout_s) as stream:
        echo_stream(render_stream(stream.columns, stream, fmt.value, terminal_width()))
    if stream.truncated:
        typer.echo(cut_notice(cap), err=True)


def runs(limit: int = typer.Option(20, "--limit", min=1), home: Path | None = HomeOption) -> None:
    """List recent runs with their status and counts."""
    cfg = command_settings(home, "runs")
    from nightscore.output import render, terminal_width  # on use: start-up speed
    from storage.resources import warehouse_for

    typer.echo(render(warehouse_for(cfg).recent_runs(limit), "table", terminal_width()))
