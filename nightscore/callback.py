"""Run-completion callbacks: POST a small JSON document to a caller's URL (httpx), retried with backoff (tenacity)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import httpx
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

if TYPE_CHECKING:
    from tasks.results import Published

log = logging.getLogger(__name__)

COUNT_KEYS = ("rows_in", "rows_quarantined", "rows_scored", "rows_computed", "rows_reused",
              "interactions_in", "interactions_quarantined", "users_with_candidates")
TABLES = ("item_scores", "user_candidates", "latest_item_scores", "latest_user_candidates", "scoring_runs", "quarantine")


def completion_payload(flow_run_id: str, state: str, published: Published | None, run_id: str | None,
                       message: str | None = None) -> dict[str, Any]:
    """Return the callback document: flow run id, run id, final state, counts and the tables that hold the rows."""
    counts: dict[str, Any] = {}
    if published is not None:
        row = published.record.row()
        counts = {key: row[key] for key in COUNT_KEYS} | {"cache_entries": published.cache_entries}
    return {"flow_run_id": flow_run_id, "run_id": published.run_id if published else run_id, "state": state,
            "counts": counts, "tables": list(TABLES) if state == "COMPLETED" else [], "message": message}


class CallbackRefused(Exception):
    """The callback URL answered with a status other than 2xx."""


def post_json(url: str, payload: dict[str, Any], attempts: int = 4, backoff_s: float = 1.0, timeout_s: float = 10.0) -> bool:
    """POST payload to url, retrying failures with exponential backoff; return whether it was accepted (2xx)."""
    retrying = Retrying(stop=stop_after_attempt(attempts), wait=wait_exponential(multiplier=backoff_s),
                        retry=retry_if_exception_type((httpx.HTTPError, CallbackRefused)),
                        before_sleep=lambda s: log.warning("callback %s failed (attempt %d of %d): %s", url,
                                                           s.attempt_number, attempts, s.outcome.exception() if s.outcome else ""))
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
