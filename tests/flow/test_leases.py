"""Flow tier, real processes: a second attempt for a run date never joins a live one (issue 18, item 4).

Before leases, the second `nightscore run nightly` for a date "resumed" the first while it was still running and both
wrote, staged and published the same folder. Now the first holds the date's lease: a second attempt waits
(bounded) and fails naming it, and one that waits long enough resumes the first run only after it has ended.
The first and the patient attempts are child processes; the impatient one runs in the test's process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import duckdb
import pytest

from tests.flow.test_resilience import CLI, RUN_DATE
from tests.helpers import command_logs, demo_inputs, nightly_args, nightly_command, small_run_environment
from tests.in_process import cli_in_process
from tests.servers import wait_for


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a folder with demo inputs: 300 items, 60 users."""
    return demo_inputs(tmp_path_factory.mktemp("inputs"), seed=7)


def attempt(home: Path, inputs: Path, api: str, name: str, **env: str) -> subprocess.Popen[str]:
    """Start `nightscore run nightly` for RUN_DATE; its output goes to <home>-<name>.log."""
    child = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSCORE_")}
    child.update(PREFECT_API_URL=api, **small_run_environment(), **env)
    log = open(f"{home}-{name}.log", "w")  # noqa: SIM115 - the child process writes to it after this returns
    return subprocess.Popen(
        nightly_command(CLI, inputs, RUN_DATE, home),
        env=child,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def output(home: Path, name: str) -> str:
    """Return what an attempt printed, and what the home's commands logged (INFO lines go to their log files)."""
    return Path(f"{home}-{name}.log").read_text() + command_logs(home)


def runs(home: Path) -> list[tuple[str, str]]:
    """Return (run_id, status) of every run in the home's warehouse."""
    with duckdb.connect(str(home / "warehouse.duckdb"), read_only=True) as con:
        return con.execute("SELECT run_id, status FROM scoring_runs ORDER BY started_at").fetchall()


def test_a_second_attempt_waits_for_the_live_one_and_resumes_it_only_after_it_ended(
    tmp_path: Path, inputs: Path, prefect_server: str
) -> None:
    home = tmp_path / "home"
    first = attempt(home, inputs, prefect_server, "first", NIGHTSCORE_FAILPOINTS=json.dumps({"shard:1": "pause"}))
    wait_for((home / "faults" / "shard-1.reached").exists, 180, first, "first attempt paused mid-encode")
    [(run_id, status)] = runs(home)
    assert status == "running"

    impatient = {**small_run_environment(), "NIGHTSCORE_RUN_LEASE_WAIT_S": "3"}  # in this process: it only waits and fails
    assert cli_in_process(nightly_args(inputs, RUN_DATE, home), impatient, Path(f"{home}-impatient.log")) == 1
    errors = [line for line in output(home, "impatient").splitlines() if line.startswith("nightscore: error")]
    assert len(errors) == 1 and f"run date {RUN_DATE} is held by run {run_id}" in errors[0], errors
    assert runs(home) == [(run_id, "running")]  # it neither resumed nor started a run
    assert [p.name for p in (home / "lake" / "runs" / RUN_DATE).iterdir()] == [run_id]

    patient = attempt(home, inputs, prefect_server, "patient", NIGHTSCORE_RUN_LEASE_WAIT_S="240")
    wait_for(lambda: "waiting for the lease" in output(home, "patient"), 180, patient, "second attempt waiting")
    assert runs(home) == [(run_id, "running")]
    first.send_signal(signal.SIGTERM)  # the live attempt ends (interrupted): its lease is released
    assert first.wait(timeout=120) == 143, output(home, "first")[-3000:]
    assert patient.wait(timeout=300) == 0, output(home, "patient")[-3000:]
    assert f"resuming run {run_id}" in output(home, "patient")
    assert runs(home) == [(run_id, "published")]
