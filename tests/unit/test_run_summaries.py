"""Unit tier: what a run's summaries say (terminal and Prefect UI) and the trigger's idempotency key (issue 18, items
13 and 15)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from core.settings import EncoderSettings, Settings
from deployments.trigger import default_idempotency_key, inputs_identity
from flows.params import OnDemandParams
from nightscore.output import summary_text
from storage.lake import Lake
from tasks.report_page import summary_markdown
from tests.helpers import published

REUSE_ONLY = {
    "rows_computed": 0,
    "rows_reused": 2000,
    "device": "none",
    "padding_efficiency": None,
    "texts_per_s": None,
    "real_tokens": 0,
    "padded_tokens": 0,
    "truncated_texts": 0,
}
RULES = [("items", "text:not_blank", 3, "item-0005"), ("interactions", "item_id:item_exists", 1, "u1|item-0005|2026")]


def test_a_reuse_only_run_names_no_device_and_no_padding_efficiency() -> None:
    run = published(**REUSE_ONLY)
    text = summary_text(run, 41.0)
    assert " on none" not in text and "padding efficiency" not in text and "nothing to encode" in text
    markdown = summary_markdown(run, {"items_uri": "i", "interactions_uri": "x"}, Settings(), {})
    assert "| device | n/a (nothing encoded" in markdown and "| padding efficiency | n/a (nothing encoded" in markdown
    assert "1.000" not in markdown and "| none |" not in markdown


def test_the_headline_time_includes_prefects_start_up() -> None:
    headline = summary_text(published(wall_seconds=27.9), 41.2).splitlines()[0]
    assert re.search(r"published in 41\.2s \(the run 27\.9s, Prefect start-up and the rest 13\.3s\) on cuda:0$", headline)
    assert "published in 27.9s on" in summary_text(published(wall_seconds=27.9)).splitlines()[0]


def test_quarantine_per_rule_and_truncation_are_in_both_summaries() -> None:
    run = published(truncated_texts=150, rows_computed=11, rows_reused=1989, rows_scored=2000)  # most vectors reused
    text = summary_text(run, quarantine=RULES, max_tokens=256)
    assert "  quarantined items text:not_blank: 3 (e.g. item-0005)" in text
    assert "  quarantined interactions item_id:item_exists: 1 (e.g. u1|item-0005|2026)" in text
    assert "warning: 150 of the run's 2000 texts (7.5%) are truncated at 256 tokens" in text  # never "150 of 11"
    markdown = summary_markdown(
        run, {"items_uri": "i", "interactions_uri": "x"}, Settings(encoder=EncoderSettings(max_seq_length=256)), {}, RULES
    )
    assert "| items | `text:not_blank` | 3 | `item-0005` |" in markdown
    assert "**Warning:** 150 of the run's 2000 texts (7.5%) are truncated at 256 tokens" in markdown
    clean = summary_text(published(truncated_texts=0))
    assert "quarantined items" not in clean and "warning" not in clean


def test_an_older_run_date_says_it_is_not_the_latest() -> None:
    assert "older than the latest run nightly-2026-12-01-aa" in summary_text(published(), latest_run="nightly-2026-12-01-aa")
    assert "older than" not in summary_text(published(), latest_run="r1")


def test_the_default_key_follows_the_inputs_identity_not_the_day(tmp_path: Path) -> None:
    items, interactions = tmp_path / "items.parquet", tmp_path / "interactions.parquet"
    items.write_bytes(b"one")
    interactions.write_bytes(b"two")
    lake = Lake(str(tmp_path))
    params = OnDemandParams(items_uri=str(items), interactions_uri=str(interactions))

    def key(p: OnDemandParams = params) -> str:
        return default_idempotency_key("on-demand", p, inputs_identity(lake, [p.items_uri, p.interactions_uri], None))

    first = key()
    assert key() == first  # a retry of the same request on the same files: the same run
    assert key(params.model_copy(update={"item_ids": ["7"]})) != first
    items.write_bytes(b"one, re-exported")  # the same name, a new file 45 minutes later
    os.utime(items, (time.time() + 2700, time.time() + 2700))
    assert key() != first
    latest = OnDemandParams()  # no files given: the latest publication is the input
    assert default_idempotency_key("on-demand", latest, inputs_identity(lake, [None, None], "run-a")) != default_idempotency_key(
        "on-demand", latest, inputs_identity(lake, [None, None], "run-b")
    )


def test_a_blank_or_long_example_key_reads_as_one_plain_line() -> None:
    run = published()
    text = summary_text(run, quarantine=[("items", "item_id:not_blank", 2, ""), ("items", "text:x", 1, "a\nb" + "c" * 100)])
    assert "item_id:not_blank: 2 (e.g. a blank key)" in text and "(e.g. )" not in text
    line = next(line for line in text.splitlines() if "text:x" in line)
    assert "a b" in line and line.endswith("...)") and len(line) < 120


def test_the_candidate_gate_and_a_fallback_source_are_in_both_summaries() -> None:
    gate = "not enough data to gate: 12 held-out users (fewer than 50)"
    run = published(candidate_gate=gate, candidate_fallback="cooccurrence")
    text = summary_text(run)
    assert f"  candidate gate {gate}" in text
    assert "note: the fused list lost to cooccurrence on the validation split: the candidates are cooccurrence's list" in text
    markdown = summary_markdown(run, {"items_uri": "i", "interactions_uri": "x"}, Settings(), {})
    assert f"| candidate gate | {gate} |" in markdown
    assert "| candidates published | cooccurrence's list (the fused list lost to it on validation) |" in markdown
    plain = summary_text(published())
    assert "candidate gate" not in plain and "lost to" not in plain
