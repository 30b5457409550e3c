"""The Prefect REST API as a service calls it: requests that a busy server answers 429/502/503 are retried.

A Prefect server on SQLite answers 503 while its database is locked (a worker, the scheduler and the test all
write to it); Prefect's own client retries those with backoff, and so must a service driving the API by hand.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

RETRIED = frozenset({429, 502, 503})
ATTEMPTS = 6


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """Return the response to the request, retried with backoff while the server answers 429/502/503."""
    for attempt in range(ATTEMPTS):
        response = httpx.request(method, url, **kwargs)
        if response.status_code not in RETRIED or attempt == ATTEMPTS - 1:
            return response
        time.sleep(retry_after(response, attempt))
    raise AssertionError("unreachable")


def retry_after(response: httpx.Response, attempt: int) -> float:
    """Return the seconds to wait before the next attempt: the server's Retry-After, else 0.5·2^attempt."""
    try:
        return min(float(response.headers.get("Retry-After", "")), 10.0)
    except ValueError:
        return 0.5 * 2**attempt


def get(url: str, **kwargs: Any) -> httpx.Response:
    """GET url, retried while the server is busy."""
    return request("GET", url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    """POST to url, retried while the server is busy."""
    return request("POST", url, **kwargs)


def delete(url: str, **kwargs: Any) -> httpx.Response:
    """DELETE url, retried while the server is busy."""
    return request("DELETE", url, **kwargs)


def patch(url: str, **kwargs: Any) -> httpx.Response:
    """PATCH url, retried while the server is busy."""
    return request("PATCH", url, **kwargs)
