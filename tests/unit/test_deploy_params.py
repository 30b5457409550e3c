"""Unit tier: the deployments' parameter models, idempotency keys, callbacks and the run report."""

from __future__ import annotations

import json
import threading
from datetime import date, datetime, timezone
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pydantic
import pytest

from tests.helpers import published
from deployments.definitions import QUEUE_PRIORITIES, deployment_specs
from deployments.trigger import default_idempotency_key
from flows.params import BackfillParams, NightlyParams, OnDemandParams
from nightscore.callback import completion_payload, post_json
from nightscore.report import cost, summary_markdown, timing_rows
from nightscore.settings import Settings


@pytest.mark.parametrize("bad", [
    {"items_uri": "a.parquet"},  # interactions missing
    {"run_date": "2026-13-01"},
    {"callback_url": "not a url"},
    {"colour": "blue"},  # unknown parameters are refused, not ignored
])
def test_nightly_params_refuse_bad_input(bad: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        NightlyParams(**bad)


def test_backfill_params_need_an_ordered_bounded_range() -> None:
    assert BackfillParams(start_date="2026-11-01", end_date="2026-11-03").end_date == date(2026, 11, 3)
    with pytest.raises(pydantic.ValidationError, match="before start_date"):
        BackfillParams(start_date="2026-11-03", end_date="2026-11-01")
    with pytest.raises(pydantic.ValidationError, match="at most 366"):
        BackfillParams(start_date="2025-01-01", end_date="2026-11-01")
    with pytest.raises(pydantic.ValidationError, match="non-blank"):
        OnDemandParams(item_ids=["  "])


def test_every_parameter_has_a_description_for_the_ui_form() -> None:
    for model in (NightlyParams, OnDemandParams, BackfillParams):
        assert all(field.description for field in model.model_fields.values()), model.__name__


def test_idempotency_key_is_stable_for_a_retry_and_changes_with_parameters_or_day() -> None:
    day = datetime(2026, 11, 30, 9, tzinfo=timezone.utc)
    params = OnDemandParams(items_uri="s3://lake/i.parquet", interactions_uri="s3://lake/x.parquet")
    key = default_idempotency_key("on-demand", params, day)
    assert key == default_idempotency_key("on-demand", params.model_copy(), day)
    assert key != default_idempotency_key("on-demand", params.model_copy(update={"item_ids": ["7"]}), day)
    assert key != default_idempotency_key("on-demand", params, datetime(2026, 12, 1, tzinfo=timezone.utc))


def test_deployment_specs_follow_settings_and_put_on_demand_first() -> None:
    specs = {s.name: s for s in deployment_specs(Settings(nightly_cron="30 2 * * *"))}
    assert set(specs) == {"nightly", "on-demand", "backfill", "train-ranker"}
    assert specs["nightly"].cron == "30 2 * * *" and specs["on-demand"].cron is None
    assert QUEUE_PRIORITIES[specs["on-demand"].queue] < QUEUE_PRIORITIES[specs["nightly"].queue]


class _Flaky(BaseHTTPRequestHandler):
    """Answers 500 to the first `failures` POSTs, then 204; records the bodies."""

    failures = 2
    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        _Flaky.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(500 if len(_Flaky.bodies) <= _Flaky.failures else 204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_callback_retries_until_accepted_and_gives_up_without_raising() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    payload = completion_payload("fr-1", "COMPLETED", published(rows_scored=5), None)
    try:
        assert post_json(f"http://127.0.0.1:{server.server_port}/cb", payload, attempts=4, backoff_s=0.01)
    finally:
        server.shutdown()
        server.server_close()  # the port now refuses connections
    assert len(_Flaky.bodies) == 3 and _Flaky.bodies[-1]["counts"]["rows_scored"] == 5
    assert _Flaky.bodies[-1]["run_id"] == "r1" and _Flaky.bodies[-1]["counts"]["cache_entries"] == 10
    assert post_json(f"http://127.0.0.1:{server.server_port}/cb", payload, attempts=2, backoff_s=0.01, timeout_s=2) is False


def test_report_cost_and_markdown() -> None:
    settings = Settings(hourly_price_usd=3.6)
    summary = published()
    spend = cost(summary, settings)
    assert spend["gpu_hours"] == pytest.approx(0.01) and spend["cost_per_1k_items"] == pytest.approx(0.05)
    assert cost(published(device="cpu"), settings)["gpu_hours"] == 0.0
    text = summary_markdown(summary, {"items_uri": "i", "interactions_uri": "x"}, settings, {"Topics": "data:image/png;base64,AA"})
    assert "[items](file:///lake/docs/index.html)" in text and "![Topics](data:image/png;base64,AA)" in text
    assert [r["share"] for r in timing_rows(summary.stage_seconds)] == ["90.0%", "10.0%"]
