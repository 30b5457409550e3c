"""A finished run's report for humans: the markdown summary and the per-stage timing table of its Prefect page."""

from __future__ import annotations

from typing import Any

from nightscore.settings import Settings


def cost(summary: dict[str, Any], settings: Settings) -> dict[str, float]:
    """Return GPU-hours (encode time on a GPU), instance-hours (wall) and the cost per 1k items at the hourly price."""
    encode_s = float(summary.get("stage_seconds", {}).get("encode", 0.0))
    on_gpu = str(summary.get("device", "")).startswith("cuda")
    hours = float(summary.get("wall_seconds") or 0.0) / 3600
    items = max(int(summary.get("rows_scored") or 0), 1)
    return {"gpu_hours": encode_s / 3600 if on_gpu else 0.0, "instance_hours": hours,
            "cost_per_1k_items": settings.hourly_price_usd * hours / items * 1000}


def _docs_links(data_docs: dict[str, str]) -> str:
    return ", ".join(f"[{name}]({_file_link(path)})" for name, path in sorted(data_docs.items())) or "none"


def _file_link(path: str) -> str:
    return path if "://" in path else f"file://{path}"


def summary_markdown(summary: dict[str, Any], inputs: dict[str, str], settings: Settings, plots: dict[str, str]) -> str:
    """Return the run's markdown summary: inputs, contracts, counts, speed, device, cost, and the plots."""
    spend = cost(summary, settings)
    rows = [
        ("run", f"`{summary['run_id']}` ({summary.get('status', '?')}, run_date {summary.get('run_date')})"),
        ("items input", f"`{inputs['items_uri']}`"), ("interactions input", f"`{inputs['interactions_uri']}`"),
        ("contracts", f"row contracts and dataset suites passed; Data Docs: {_docs_links(summary.get('data_docs') or {})}"),
        ("items in / quarantined", f"{summary.get('rows_in')} / {summary.get('rows_quarantined')}"),
        ("interactions in / quarantined", f"{summary.get('interactions_in')} / {summary.get('interactions_quarantined')}"),
        ("items scored (computed / reused)", f"{summary.get('rows_scored')} ({summary.get('rows_computed')} / {summary.get('rows_reused')})"),
        ("users with candidates", str(summary.get("users_with_candidates"))),
        ("padding efficiency", f"{float(summary.get('padding_efficiency') or 0):.3f}"),
        ("texts/s (encode)", f"{float(summary.get('texts_per_s') or 0):.1f}"),
        ("device", str(summary.get("device"))), ("wall", f"{float(summary.get('wall_seconds') or 0):.1f} s"),
        ("GPU-hours", f"{spend['gpu_hours']:.4f}"),
        (f"cost per 1k items (at ${settings.hourly_price_usd:.2f}/h)", f"${spend['cost_per_1k_items']:.4f}"),
    ]
    lines = [f"# Scoring run {summary['run_id']}", "", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]
    for title, uri in plots.items():
        lines += [f"### {title}", f"![{title}]({uri})", ""]
    return "\n".join(lines)


def timing_rows(stage_seconds: dict[str, float]) -> list[dict[str, Any]]:
    """Return the per-stage timing table: stage, seconds, share of the summed stage time."""
    total = sum(stage_seconds.values()) or 1.0
    return [{"stage": stage, "seconds": round(seconds, 3), "share": f"{seconds / total:.1%}"}
            for stage, seconds in stage_seconds.items()]
