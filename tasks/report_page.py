"""A finished run's report for humans: the markdown summary and the per-stage timing table of its Prefect page."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from core.settings import Settings

if TYPE_CHECKING:
    from core.records import Published, RunRecord


def cost(published: Published, settings: Settings) -> dict[str, float]:
    """Return GPU-hours (encode time on a GPU), instance-hours (wall) and the cost per 1k items at the hourly price."""
    record = published.record
    encode_s = float(published.stage_seconds.get("encode", 0.0))
    hours = float(record.wall_seconds or 0.0) / 3600
    items = max(int(record.rows_scored or 0), 1)
    return {
        "gpu_hours": encode_s / 3600 if record.device.startswith("cuda") else 0.0,
        "instance_hours": hours,
        "cost_per_1k_items": settings.ops.hourly_price_usd * hours / items * 1000,
    }


def _docs_links(data_docs: dict[str, str]) -> str:
    """Return the Data Docs of a run as text: links when served over HTTP(S), else their lake paths (never file://)."""
    return (
        ", ".join(
            f"[{name}]({path})" if path.startswith(("http://", "https://")) else f"{name} `{path}`"
            for name, path in sorted(data_docs.items())
        )
        or "none"
    )


def served_docs(data_docs: dict[str, str], lake_root: str, base_url: str | None) -> dict[str, str]:
    """Return each dataset's Data Docs page as an URL under base_url (which serves the lake root), or as it was."""
    if not base_url:
        return dict(data_docs)
    root = lake_root.split("://", 1)[-1].rstrip("/")
    served = {}
    for name, path in data_docs.items():
        relative = path.split("://", 1)[-1]
        served[name] = f"{base_url.rstrip('/')}/{relative[len(root) :].lstrip('/')}" if relative.startswith(root) else path
    return served


def contracts_line(artifact_id: str | None, data_docs: dict[str, str]) -> str:
    """Return the summary's contracts cell: a link to the run's contracts artifact (any machine with the UI), and the docs."""
    results = f"[results of every expectation](/artifacts/artifact/{artifact_id})" if artifact_id else "results in the run's log"
    return f"{results}; Data Docs: {_docs_links(data_docs)}"


def contracts_markdown(run_id: str, results: dict[str, dict[str, Any] | None], data_docs: dict[str, str]) -> str:
    """Return the run's contracts artifact: each dataset's suite version and every expectation with its observed value."""
    lines = [f"# Data contracts of run {run_id}", ""]
    for dataset, result in results.items():
        docs = _docs_links({dataset: data_docs[dataset]}) if dataset in data_docs else "none"
        if result is None:
            lines += [f"## {dataset}", "", f"no results recorded; Data Docs: {docs}", ""]
            continue
        verdict = "passed" if result.get("success") else "FAILED"
        lines += [
            f"## {dataset} (suite v{result.get('suite_version')}): {verdict}",
            "",
            f"Data Docs: {docs}",
            "",
            "| expectation | column | table | result | observed |",
            "|---|---|---|---|---|",
        ]
        for outcome in result.get("outcomes", []):
            observed = json.dumps(outcome.get("observed"), default=str)[:120]
            lines.append(
                f"| `{outcome['expectation']}` | {outcome.get('column') or ''} | {outcome.get('table')} | "
                f"{'ok' if outcome.get('success') else 'FAILED'} | `{observed}` |"
            )
        lines.append("")
    return "\n".join(lines)


def _number(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


QuarantineRule = tuple[str, str, int, str]  # dataset, rule, rows, an example row key
NOTHING_ENCODED = "n/a (nothing encoded: every vector reused)"


def summary_markdown(
    published: Published,
    inputs: dict[str, str],
    settings: Settings,
    plots: dict[str, str],
    quarantine: list[QuarantineRule] | None = None,
    docs: str | None = None,
) -> str:
    """Return the run's markdown summary: inputs, contracts, counts, quarantine per rule, truncation, speed, device, cost, plots.

    docs: the markdown of the contracts' links (Data Docs served over HTTP, or the contracts artifact); default: the
    Data Docs paths of the run.
    """
    spend, r = cost(published, settings), published.record
    computed = bool(r.rows_computed)
    rows = [
        ("run", f"`{r.run_id}` ({r.status}, run_date {r.run_date})"),
        ("items input", f"`{inputs['items_uri']}`"),
        ("interactions input", f"`{inputs['interactions_uri']}`"),
        ("contracts", f"row contracts and dataset suites passed; {docs or 'Data Docs: ' + _docs_links(published.data_docs)}"),
        ("items in / quarantined", f"{r.rows_in} / {r.rows_quarantined}"),
        ("interactions in / quarantined", f"{r.interactions_in} / {r.interactions_quarantined}"),
        ("items scored (computed / reused)", f"{r.rows_scored} ({r.rows_computed} / {r.rows_reused})"),
        ("texts truncated", _truncated(r.truncated_texts, r.rows_scored, settings.encoder.max_seq_length)),
        ("users with candidates", str(r.users_with_candidates)),
        ("candidate gate", r.candidate_gate or "n/a"),
        ("candidates published", _published_list(r.candidate_fallback)),
        ("padding efficiency", _number(r.padding_efficiency) if computed else NOTHING_ENCODED),
        ("texts/s (encode)", _number(r.texts_per_s, 1) if computed else NOTHING_ENCODED),
        ("device", r.device if computed else NOTHING_ENCODED),
        ("wall", f"{r.wall_seconds:.1f} s"),
        ("encode mode", _engine(r)),
        ("topic cascade", _cascade(r)),
        ("GPU-hours", f"{spend['gpu_hours']:.4f}"),
        (f"cost per 1k items (at ${settings.ops.hourly_price_usd:.2f}/h)", f"${spend['cost_per_1k_items']:.4f}"),
    ]
    lines = [
        f"# Scoring run {r.run_id}",
        "",
        *_warnings(r.truncated_texts, r.rows_scored, settings.encoder.max_seq_length),
        "| | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows),
        "",
        *quarantine_table(quarantine or []),
    ]
    for title, uri in plots.items():
        lines += [f"### {title}", f"![{title}]({uri})", ""]
    return "\n".join(lines)


def _engine(r: RunRecord) -> str:
    """Return the inference mode's cell: backend/precision@budget, how it was chosen, its fidelity."""
    if r.backend is None:
        return "n/a"
    how = (
        f"auto: calibrated on `{r.calibration_device_kind}`, {_number(r.calibrated_tokens_per_s, 0)} tok/s"
        if r.calibration_device_kind
        else "auto's default (not calibrated here; `nightscore calibrate`)"
        if r.engine_choice == "default"
        else "pinned"
    )
    return f"`{r.backend}/{r.precision}@{r.token_budget}` ({how}); min cosine to torch fp32 {_number(r.fidelity_min, 5)}"


def _cascade(r: RunRecord) -> str:
    """Return the cascade's cell: the large model, the budget, how many items it re-scored and why, the sample's figures."""
    if r.cascade_model_version is None:
        return "off (no large model: every topic from the small model)"
    threshold = "" if r.cascade_threshold is None else f", margin <= {r.cascade_threshold:.4f}"
    sample = (
        f"; on the sample {100 * r.cascade_agreement:.1f}% agree with all-large at {r.cascade_cost_ratio:.2f} of its cost"
        if r.cascade_agreement is not None and r.cascade_cost_ratio is not None
        else ""
    )
    return (
        f"`{r.cascade_model_version}`, budget {r.cascade_budget}: {r.routed_items} item(s) routed "
        f"({r.routed_truncated} truncated, {r.routed_margin} by margin{threshold}) in {_number(r.cascade_seconds, 1)} s{sample}"
    )


def _published_list(fallback: str | None) -> str:
    """Return which list the run published: the fused one, or the source it fell back to."""
    return f"{fallback}'s list (the fused list lost to it on validation)" if fallback else "the fused list"


def _truncated(truncated: int, texts: int, max_tokens: int) -> str:
    if not texts:
        return NOTHING_ENCODED
    return f"{truncated} of {texts} texts ({truncated / texts:.1%}) at {max_tokens} tokens"


def _warnings(truncated: int, texts: int, max_tokens: int) -> list[str]:
    if not truncated or not texts:
        return []
    return [
        f"> **Warning:** {truncated} of the run's {texts} texts ({truncated / texts:.1%}) are truncated at "
        f"{max_tokens} tokens: their ends are not in the embeddings.",
        "",
    ]


def quarantine_table(rules: list[QuarantineRule]) -> list[str]:
    """Return the markdown table of quarantined rows per rule with an example key (nothing when none was)."""
    if not rules:
        return []
    body = [f"| {dataset} | `{rule}` | {rows} | {_example(example)} |" for dataset, rule, rows, example in rules]
    return ["### Quarantined rows per rule", "", "| dataset | rule | rows | example key |", "|---|---|---|---|", *body, ""]


def _example(key: str) -> str:
    """Return a quarantined row's key as a table cell: code, or "(blank)" for an empty key."""
    shown = " ".join(key.split())[:60]
    return f"`{shown}`" if shown else "(blank)"


def timing_rows(stage_seconds: dict[str, float]) -> list[dict[str, Any]]:
    """Return the per-stage timing table: stage, seconds, share of the summed stage time."""
    total = sum(stage_seconds.values()) or 1.0
    return [
        {"stage": stage, "seconds": round(seconds, 3), "share": f"{seconds / total:.1%}"}
        for stage, seconds in stage_seconds.items()
    ]
