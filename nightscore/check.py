"""`nightscore contracts check`: the input contracts on a pair of files, without scoring anything (no Prefect)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import polars as pl

from core.errors import InputUnreadable
from core.settings import Settings
from data_contracts.datasets import DatasetReport, SuiteParams, render_failures, validate_dataset
from data_contracts.inputs import INTERACTION_COLUMNS, ITEM_COLUMNS, InputRules, validate_interactions, validate_items
from data_contracts.quarantine import MAY_BE_EMPTY, REQUIRED_COLUMNS, require_columns
from storage.lake import Lake
from storage.published_stats import PublishedStats, published_stats
from storage.warehouse.base import Warehouse
from storage.warehouse.runs import PublishedRun


@dataclass(frozen=True)
class InputCheck:
    """What the input contracts say about two files: per-rule failures, counts and suite reports."""

    by_rule: pl.DataFrame  # dataset, rule, failures, example
    rows: dict[str, int]
    quarantined: dict[str, int]
    suites: list[DatasetReport]
    compared_with: PublishedRun | None = None  # the published run the suites held the files to, as a run would

    def passed(self, max_share: float) -> bool:
        """Return whether every dataset stays within the quarantine share and every suite passed."""
        shares_ok = all(self.quarantined[d] <= max_share * self.rows[d] for d in self.rows)
        return shares_ok and all(report.success for report in self.suites)


def _read(lake: Lake, uri: str, dataset: str, columns: dict[str, pl.DataType]) -> pl.DataFrame:
    raw = lake.read_parquet(uri, dataset, columns=list(columns))
    require_columns(raw, REQUIRED_COLUMNS[dataset], dataset, uri)
    if raw.height == 0 and dataset not in MAY_BE_EMPTY:
        raise InputUnreadable(f"{dataset} file {uri}: no rows")
    return raw


def check_inputs(
    lake: Lake,
    settings: Settings,
    items_uri: str,
    interactions_uri: str,
    now: datetime | None = None,
    warehouse: Warehouse | None = None,
) -> InputCheck:
    """Return the row and dataset contract results for items and interactions files (nothing is written).

    With a warehouse, the dataset suites compare the files with its latest published run, as the next run would.
    """
    now = now or datetime.now(UTC)
    rules = InputRules(
        not_after=now + timedelta(hours=settings.contracts.future_tolerance_hours),
        max_text_chars=settings.contracts.max_text_chars,
        duplicate_policy=settings.contracts.duplicate_id_policy,
    )
    raw_items = _read(lake, items_uri, "items", ITEM_COLUMNS)
    raw_inter = _read(lake, interactions_uri, "interactions", INTERACTION_COLUMNS)
    items, q_items = validate_items(raw_items, rules, items_uri)
    interactions, q_inter = validate_interactions(raw_inter, items.get_column("item_id"), rules, interactions_uri)
    quarantine = pl.concat([q_items, q_inter])
    by_rule = (
        quarantine.group_by("dataset", "rule", maintain_order=True)
        .agg(pl.len().alias("failures"), pl.col("value").first().alias("example"))
        .sort("failures", descending=True)
    )
    params, valid = SuiteParams.from_settings(settings), {"items": items, "interactions": interactions}
    previous = published_stats(lake, warehouse, valid) if warehouse else PublishedStats(None, dict.fromkeys(valid))
    suites = [validate_dataset(name, frame, previous.stats[name], params) for name, frame in valid.items()]
    return InputCheck(
        by_rule,
        {"items": raw_items.height, "interactions": raw_inter.height},
        {"items": raw_items.height - items.height, "interactions": raw_inter.height - interactions.height},
        suites,
        previous.run,
    )


def check_report(check: InputCheck, max_share: float) -> str:
    """Return the check as text: a rule -> failures table, quarantined shares, suite failures, the verdict."""
    lines = [f"{'dataset':<14}{'rule':<44}{'failures':>9}  example"]
    for dataset, rule, failures, example in check.by_rule.iter_rows():
        lines.append(f"{dataset:<14}{rule[:43]:<44}{failures:>9}  {str(example)[:60]}")
    if check.by_rule.height == 0:
        lines.append("(no row fails its contract)")
    for dataset, rows in check.rows.items():
        lines.append(
            f"{dataset}: {check.quarantined[dataset]} of {rows} rows would be quarantined "
            f"({check.quarantined[dataset] / rows:.1%}; limit {max_share:.0%})"
        )
    run = check.compared_with
    lines.append(
        f"dataset suites compared with the published run {run.run_id} ({run.run_date})"
        if run
        else "dataset suites: no published run to compare with (a first run's checks)"
    )
    lines += [render_failures(r) for r in check.suites if not r.success]
    lines.append("PASS" if check.passed(max_share) else "FAIL: a run on these files would stop with exit code 3")
    return "\n".join(lines)
