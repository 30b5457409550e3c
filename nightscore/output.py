"""Rendering query results and run summaries for the terminal (table, csv, json)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import date, datetime
from decimal import Decimal
from itertools import chain
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from core import progress
from core.records import MethodQuality, Published, RunRecord, TrainedRanker, stage_two_loss
from models.encoder.spec import Calibration
from storage.warehouse.base import QueryResult


def _json_value(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return _finite(float(value))
    if isinstance(value, (tuple, set)):
        return [_finite(v) for v in value]
    return str(value)


def _finite(value: Any) -> Any:
    """Return value with every NaN or infinity (at any depth) as None: JSON has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def render(result: QueryResult, fmt: str, width: int | None = None) -> str:
    """Return a query result as text: 'table' (aligned), 'csv' (with header) or 'json' (array of objects)."""
    return "".join(render_stream(result.columns, [result.rows], fmt, width)).rstrip("\n")


def render_stream(
    columns: list[str], batches: Iterable[Sequence[tuple[Any, ...]]], fmt: str, width: int | None = None
) -> Iterator[str]:
    """Yield a result as text a batch of rows at a time, so that a big result is never held whole.

    'table': aligned on the first batch's widths, or one column per line (psql's expanded layout) when that is
    wider than width; 'csv' with a header; 'json': an array of row objects (NaN and infinities as null).
    """
    if fmt == "json":
        return _json_chunks(columns, batches)
    if fmt == "csv":
        return _csv_chunks(columns, batches)
    return _table_chunks(columns, batches, width)


def _json_chunks(columns: list[str], batches: Iterable[Sequence[tuple[Any, ...]]]) -> Iterator[str]:
    before = "[\n"  # what comes before the next row: the array's opening, then a comma
    for batch in batches:
        if batch:
            yield before + ",\n".join(_json_row(columns, row) for row in batch)
            before = ",\n"
    yield "[]\n" if before == "[\n" else "\n]\n"


def _json_row(columns: list[str], row: Sequence[Any]) -> str:
    return json.dumps(_finite(dict(zip(columns, row, strict=True))), default=_json_value, allow_nan=False)


def _csv_chunks(columns: list[str], batches: Iterable[Sequence[tuple[Any, ...]]]) -> Iterator[str]:
    for rows in chain([[tuple(columns)]], batches):
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows(rows)
        yield buffer.getvalue()


def _table_chunks(columns: list[str], batches: Iterable[Sequence[tuple[Any, ...]]], width: int | None) -> Iterator[str]:
    """Yield an aligned table (widths from the first batch), or the expanded layout when it is wider than width."""
    batches = iter(batches)
    first = list(next(batches, []))
    cells = [[_cell(v) for v in row] for row in first]
    widths = [max([len(name), *(_longest(row[i]) for row in cells)]) for i, name in enumerate(columns)]
    expanded = width is not None and sum(widths) + 3 * len(widths) - 1 > width
    if not expanded:
        yield _aligned_line(columns, widths, [False] * len(columns)) + _rule(widths)
    right = [any(_is_number(row[i]) for row in first[:1]) for i in range(len(columns))]
    shown = 0
    for rows in chain([cells], ([[_cell(v) for v in row] for row in batch] for batch in batches)):
        if expanded:
            yield "".join(_record(columns, row, shown + n + 1) for n, row in enumerate(rows))
        else:
            yield "".join(_aligned_line(row, widths, right) for row in rows)
        shown += len(rows)
    yield f"({shown} row{'' if shown == 1 else 's'})\n"


def _aligned_line(cells: Sequence[str], widths: list[int], right: list[bool]) -> str:
    """Return one row of the aligned table: cells padded to their widths (numbers to the right), | between."""
    lines = [cell.split("\n") for cell in cells]
    out = []
    for k in range(max((len(parts) for parts in lines), default=1)):
        parts = [p[k] if k < len(p) else "" for p in lines]
        out.append(" " + " | ".join(_pad(t, w, r) for t, w, r in zip(parts, widths, right, strict=True)).rstrip() + "\n")
    return "".join(out)


def _rule(widths: list[int]) -> str:
    return "-" + "-+-".join("-" * w for w in widths) + "-\n"


def _record(columns: list[str], cells: Sequence[str], number: int) -> str:
    """Return one row in the expanded layout: a record header, then one 'column | value' line per column."""
    key = max(len(name) for name in columns)
    lines = [f"-[ RECORD {number} ]" + "-" * max(0, key - 8) + "\n"]
    for name, cell in zip(columns, cells, strict=True):
        first, *rest = cell.split("\n")
        lines.append(f"{name.ljust(key)} | {first}".rstrip() + "\n")
        lines += [f"{' ' * key} | {more}".rstrip() + "\n" for more in rest]
    return "".join(lines)


def _pad(text: str, width: int, right: bool) -> str:
    return text.rjust(width) if right else text.ljust(width)


def _longest(cell: str) -> int:
    return max(len(line) for line in cell.split("\n"))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)


def _cell(value: Any) -> str:
    if isinstance(value, (tuple, list)) and len(value) > 6:
        return "[" + ", ".join(f"{v:.3f}" for v in value[:3]) + f", … ({len(value)})]"
    return "" if value is None else str(value)


def _to_text(renderable: Any) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text().rstrip("\n")


def echo_stream(chunks: Iterable[str]) -> None:
    """Write text chunks to stdout as they come; stop quietly when the reader has gone (`| head`), as cat does."""
    try:
        for chunk in chunks:
            sys.stdout.write(chunk)
            sys.stdout.flush()
    except BrokenPipeError:
        # Python would report the closed pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def terminal_width() -> int | None:
    """Return the terminal's width when the output is a terminal (None when it goes to a file or a pipe)."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def cut_notice(limit: int) -> str:
    """Return the line that says a query's result was cut at limit rows, and how to see more."""
    return f"nightscore: showed the first {limit} rows; --limit N shows more, --limit 0 all (NIGHTSCORE_QUERY_MAX_ROWS)"


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
        *truncation_warning(r.truncated_texts, r.rows_scored, max_tokens),
        _encode_line(published),
        f"  model {r.model_version}",
        *_engine_line(r),
        *_cascade_line(r),
        f"  candidates on held-out interactions: fused recall@K {_num(r.recall_at_k)} (popularity"
        f" {_num(r.popularity_recall_at_k)}), ranked NDCG@10 {_num(r.ndcg_at_10)} (popularity {_num(r.popularity_ndcg_at_10)}),"
        f" cold-item recall@K {_num(r.cold_recall_at_k)}; ranker {r.ranker_kind or 'none'}",
        *candidate_notes(r),
        *stage_two_note(r, published.quality),
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
    return [f"  quarantined {dataset} {rule}: {rows} (e.g. {example_key(example)})" for dataset, rule, rows, example in rules]


def example_key(key: str) -> str:
    """Return a quarantined row's key as shown: a blank key says so, a long or multi-line one is cut to one line."""
    if not key.strip():
        return "a blank key"
    shown = " ".join(key.split())
    return shown if len(shown) <= 60 else shown[:57] + "..."


def truncation_warning(truncated: int, texts: int, max_tokens: int | None) -> list[str]:
    """Return the warning line about texts cut at the encoder's maximum length (empty when none was)."""
    if not truncated or not texts:
        return []
    limit = f"{max_tokens} tokens" if max_tokens else "the model's maximum length"
    return [f"  warning: {truncated} of the run's {texts} texts ({truncated / texts:.1%}) are truncated at {limit}"]


def candidate_notes(r: RunRecord) -> list[str]:
    """Return the candidate gate's outcome and the fallback source, when there was one, as summary lines."""
    lines = [f"  candidate gate {r.candidate_gate}"] if r.candidate_gate else []
    if r.candidate_fallback:
        lines.append(
            f"  note: the fused list lost to {r.candidate_fallback} on the validation split: "
            f"the candidates are {r.candidate_fallback}'s list"
        )
    return lines


def stage_two_note(r: RunRecord, quality: Sequence[MethodQuality]) -> list[str]:
    """Return the note on a stage two that was trained but not served (it lost to the fused order), else nothing."""
    loss = None if r.ranker_version else stage_two_loss(quality)
    if loss is None:
        return []
    return [
        f"  note: stage two ranked held-out users worse than the fused order (NDCG@10 {loss[0]:.3f} against"
        f" {loss[1]:.3f}): no ranker is served, the candidates keep the fused order"
    ]


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


def _cascade_line(r: RunRecord) -> list[str]:
    """Return the topic cascade's line (docs/cascade.md): the large model, how many items it re-scored and why."""
    if r.cascade_model_version is None:
        return []
    sample = (
        f"; sample: {100 * r.cascade_agreement:.1f}% agree with all-large at {r.cascade_cost_ratio:.2f} of its cost"
        if r.cascade_agreement is not None and r.cascade_cost_ratio is not None
        else ""
    )
    return [
        f"  topic cascade ({r.cascade_budget}): {r.routed_items} item(s) re-scored by {r.cascade_model_version} "
        f"({r.routed_truncated} truncated, {r.routed_margin} by margin) in {_num(r.cascade_seconds)} s{sample}"
    ]


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
    """Return the commands worth trying after a run: query its tables, list the runs, serve its candidates (on this
    host without API keys: `serve` refuses to start without keys unless told so; the README shows it with keys)."""
    where = f" --home {home}" if home is not None else ""
    return (
        "next:\n"
        f'  nightscore query "select topic, count(*) from latest_item_scores group by topic"{where}\n'
        f"  nightscore runs{where}\n"
        f"  NIGHTSCORE_SERVING_ALLOW_NO_KEYS=true nightscore serve{where}   # on 127.0.0.1 without API keys (README: "
        "The online ranker); GET /v1/users/<user_id>/recommendations, API docs at /docs"
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


def trained_summary(trained: TrainedRanker) -> str:
    """Return what `run train-ranker` did: the ranker now served, whether it changed, and its held-out figures."""
    if trained.version == trained.previous:
        head = f"ranker {trained.version} unchanged: run {trained.trained_on} already serves it (same training, same model)"
    else:
        was = f" (was {trained.previous})" if trained.previous else ""
        head = f"ranker {trained.version} trained on {trained.trained_on} and served from now on{was}; saved to {trained.uri}"
    served = {k.split(".", 1)[1]: v for k, v in trained.metrics.items() if k.startswith("ranked.")}
    figures = ", ".join(f"{name} {value:.3f}" for name, value in sorted(served.items()))
    return f"{head}\n  held-out: {figures}" if figures else head
