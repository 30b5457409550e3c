"""A finished run's report for humans: the markdown summary and the per-stage timing table of its Prefect page."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nightscore.settings import Settings

if TYPE_CHECKING:
    from tasks.results import Published


def cost(published: Published, settings: Settings) -> dict[str, float]:
    """Return GPU-hours (encode time on a GPU), instance-hours (wall) and the cost per 1k items at the hourly price."""
    record = published.record
    encode_s = float(published.stage_seconds.get("encode", 0.0))
    hours = float(record.wall_seconds or 0.0) / 3600
    items = max(int(record.rows_scored or 0), 1)
    return {"gpu_hours": encode_s / 3600 if record.device.startswith("cuda") else 0.0, "instance_hours": hours,
            "cost_per_1k_items": settings.hourly_price_usd * hours / items * 1000}


def _docs_links(data_docs: dict[str, str]) -> str:
    return ", ".join(f"[{name}]({_file_link(path)})" for name, path in sorted(data_docs.items())) or "none"


def _file_link(path: str) -> str:
    return path if "://" in path else f"file://{path}"


def _number(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def summary_markdown(published: Published, inputs: dict[str, str], settings: Settings, plots: dict[str, str]) -> str:
    """Return the run's markdown summary: inputs, contracts, counts, speed, device, cost, and the plots."""
    spend, r = cost(published, settings), published.record
    rows = [
        ("run", f"`{r.run_id}` ({r.status}, run_date {r.run_date})"),
        ("items input", f"`{inputs['items_uri']}`"), ("interactions input", f"`{inputs['interactions_uri']}`"),
        ("contracts", f"row contracts and dataset suites passed; Data Docs: {_docs_links(published.data_docs)}"),
        ("items in / quarantined", f"{r.rows_in} / {r.rows_quarantined}"),
        ("interactions in / quarantined", f"{r.interactions_in} / {r.interactions_quarantined}"),
        ("items scored (computed / reused)", f"{r.rows_scored} ({r.rows_computed} / {r.rows_reused})"),
        ("users with candidates", str(r.users_with_candidates)),
        ("padding efficiency", _number(r.padding_efficiency)),
        ("texts/s (encode)", _number(r.texts_per_s, 1)),
        ("device", r.device), ("wall", f"{r.wall_seconds:.1f} s"),
        ("GPU-hours", f"{spend['gpu_hours']:.4f}"),
        (f"cost per 1k items (at ${settings.hourly_price_usd:.2f}/h)", f"${spend['cost_per_1k_items']:.4f}"),
    ]
    lines = [f"# Scoring run {r.run_id}", "", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]
    for title, uri in plots.items():
        lines += [f"### {title}", f"![{title}]({uri})", ""]
    return "\n".join(lines)


def timing_rows(stage_seconds: dict[str, float]) -> list[dict[str, Any]]:
    """Return the per-stage timing table: stage, seconds, share of the summed stage time."""
    total = sum(stage_seconds.values()) or 1.0
    return [{"stage": stage, "seconds": round(seconds, 3), "share": f"{seconds / total:.1%}"}
            for stage, seconds in stage_seconds.items()]
