"""Run-completion callbacks: POST a small JSON document to a caller's URL (httpx), retried with backoff (tenacity).

A callback URL is http or https only, and may not name a loopback, link-local, private or otherwise non-global
address (a cloud metadata endpoint, the worker's own services) unless ``callback_allow_private`` is set:
`check_callback_url` refuses literal addresses when a run is submitted (flows/params.py, and the deployments'
schema) and every address the host name resolves to just before the POST.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

if TYPE_CHECKING:
    from core.records import Published

log = logging.getLogger(__name__)

COUNT_KEYS = (
    "rows_in",
    "rows_quarantined",
    "rows_scored",
    "rows_computed",
    "rows_reused",
    "interactions_in",
    "interactions_quarantined",
    "users_with_candidates",
)
TABLES = ("item_scores", "user_candidates", "latest_item_scores", "latest_user_candidates", "scoring_runs", "quarantine")


def completion_payload(
    flow_run_id: str, state: str, published: Published | None, run_id: str | None, message: str | None = None
) -> dict[str, Any]:
    """Return the callback document: flow run id, run id, final state, counts and the tables that hold the rows."""
    counts: dict[str, Any] = {}
    if published is not None:
        row = published.record.row()
        counts = {key: row[key] for key in COUNT_KEYS} | {"cache_entries": published.cache_entries}
    return {
        "flow_run_id": flow_run_id,
        "run_id": published.run_id if published else run_id,
        "state": state,
        "counts": counts,
        "tables": list(TABLES) if state == "COMPLETED" else [],
        "message": message,
    }


class CallbackRefused(Exception):
    """The callback URL answered with a status other than 2xx."""


class UnsafeCallback(ValueError):
    """A callback URL nightscore will not call: not http(s), or an address inside the worker's network."""


Address = ipaddress.IPv4Address | ipaddress.IPv6Address
LOOPBACK_NAMES = ("localhost", "localhost.localdomain")


def literal_address(host: str) -> Address | None:
    """Return the address a host names literally (IPv6 in brackets, dotted, decimal, hex or octal IPv4), or None."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    try:  # what the resolver also accepts: 2130706433, 0x7f.1, 0177.0.0.1
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def is_internal(address: Address) -> bool:
    """Return whether an address is not a public unicast one (loopback, link-local, private, shared, reserved...)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return is_internal(address.ipv4_mapped)
    return not address.is_global or address.is_multicast


def check_callback_url(url: str, allow_private: bool, resolve: bool = False) -> str:
    """Return url when nightscore may POST to it; raise UnsafeCallback naming why not.

    Args:
        url: the callback URL.
        allow_private: accept internal addresses (single-host setups, tests).
        resolve: also resolve the host name and check every address it has (done just before a POST).
    """
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise UnsafeCallback(f"callback_url must be an http(s) URL with a host, got {url!r}")
    host = parts.hostname.lower()
    if allow_private:
        return url
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        raise UnsafeCallback(f"callback_url {url!r} names the local host (NIGHTSCORE_CALLBACK_ALLOW_PRIVATE allows it)")
    addresses = [literal_address(host)]
    if addresses[0] is None and resolve:
        addresses = _resolved(host, parts.port)
    internal = [str(a) for a in addresses if a is not None and is_internal(a)]
    if internal:
        raise UnsafeCallback(
            f"callback_url {url!r} leads to {', '.join(internal)}, a loopback, link-local or private "
            "address (NIGHTSCORE_CALLBACK_ALLOW_PRIVATE allows it)"
        )
    return url


def _resolved(host: str, port: int | None) -> list[Address | None]:
    """Return every address a host name resolves to (none when it does not resolve: the POST then fails on its own)."""
    try:
        infos = socket.getaddrinfo(host, port or 443, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


def post_json(
    url: str,
    payload: dict[str, Any],
    attempts: int = 4,
    backoff_s: float = 1.0,
    timeout_s: float = 10.0,
    allow_private: bool = False,
) -> bool:
    """POST payload to url, retrying failures with exponential backoff; return whether it was accepted (2xx).

    An unsafe URL (`check_callback_url`, host resolved now) is never called: logged, and False returned.
    """
    try:
        check_callback_url(url, allow_private, resolve=True)
    except UnsafeCallback as exc:
        log.warning("callback refused: %s", exc)
        return False
    retrying = Retrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=backoff_s),
        retry=retry_if_exception_type((httpx.HTTPError, CallbackRefused)),
        before_sleep=lambda s: log.warning(
            "callback %s failed (attempt %d of %d): %s",
            url,
            s.attempt_number,
            attempts,
            s.outcome.exception() if s.outcome else "",
        ),
    )
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=False) as client:
            status = retrying(_post, client, url, payload)
    except RetryError as exc:
        log.warning("callback %s gave up after %d attempts: %s", url, attempts, exc.last_attempt.exception())
        return False
    log.info("callback %s answered %d", url, status)
    return True


def _post(client: httpx.Client, url: str, payload: dict[str, Any]) -> int:
    response = client.post(url, json=payload)
    if not response.is_success:
        raise CallbackRefused(f"HTTP {response.status_code}")
    return response.status_code
