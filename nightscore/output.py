"""Rendering query results and run summaries for the terminal (table, csv, json)."""

from __future__ import annotations

import csv
import io
import json
from contextlib import contextmanager
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Iterator

from rich.console import Console
from rich.table import Table

from storage.warehouse import QueryResult


def _json_value(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (tuple, set)):
        return list(value)
    return str(value)


def render(result: QueryResult, fmt: str) -> str:
    """Return a query result as text: 'table' (aligned), 'csv' (with header) or 'json' (array of objects)."""
    if fmt == "json":
        return json.dumps(result.records(), default=_json_value)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(result.columns)
        writer.writerows(result.rows)
        return buffer.getvalue().rstrip("\n")
    table = Table(*result.columns, show_lines=False)
    for row in result.rows:
        table.add_row(*(_cell(v) for v in row))
    return _to_text(table)


def _cell(value: Any) -> str:
    if isinstance(value, (tuple, list)) and len(value) > 6:
        return "[" + ", ".join(f"{v:.3f}" for v in value[:3]) + f", … ({len(value)})]"
    return "" if value is None else str(value)


def _to_text(renderable: Any) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text().rstrip("\n")


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def summary_text(summary: dict[str, Any]) -> str:
    """Return the short summary of a finished run: rows, quarantine, tokens, padding, speed, stages."""
    stages = summary.get("stage_seconds") or {}
    lines = [
        f"run {summary['run_id']} ({summary['run_date']}) {summary['status']} in {summary['wall_seconds']:.1f}s on {summary['device']}",
        f"  items: {summary['rows_in']} in, {summary['rows_scored']} scored, {summary['rows_quarantined']} quarantined",
        f"  interactions: {summary['interactions_in']} in, {summary['interactions_quarantined']} quarantined;"
        f" users with candidates: {summary['users_with_candidates']}",
        f"  tokens: {summary['real_tokens']} real / {summary['padded_tokens']} padded"
        f" (padding efficiency {summary['padding_efficiency']:.3f}), {summary['truncated_texts']} texts truncated",
        f"  encode: {summary['rows_computed']} computed, {summary['rows_reused']} reused from published vectors;"
        f" {summary['shards']} shards ({summary['shards_reused']} from checkpoints); {summary['texts_per_s']:.1f} texts/s",
        f"  model {summary['model_version']}",
        f"  retrieval on held-out interactions: recall@K {_num(summary.get('recall_at_k'))} (popularity"
        f" {_num(summary.get('popularity_recall_at_k'))}), NDCG@10 {_num(summary.get('ndcg_at_10'))}"
        f" (popularity {_num(summary.get('popularity_ndcg_at_10'))})",
        "  stages (s): " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()),
    ]
    if summary.get("data_docs"):
        lines.append("  data docs: " + ", ".join(f"{k} {v}" for k, v in summary["data_docs"].items()))
    return "\n".join(lines)


@contextmanager
def progress_bar(enabled: bool | None = None) -> Iterator[None]:
    """Show a rich progress bar on stderr for a local run's stages (only on a terminal unless enabled is given)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from nightscore import progress

    console = Console(stderr=True)
    if not (console.is_terminal if enabled is None else enabled):
        yield
        return
    bars: dict[str, Any] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as shown:
        def update(stage: str, done: int, total: int) -> None:
            if stage not in bars:
                bars[stage] = shown.add_task(f"{stage} shards", total=total)
            shown.update(bars[stage], completed=done, total=total)

        stop = progress.listen(update)
        try:
            yield
        finally:
            stop()
