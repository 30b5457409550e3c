"""Run-completion callbacks: POST a small JSON document to a caller's URL, retried with backoff, never raising."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any

log = logging.getLogger(__name__)

COUNT_KEYS = ("rows_in", "rows_quarantined", "rows_scored", "rows_computed", "rows_reused",
              "interactions_in", "interactions_quarantined", "users_with_candidates", "cache_entries")
TABLES = ("item_scores", "user_candidates", "latest_item_scores", "latest_user_candidates", "scoring_runs", "quarantine")


def completion_payload(flow_run_id: str, state: str, summary: dict[str, Any] | None, run_id: str | None,
                       message: str | None = None) -> dict[str, Any]:
    """Return the callback document: flow run id, run id, final state, counts and the tables that hold the rows."""
    summary = summary or {}
    return {"flow_run_id": flow_run_id, "run_id": summary.get("run_id", run_id), "state": state,
            "counts": {key: summary[key] for key in COUNT_KEYS if key in summary},
            "tables": list(TABLES) if state == "COMPLETED" else [], "message": message}


def post_json(url: str, payload: dict[str, Any], attempts: int = 4, backoff_s: float = 1.0, timeout_s: float = 10.0) -> bool:
    """POST payload to url, retrying failures with exponential backoff; return whether it was accepted (2xx)."""
    body = json.dumps(payload, default=str).encode()
    for attempt in range(1, attempts + 1):
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                log.info("callback %s answered %d", url, response.status)
                return True
        except (urllib.error.URLError, OSError, ValueError) as exc:
            log.warning("callback %s failed (attempt %d of %d): %s", url, attempt, attempts, exc)
        if attempt < attempts:
            time.sleep(backoff_s * 2 ** (attempt - 1))
    return False
