"""Unit tier: the deployments' parameter models, idempotency keys, callbacks and the run report."""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
from datetime import date
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pydantic
import pytest

from core.settings import OpsSettings, Settings
from deployments.definitions import QUEUE_PRIORITIES, deployment_specs
from deployments.trigger import default_idempotency_key
from flows.params import BackfillParams, NightlyParams, OnDemandParams
from tasks.callback import UnsafeCallback, callback_addresses, check_callback_url, completion_payload, pinned_request, post_json
from tasks.report_page import cost, summary_markdown, timing_rows
from tests.helpers import published


@pytest.mark.parametrize(
    "bad",
    [
        {"items_uri": "a.parquet"},  # interactions missing
        {"run_date": "2026-13-01"},
        {"run_date": "20261130"},  # pydantic alone would read digits as a Unix time
        {"run_date": "9999-12-31"},  # the end of that day does not exist
        {"callback_url": "not a url"},
        {"callback_url": "file:///etc/passwd"},
        {"callback_url": "http://169.254.169.254/latest/meta-data/"},
        {"callback_url": "http://127.0.0.1:9000/done"},
        {"callback_url": "http://localhost/done"},
        {"callback_url": "http://[fd00::1]/done"},
        {"callback_url": "http://0x7f.1/done"},
        {"colour": "blue"},  # unknown parameters are refused, not ignored
    ],
)
def test_nightly_params_refuse_bad_input(bad: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        NightlyParams(**bad)


def test_private_callbacks_are_allowed_only_by_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert str(NightlyParams(callback_url="https://hooks.example.com/done").callback_url) == "https://hooks.example.com/done"
    monkeypatch.setenv("NIGHTSCORE_CALLBACK_ALLOW_PRIVATE", "true")
    assert NightlyParams(callback_url="http://127.0.0.1:9000/done").callback_url is not None
    with pytest.raises(pydantic.ValidationError):
        NightlyParams(callback_url="file:///etc/passwd")  # the scheme rule has no setting


def flow_schema(flow: Any, allow_private: bool = False) -> dict[str, Any]:
    """Return the parameter schema `nightscore deploy` registers for a flow."""
    from prefect.utilities.callables import parameter_schema

    from deployments.deploy import strict_parameter_schema

    return strict_parameter_schema(parameter_schema(flow).model_dump_for_openapi(), allow_private)


@pytest.mark.parametrize(
    "parameters",
    [
        {"items_uri": "i.parquet", "interactions_uri": "x.parquet"},  # not wrapped in params
        {"params": {}, "extra": 1},
        {"params": {"run_date": "20261130"}},
        {"params": {"run_date": "9999-12-31"}},
        {"params": {"callback_url": "ftp://example.com/x"}},
        {"params": {"callback_url": "http://169.254.169.254/"}},
        {"params": {"callback_url": "http://user@10.0.0.8:80/"}},
        {"params": {"item_ids": []}},
        {"params": {"item_ids": [" "]}},
    ],
)
def test_the_deployment_schema_refuses_what_the_server_must(parameters: dict[str, Any]) -> None:
    from prefect.utilities.schema_tools.validation import validate

    from flows.on_demand import on_demand

    assert validate(parameters, flow_schema(on_demand)), parameters


def test_the_deployment_schema_accepts_good_parameters_and_private_callbacks_by_setting() -> None:
    from prefect.utilities.schema_tools.validation import validate

    from flows.on_demand import on_demand

    good = {
        "params": {
            "items_uri": "s3://lake/i.parquet",
            "interactions_uri": "s3://lake/x.parquet",
            "item_ids": ["7"],
            "run_date": "2026-11-30",
            "callback_url": "https://hooks.example.com/done",
        }
    }
    assert validate(good, flow_schema(on_demand)) == [] and validate({}, flow_schema(on_demand)) == []
    loopback = {"params": {"callback_url": "http://127.0.0.1:9000/done"}}
    assert validate(loopback, flow_schema(on_demand)) and validate(loopback, flow_schema(on_demand, True)) == []


def test_post_json_never_calls_an_internal_address_unless_allowed() -> None:
    import socket

    server = HTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Flaky.bodies.clear()
    _Flaky.failures = 0
    port = server.server_port
    try:
        for url in (f"http://127.0.0.1:{port}/cb", f"http://localhost:{port}/cb", f"http://2130706433:{port}/cb"):
            assert post_json(url, {"x": 1}, attempts=1) is False
        name = socket.gethostname()  # a host name: refused by what it resolves to, just before the POST
        if all(not ipaddress.ip_address(i[4][0]).is_global for i in socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)):
            assert post_json(f"http://{name}:{port}/cb", {"x": 1}, attempts=1) is False
        assert _Flaky.bodies == []
        assert post_json(f"http://127.0.0.1:{port}/cb", {"x": 2}, attempts=1, allow_private=True)
        assert _Flaky.bodies == [{"x": 2}]
    finally:
        server.shutdown()
        server.server_close()
        _Flaky.failures = 2
        _Flaky.bodies.clear()


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


def test_idempotency_key_is_stable_for_a_retry_and_changes_with_parameters_or_inputs() -> None:
    params = OnDemandParams(items_uri="s3://lake/i.parquet", interactions_uri="s3://lake/x.parquet")
    inputs = {"s3://lake/i.parquet": {"size": "10", "ETag": "a"}, "s3://lake/x.parquet": {"size": "20", "ETag": "b"}}
    key = default_idempotency_key("on-demand", params, inputs)
    assert key == default_idempotency_key("on-demand", params.model_copy(), dict(inputs))
    assert key != default_idempotency_key("on-demand", params.model_copy(update={"item_ids": ["7"]}), inputs)
    assert key != default_idempotency_key("on-demand", params, {**inputs, "s3://lake/i.parquet": {"size": "10", "ETag": "c"}})


def test_deployment_specs_follow_settings_and_put_on_demand_first() -> None:
    specs = {s.name: s for s in deployment_specs(Settings(ops=OpsSettings(nightly_cron="30 2 * * *")))}
    assert set(specs) == {"nightly", "on-demand", "backfill", "train-ranker"}
    assert specs["nightly"].cron == "30 2 * * *" and specs["on-demand"].cron is None
    assert QUEUE_PRIORITIES[specs["on-demand"].queue] < QUEUE_PRIORITIES[specs["nightly"].queue]


class _Flaky(BaseHTTPRequestHandler):
    """Answers 500 to the first `failures` POSTs, then 204; records the bodies."""

    failures = 2
    bodies: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
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
        assert post_json(f"http://127.0.0.1:{server.server_port}/cb", payload, attempts=4, backoff_s=0.01, allow_private=True)
    finally:
        server.shutdown()
        server.server_close()  # the port now refuses connections
    assert len(_Flaky.bodies) == 3 and _Flaky.bodies[-1]["counts"]["rows_scored"] == 5
    assert _Flaky.bodies[-1]["run_id"] == "r1" and _Flaky.bodies[-1]["counts"]["cache_entries"] == 10
    assert (
        post_json(
            f"http://127.0.0.1:{server.server_port}/cb", payload, attempts=2, backoff_s=0.01, timeout_s=2, allow_private=True
        )
        is False
    )


def test_report_cost_and_markdown() -> None:
    settings = Settings(ops=OpsSettings(hourly_price_usd=3.6))
    summary = published()
    spend = cost(summary, settings)
    assert spend["gpu_hours"] == pytest.approx(0.01) and spend["cost_per_1k_items"] == pytest.approx(0.05)
    assert cost(published(device="cpu"), settings)["gpu_hours"] == 0.0
    plots = {"Topics": "data:image/png;base64,AA"}
    text = summary_markdown(summary, {"items_uri": "i", "interactions_uri": "x"}, settings, plots)
    assert "items `/lake/docs/index.html`" in text and "file://" not in text and "![Topics](data:image/png;base64,AA)" in text
    assert [r["share"] for r in timing_rows(summary.stage_seconds)] == ["90.0%", "10.0%"]


@pytest.mark.parametrize(
    "host",
    [
        "[::127.0.0.1]",  # IPv4-compatible loopback
        "[::a9fe:a9fe]",  # IPv4-compatible metadata address
        "[64:ff9b::7f00:1]",  # NAT64 of 127.0.0.1
        "[64:ff9b::169.254.169.254]",  # NAT64 of the metadata address
        "[64:ff9b:1::808:808]",  # local-use NAT64: inside by definition
        "[2002:7f00:1::]",  # 6to4 of 127.0.0.1
        "[2002:a9fe:a9fe::1]",  # 6to4 of the metadata address
        "[::ffff:10.0.0.1]",  # IPv4-mapped
        "[0:0::1]",
    ],
)
def test_ipv6_forms_that_carry_an_internal_ipv4_address_are_refused(host: str) -> None:
    with pytest.raises(UnsafeCallback, match="loopback, link-local or private"):
        check_callback_url(f"http://{host}/cb", allow_private=False)
    with pytest.raises(pydantic.ValidationError):
        NightlyParams(callback_url=f"http://{host}/cb")
    from prefect.utilities.schema_tools.validation import validate

    from flows.on_demand import on_demand

    assert validate({"params": {"callback_url": f"http://{host}/cb"}}, flow_schema(on_demand)), host


@pytest.mark.parametrize("host", ["[64:ff9b::808:808]", "[2002:808:808::1]", "[2606:4700::1111]"])
def test_ipv6_forms_that_carry_a_public_ipv4_address_pass_the_worker_check(host: str) -> None:
    assert check_callback_url(f"http://{host}/cb", allow_private=False)


def test_a_name_that_does_not_resolve_is_refused() -> None:
    def nowhere(*_args: Any, **_kwargs: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(UnsafeCallback, match="does not resolve"):
        callback_addresses("https://hooks.invalid/cb", allow_private=False, resolver=nowhere)
    assert post_json("https://hooks.invalid/cb", {"x": 1}, attempts=1, resolver=nowhere) is False


PUBLIC = "198.51.100.7"  # stands for the name's public address; TEST-NET-2, so nothing answers there


def test_a_rebinding_resolver_never_reaches_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The name answers a public address to the check and loopback afterwards: the POST must go to the checked one."""
    server = HTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Flaky.bodies.clear()
    real, asked = socket.getaddrinfo, []

    def rebinding(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host != "rebind.example":
            return real(host, port, *args, **kwargs)
        asked.append(host)
        address = PUBLIC if len(asked) == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)  # what httpx would resolve with, too
    monkeypatch.setattr("tasks.callback.is_internal", lambda a: str(a) != PUBLIC and not a.is_global)
    try:
        url = f"http://rebind.example:{server.server_port}/cb"
        assert post_json(url, {"x": 1}, attempts=3, backoff_s=0.01, timeout_s=0.5, resolver=rebinding) is False
    finally:
        server.shutdown()
        server.server_close()
    assert _Flaky.bodies == [] and asked == ["rebind.example"]  # resolved once; loopback never reached


def test_a_pinned_request_keeps_the_host_header_and_the_tls_name() -> None:
    pinned = pinned_request("https://user:pw@Hooks.Example.com:8443/cb?x=1", ipaddress.ip_address("2606:4700::1111"))
    assert pinned.url == "https://user:pw@[2606:4700::1111]:8443/cb?x=1"
    assert pinned.headers == {"Host": "hooks.example.com:8443"} and pinned.extensions == {"sni_hostname": "hooks.example.com"}
    plain = pinned_request("http://hooks.example.com/cb", ipaddress.ip_address("93.184.216.34"))
    assert plain.url == "http://93.184.216.34/cb" and plain.headers == {"Host": "hooks.example.com"} and plain.extensions == {}


def test_the_attempts_take_the_checked_addresses_in_turn() -> None:
    """A name with an address that does not answer first: the retry goes to its next address, not the same one."""
    server = HTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Flaky.bodies.clear()
    _Flaky.failures = 0

    def two_addresses(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in (PUBLIC, "127.0.0.1")]

    try:
        url = f"http://hooks.example:{server.server_port}/cb"
        assert post_json(url, {"x": 3}, attempts=2, backoff_s=0.01, timeout_s=0.5, allow_private=True, resolver=two_addresses)
        assert _Flaky.bodies == [{"x": 3}]
    finally:
        server.shutdown()
        server.server_close()
        _Flaky.failures = 2
        _Flaky.bodies.clear()
