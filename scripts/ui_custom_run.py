"""Acceptance check of the Prefect UI: open a deployment's custom-run form in Chromium, submit it, wait for the run.

Needs `pip install playwright` (any venv) and Debian's chromium; not part of the test suite (the suite's
browser test only loads pages). Usage:
    python scripts/ui_custom_run.py http://127.0.0.1:4200 on-demand OUT_DIR
Prints the flow run id the UI created; screenshots of the form and the finished run's page go to OUT_DIR.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright


def api_json(url: str, body: dict[str, Any] | None = None) -> Any:
    """Return the JSON answer of a GET (or POST with body) to the Prefect API."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def runs_of(ui: str, deployment_id: str) -> list[dict[str, Any]]:
    """Return the deployment's flow runs."""
    return api_json(f"{ui}/api/flow_runs/filter", {"deployments": {"id": {"any_": [deployment_id]}}})


def wait_new_run(ui: str, deployment_id: str, before: set[str], timeout_s: float = 60) -> str:
    """Return the id of the flow run the form created (one not in before)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        new = [r["id"] for r in runs_of(ui, deployment_id) if r["id"] not in before]
        if new:
            return new[0]
        time.sleep(0.5)
    raise SystemExit("the form created no flow run")


def main(ui: str, name: str, out: Path) -> None:
    """Submit the deployment's custom-run form with its defaults and wait for the run to finish."""
    out.mkdir(parents=True, exist_ok=True)
    deployment = api_json(f"{ui}/api/deployments/name/{name}/{name}")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{ui}/deployments/deployment/{deployment['id']}/run")
        page.get_by_role("button", name="Submit").wait_for(timeout=60_000)
        page.screenshot(path=str(out / "custom-run-form.png"), full_page=True)
        before = {r["id"] for r in runs_of(ui, deployment["id"])}
        page.get_by_role("button", name="Submit").click()
        flow_run_id = wait_new_run(ui, deployment["id"], before)
        print(flow_run_id)
        while api_json(f"{ui}/api/flow_runs/{flow_run_id}")["state_type"] not in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            time.sleep(2)
        page.goto(f"{ui}/runs/flow-run/{flow_run_id}?tab=Artifacts")
        page.wait_for_timeout(5000)
        page.screenshot(path=str(out / "custom-run-artifacts.png"), full_page=True)
        print(api_json(f"{ui}/api/flow_runs/{flow_run_id}")["state_type"])
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1].rstrip("/"), sys.argv[2], Path(sys.argv[3]))
