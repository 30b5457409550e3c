"""Run-completion callbacks: POST a small JSON document to a caller's URL (httpx), retried with backoff (tenacity).

A callback URL is http or https only, and may not name a loopback, link-local, private or otherwise non-global
address (a cloud metadata endpoint, the worker's own services), nor an IPv6 address that carries such an IPv4 one
(IPv4-mapped or -compatible, NAT64, 6to4, Teredo), unless ``callback_allow_private`` is set. `check_callback_url`
refuses literal addresses when a run is submitted (flows/params.py, and the deployments' schema). Just before the
POST the host name is resolved once: a name that does not resolve, or that has any internal address, is refused,
and the POST (and every retry) connects to the address that was checked, with the URL's Host header and TLS server
name, so a DNS answer that changes between the check and the connection (rebinding) can never reach inside.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
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
    """A callback URL nightscore will not call: not http(s), an address inside the worker's network, or no address."""


Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[..., list[Any]]  # socket.getaddrinfo's signature
LOOPBACK_NAMES = ("localhost", "localhost.localdomain")
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # the well-known prefix: the IPv4 address is the last 32 bits
LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")  # local-use translation (RFC 8215): inside by definition
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated ::a.b.c.d, still routed by some stacks


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


def embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """Return the IPv4 addresses an IPv6 one carries: IPv4-mapped or -compatible, NAT64, 6to4, Teredo (server, client)."""
    found = [address.ipv4_mapped, address.sixtofour, *(address.teredo or ())]
    if address in NAT64 or address in IPV4_COMPATIBLE:
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return [a for a in found if a is not None]


def is_internal(address: Address) -> bool:
    """Return whether an address is not a public unicast one (loopback, link-local, private, shared, reserved...)."""
    if isinstance(address, ipaddress.IPv6Address) and (
        address in LOCAL_NAT64 or any(is_internal(inner) for inner in embedded_ipv4(address))
    ):
        return True
    return not address.is_global or address.is_multicast


def _refuse_internal(url: str, addresses: list[Address]) -> None:
    """Raise UnsafeCallback naming the internal addresses among those a URL leads to."""
    internal = [str(a) for a in addresses if is_internal(a)]
    if internal:
        raise UnsafeCallback(
            f"callback_url {url!r} leads to {', '.join(internal)}, a loopback, link-local or private "
            "address (NIGHTSCORE_CALLBACK_ALLOW_PRIVATE allows it)"
        )


def check_callback_url(url: str, allow_private: bool, resolve: bool = False, resolver: Resolver = socket.getaddrinfo) -> str:
    """Return url when nightscore may POST to it; raise UnsafeCallback naming why not.

    Args:
        url: the callback URL.
        allow_private: accept internal addresses (single-host setups, tests).
        resolve: also resolve the host name and check every address it has (done just before a POST; see
            `callback_addresses`, which also returns them).
        resolver: getaddrinfo, or a stand-in (tests).
    """
    if resolve:
        callback_addresses(url, allow_private, resolver)
        return url
    host = _host(url)
    if not allow_private:
        _refuse_local_name(url, host)
        literal = literal_address(host)
        _refuse_internal(url, [literal] if literal is not None else [])
    return url


def callback_addresses(url: str, allow_private: bool, resolver: Resolver = socket.getaddrinfo) -> list[Address]:
    """Return the addresses a callback URL's host has, resolved once and every one checked (the POST uses the first).

    Raises:
        UnsafeCallback: not http(s), a local name, a name that does not resolve, or (unless allow_private) any
            internal address among them.
    """
    host = _host(url)
    if not allow_private:
        _refuse_local_name(url, host)
    literal = literal_address(host)
    addresses = [literal] if literal is not None else _resolved(host, httpx.URL(url).port, resolver)
    if not addresses:
        raise UnsafeCallback(f"callback_url {url!r}: host {host!r} does not resolve")
    if not allow_private:
        _refuse_internal(url, addresses)
    return addresses


def _host(url: str) -> str:
    """Return the lower-case host of an http(s) URL (IDNA-encoded); raise UnsafeCallback for anything else."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise UnsafeCallback(f"callback_url must be an http(s) URL with a host, got {url!r}")
    try:
        return httpx.URL(url).raw_host.decode("ascii").lower()
    except (httpx.InvalidURL, UnicodeError) as exc:
        raise UnsafeCallback(f"callback_url {url!r} is not a valid URL: {exc}") from exc


def _refuse_local_name(url: str, host: str) -> None:
    """Raise UnsafeCallback when a host is a name of the local host."""
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        raise UnsafeCallback(f"callback_url {url!r} names the local host (NIGHTSCORE_CALLBACK_ALLOW_PRIVATE allows it)")


def _resolved(host: str, port: int | None, resolver: Resolver) -> list[Address]:
    """Return every address a host name resolves to, in the resolver's order (none when it does not resolve)."""
    try:
        infos = resolver(host, port or 443, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
    return list(dict.fromkeys(addresses))


@dataclass(frozen=True)
class PinnedRequest:
    """A POST to a URL's host made at one checked address: the URL naming the address, its Host, its TLS name."""

    url: str
    headers: dict[str, str]
    extensions: dict[str, Any]


def pinned_request(url: str, address: Address) -> PinnedRequest:
    """Return the request of url sent to address (never resolved again), with url's Host header and TLS server name."""
    target = httpx.URL(url)
    extensions: dict[str, Any] = {"sni_hostname": target.raw_host.decode("ascii")} if target.scheme == "https" else {}
    headers = {"Host": target.netloc.decode("ascii")}
    return PinnedRequest(str(target.copy_with(host=str(address))), headers, extensions)


def post_json(
    url: str,
    payload: dict[str, Any],
    attempts: int = 4,
    backoff_s: float = 1.0,
    timeout_s: float = 10.0,
    allow_private: bool = False,
    resolver: Resolver = socket.getaddrinfo,
) -> bool:
    """POST payload to url, retrying failures with exponential backoff; return whether it was accepted (2xx).

    The host is resolved once (`callback_addresses`); the attempts connect to the checked addresses in turn (one
    without a route is not tried forever), never to a name resolved again. An unsafe or unresolvable URL is never
    called: logged, and False returned.
    """
    try:
        requests = [pinned_request(url, address) for address in callback_addresses(url, allow_private, resolver)]
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
    turns = itertools.count()
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=False) as client:
            status = retrying(lambda: _post(client, requests[next(turns) % len(requests)], payload))
    except RetryError as exc:
        log.warning("callback %s gave up after %d attempts: %s", url, attempts, exc.last_attempt.exception())
        return False
    log.info("callback %s answered %d", url, status)
    return True


def _post(client: httpx.Client, request: PinnedRequest, payload: dict[str, Any]) -> int:
    response = client.post(request.url, json=payload, headers=request.headers, extensions=request.extensions)
    if not response.is_success:
        raise CallbackRefused(f"HTTP {response.status_code}")
    return response.status_code
