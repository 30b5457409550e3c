"""Rendering query results and run summaries for the terminal (table, csv, json)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from core import progress
from core.records import MethodQuality, Published, RunRecord
from models.encoder.spec import Calibration
from storage.warehouse.base import QueryResult


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


QuarantineRule = tuple[str, str, int, str]  # dataset, rule, rows, an example row key


def summary_text(
    published: Published,
    elapsed_s: float | None = None,
    quarantine: list[QuarantineRule] | None = None,
    latest_run: str | None = None,
    max_tokens: int | None = None,
) -> str:
    """Return the short summary of a finished run: rows, quarantine per rule, truncation, tokens, padding, speed, stages.

    Args:
        published: the run's publication.
        elapsed_s: the command's own time, Prefect's start-up included, when the caller measured it (the headline).
        quarantine: (dataset, rule, rows, example key) of the run's quarantine, most rows first.
        latest_run: the warehouse's latest run now; a different one means this run_date is older (not served).
        max_tokens: the encoder's maximum length, named in the truncation warning.
    """
    r = published.record
    lines = [
        f"run {r.run_id} ({r.run_date}) {r.status} in {_took(r.wall_seconds, elapsed_s)}"
        + (f" on {r.device}" if r.rows_computed else ""),
        f"  items: {r.rows_in} in, {r.rows_scored} scored, {r.rows_quarantined} quarantined",
        f"  interactions: {r.interactions_in} in, {r.interactions_quarantined} quarantined;"
        f" users with candidates: {r.users_with_candidates}",
        *quarantine_lines(quarantine or []),
        *truncation_warning(r.truncated_texts, r.rows_computed, max_tokens),
        _encode_line(published),
        f"  model {r.model_version}",
        *_engine_line(r),
        f"  candidates on held-out interactions: fused recall@K {_num(r.recall_at_k)} (popularity"
        f" {_num(r.popularity_recall_at_k)}), ranked NDCG@10 {_num(r.ndcg_at_10)} (popularity {_num(r.popularity_ndcg_at_10)}),"
        f" cold-item recall@K {_num(r.cold_recall_at_k)}; ranker {r.ranker_kind or 'none'}",
        *quality_table(published.quality),
        "  stages (s): " + ", ".join(f"{k} {v:.1f}" for k, v in published.stage_seconds.items()),
    ]
    if published.data_docs:
        lines.append("  data docs: " + ", ".join(f"{k} {v}" for k, v in published.data_docs.items()))
    if latest_run is not None and latest_run != r.run_id:
        lines.append(
            f"  note: {r.run_date} is older than the latest run {latest_run}: its rows are queryable by run_date; "
            "latest_* and the serving cache stay on the latest run"
        )
    return "\n".join(lines)


def _took(wall_s: float, elapsed_s: float | None) -> str:
    """Return the duration the headline gives: the command's, Prefect's start-up included, with the run's own beside it."""
    if elapsed_s is None or elapsed_s < wall_s:
        return f"{wall_s:.1f}s"
    return f"{elapsed_s:.1f}s (the run {wall_s:.1f}s, Prefect start-up and the rest {elapsed_s - wall_s:.1f}s)"


def quarantine_lines(rules: list[QuarantineRule]) -> list[str]:
    """Return one line per quarantine rule: dataset, rule, rows and an example row key (empty when nothing was quarantined)."""
    return [f"  quarantined {dataset} {rule}: {rows} (e.g. {example})" for dataset, rule, rows, example in rules]


def truncation_warning(truncated: int, encoded: int, max_tokens: int | None) -> list[str]:
    """Return the warning line about texts cut at the encoder's maximum length (empty when none was)."""
    if not truncated or not encoded:
        return []
    limit = f"{max_tokens} tokens" if max_tokens else "the model's maximum length"
    return [f"  warning: {truncated} of {encoded} texts encoded ({truncated / encoded:.1%}) were truncated at {limit}"]


def quality_table(quality: Sequence[MethodQuality]) -> list[str]:
    """Return the per-method table of the held-out evaluation (retrieval_metrics), indented under the summary."""
    if not quality:
        return []
    lines = [f"    {'method':<16}{'recall@K':>10}{'NDCG@10':>10}{'cold recall':>13}{'coverage':>10}"]
    lines += [
        f"    {q.method:<16}{_num(q.recall_at_k):>10}{_num(q.ndcg_at_10):>10}{_num(q.cold_recall_at_k):>13}"
        f"{_num(q.coverage_at_k):>10}"
        for q in quality
    ]
    return lines


DEFAULT_MODE = "auto's default: this machine kind is not calibrated, and this run was too short to pay for it"


PROGRESS_LABELS = {"encode": "encode shards", "calibrate": "calibrate (candidates, timing, sweep)"}


def _engine_line(r: RunRecord) -> list[str]:
    """Return the line naming the inference mode (chosen by calibration or pinned) with its fidelity and speed."""
    if r.backend is None:
        return []
    how = (
        (
            f"auto, calibrated {_num(r.calibrated_tokens_per_s)} tok/s on {r.calibration_device_kind}"
            + (" (persisted choice)" if r.calibration_from_cache else "")
        )
        if r.calibration_device_kind
        else DEFAULT_MODE
        if r.engine_choice == "default"
        else "pinned"
    )
    return [f"  engine: {r.backend}/{r.precision}@{r.token_budget} ({how}); min cosine to torch fp32 {r.fidelity_min:.5f}"]


def _encode_line(published: Published) -> str:
    """Return the encode line: what was computed (tokens, padding, speed) or that every vector was reused."""
    r = published.record
    reuse = f"{r.rows_computed} computed, {r.rows_reused} reused from published vectors"
    if not r.rows_computed:
        return f"  encode: {reuse}, nothing to encode; {published.shards} shards ({r.shards_reused} from checkpoints)"
    return (
        f"  encode: {reuse}; {published.shards} shards ({r.shards_reused} from checkpoints); {_num(r.texts_per_s)} texts/s;"
        f" tokens {r.real_tokens} real / {r.padded_tokens} padded (padding efficiency {_num(r.padding_efficiency)}),"
        f" {r.truncated_texts} texts truncated"
    )


@contextmanager
def progress_bar(enabled: bool | None = None) -> Iterator[None]:
    """Show a rich progress bar on stderr for a local run's stages (only on a terminal unless enabled is given)."""
    console = Console(stderr=True)
    if not (console.is_terminal if enabled is None else enabled):
        yield
        return
    bars: dict[str, Any] = {}
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=False
    ) as shown:

        def update(stage: str, done: int, total: int) -> None:
            if stage not in bars:
                bars[stage] = shown.add_task(PROGRESS_LABELS.get(stage, stage), total=total)
            shown.update(bars[stage], completed=done, total=total)

        stop = progress.listen(update)
        try:
            yield
        finally:
            stop()


def next_steps(home: Path | None) -> str:
    """Return the commands worth trying after a run: query its tables, list the runs, serve its candidates."""
    where = f" --home {home}" if home is not None else ""
    return (
        "next:\n"
        f'  nightscore query "select topic, count(*) from latest_item_scores group by topic"{where}\n'
        f"  nightscore runs{where}\n"
        f"  nightscore serve{where}   # GET /v1/users/<user_id>/recommendations; API docs at /docs"
    )


def calibration_table(calibration: Calibration, file: Path) -> str:
    """Return what auto measured on this machine kind: every candidate mode, its speed, padding, fidelity and verdict."""
    table = Table("mode", "real tokens/s", "padding", "min cosine", "note", title=f"auto on {calibration.device_kind}")
    for row in calibration.table:
        fidelity = row.get("fidelity") or {}
        table.add_row(
            str(row["mode"]),
            f"{float(str(row['tokens_per_s'])):,.0f}",
            f"{float(str(row['padding_efficiency'])):.3f}",
            "" if not isinstance(fidelity, dict) or "min" not in fidelity else f"{fidelity['min']:.5f}",
            str(row.get("note") or ""),
        )
    how = "read from an earlier calibration" if calibration.from_cache else f"measured in {calibration.seconds:.0f} s"
    chosen = f"chosen: {calibration.mode.label} at {calibration.tokens_per_s:,.0f} real tokens/s ({how}); kept in {file}"
    return _to_text(table) + "\n" + chosen
