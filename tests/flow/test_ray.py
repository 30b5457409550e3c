"""Flow tier on Ray: the nightly run with task_runner=ray equals the local run, shard by shard on Ray workers.

The Ray run is the `nightscore` console script in a process of its own, given the worker's Prefect server (under
Ray a temporary server would be started by every Ray worker); the local run is the same command line run in
the test's process (tests/in_process.py). The Ray run starts its own local Ray with 2 CPUs and shuts it down
when the flow ends.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from core.errors import UsageError
from core.settings import load_settings
from tasks.runner import build_runner
from tests.helpers import command_logs, demo_inputs, nightly_args, nightly_command, small_run_environment
from tests.in_process import cli_in_process

CLI = str(Path(sys.executable).with_name("nightscore"))
RUN_DATE = "2026-11-30"
WORKER_SHARD = re.compile(r"\(encode-shard pid=(\d+)\).*? shard (\d+): \d+ texts")
WORKER_LOAD = re.compile(r"\(encode-shard pid=(\d+)\).*? loaded tiny-bert-random")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a folder with demo inputs: 300 items, 60 users."""
    return demo_inputs(tmp_path_factory.mktemp("inputs"), seed=11)


def run_nightly(home: Path, inputs: Path, api: str, **env: str) -> str:
    """Run `nightscore run nightly` on the inputs with extra NIGHTSCORE_* variables; return its output and log."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTSCORE_", "RAY_"))}
    base.update(PREFECT_API_URL=api, **small_run_environment(), RAY_DEDUP_LOGS="0", **env)
    done = subprocess.run(
        nightly_command(CLI, inputs, RUN_DATE, home),
        env=base,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout + done.stderr + command_logs(home)  # the driver's INFO lines go to its log file


def published(home: Path) -> dict[str, list[tuple]]:
    """Return the published item_scores (embeddings included) and user_candidates of a home."""
    con = duckdb.connect(str(home / "warehouse.duckdb"), read_only=True)
    try:
        scores = con.execute(
            "select item_id, topic, topic_score, token_count, content_hash, embedding from latest_item_scores order by item_id"
        ).fetchall()
        cands = con.execute("select user_id, rank, item_id, score from latest_user_candidates order by user_id, rank").fetchall()
    finally:
        con.close()
    return {"scores": scores, "candidates": cands}


def run_locally(home: Path, inputs: Path) -> str:
    """Run `nightscore run nightly` on the inputs in this process with the local runner; return its output and log."""
    output = Path(f"{home}.out")
    code = cli_in_process(nightly_args(inputs, RUN_DATE, home), small_run_environment(), output)
    assert code == 0, output.read_text()[-4000:]
    return output.read_text() + command_logs(home)


def test_ray_runner_publishes_what_the_local_runner_does(tmp_path: Path, inputs: Path, prefect_server: str) -> None:
    local_log = run_locally(tmp_path / "local", inputs)
    ray_log = run_nightly(tmp_path / "ray", inputs, prefect_server, NIGHTSCORE_TASK_RUNNER="ray", NIGHTSCORE_RAY_NUM_CPUS="2")

    local, on_ray = published(tmp_path / "local"), published(tmp_path / "ray")
    assert len(local["scores"]) == 300 and local["candidates"]
    assert on_ray == local  # embeddings bit for bit, topics, candidates and their scores

    assert "task runner: ray" in ray_log and not WORKER_SHARD.search(local_log)
    shards = {int(s) for _, s in WORKER_SHARD.findall(ray_log)}
    assert shards == set(range(len(shards))) and len(shards) >= 8  # every shard was encoded in a Ray worker
    loads = Counter(WORKER_LOAD.findall(ray_log))
    assert loads and max(loads.values()) == 1 and sum(loads.values()) <= 2  # one model load per worker (2 CPUs)


def test_ray_runner_without_a_prefect_server_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        with pytest.raises(UsageError, match="task_runner=ray needs a Prefect server: set PREFECT_API_URL"):
            build_runner(load_settings(task_runner="ray"))
        assert type(build_runner(load_settings(task_runner="local"))).__name__ == "ThreadPoolTaskRunner"
