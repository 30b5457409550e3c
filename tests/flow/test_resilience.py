"""Flow tier, real processes and real signals: SIGKILL/SIGTERM mid-run, resume, incremental re-runs.

The uninterrupted reference run is made once; the re-run test starts from a copy of its home.
The runs that are killed or stopped are the `nightscore` console script in a process of its own; the runs
that resume them, and the reference, are the same command line run in the test's process (tests/in_process.py),
which saves a new interpreter's imports per run. All use the worker's one Prefect server. The tiny encoder
keeps runs short; shards of 40 rows give several checkpoints to kill between.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

from storage.candidate_payload import decode_entry
from storage.resources import open_cache
from tests.helpers import command_logs, demo_inputs, nightly_args, nightly_command, restore_tree, small_run_environment
from tests.in_process import cli_in_process
from tests.servers import wait_for

CLI = str(Path(sys.executable).with_name("nightscore"))
RUN_DATE = "2026-11-30"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a folder with demo inputs: 300 items, 60 users."""
    return demo_inputs(tmp_path_factory.mktemp("inputs"), seed=2)


def launch(home: Path, inputs: Path, api: str, pause_at: str) -> subprocess.Popen[str]:
    """Start `nightscore run nightly` on the inputs in a child process that pauses at a fault point; output goes to <home>.log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSCORE_")}
    env.update(PREFECT_API_URL=api, **small_run_environment(), NIGHTSCORE_FAILPOINTS=json.dumps({pause_at: "pause"}))
    log = open(f"{home}.log", "a")  # noqa: SIM115 - the child process writes to it after this returns
    return subprocess.Popen(
        nightly_command(CLI, inputs, RUN_DATE, home),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_to_end(home: Path, inputs: Path, items: Path | None = None) -> str:
    """Run to completion in this process (the killed runs are children; what resumes them needs no process of its own)
    and return its output and log; fail on a non-zero exit."""
    code = cli_in_process(nightly_args(inputs, RUN_DATE, home, items), small_run_environment(), Path(f"{home}.log"))
    assert code == 0, Path(f"{home}.log").read_text()[-3000:]
    return Path(f"{home}.log").read_text() + command_logs(home)


def paused(home: Path, inputs: Path, api: str, point: str) -> subprocess.Popen[str]:
    """Start a run in a child process and return it once it waits at the fault point."""
    proc = launch(home, inputs, api, point)
    marker = home / "faults" / f"{point.replace(':', '-')}.reached"
    wait_for(marker.exists, 180, proc, f"run paused at {point}")
    return proc


def outputs(home: Path) -> dict[str, object]:
    """Return the published outputs of a home: scores, candidates and the cache's current lists."""
    con = duckdb.connect(str(home / "warehouse.duckdb"), read_only=True)
    try:
        scores = con.execute(
            "select item_id, topic, topic_score, token_count, content_hash, embedding from latest_item_scores order by item_id"
        ).fetchall()
        cands = con.execute("select user_id, rank, item_id, score from latest_user_candidates order by user_id, rank").fetchall()
        latest = con.execute("select run_id from latest_run").fetchone()
        assert latest is not None
        run_id = latest[0]
    finally:
        con.close()
    cache = open_cache(str(home / "cache.sqlite"), "nightscore")
    users = sorted({row[0] for row in cands})
    lists = {}
    for user in users:
        cached = cache.read(user)
        assert cached is not None
        got_run, blob = cached
        assert got_run == run_id
        entry = decode_entry(blob)
        lists[user] = (entry.item_ids, entry.features.tolist())
    cache.close()
    return {"scores": scores, "candidates": cands, "cache": lists}


@dataclass(frozen=True)
class Reference:
    """One uninterrupted run: its home, a copy of that home as the run left it, its log and its outputs."""

    home: Path
    copy: Path
    log: str
    outputs: dict[str, object]

    def restored(self) -> Path:
        """Return the run's home as the run left it (copied back into the same folder: its records name it)."""
        return restore_tree(self.copy, self.home)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, inputs: Path, prefect_server: str) -> Reference:
    """Return one uninterrupted run of the inputs in a fresh home."""
    home = tmp_path_factory.mktemp("ref") / "home"
    log = run_to_end(home, inputs)
    shutil.copytree(home, home.with_name("copy"))
    return Reference(home, home.with_name("copy"), log, outputs(home))


@pytest.fixture(scope="module")
def reference(uninterrupted: Reference) -> dict[str, object]:
    """Return the outputs of one uninterrupted run."""
    return uninterrupted.outputs


@pytest.mark.parametrize("point", ["ingest", "shard:2", "publish"])
def test_sigkill_then_rerun_equals_an_uninterrupted_run(
    point: str, tmp_path: Path, inputs: Path, prefect_server: str, reference: dict[str, object]
) -> None:
    home = tmp_path / "home"
    proc = paused(home, inputs, prefect_server, point)
    proc.kill()
    proc.wait(timeout=30)
    log = run_to_end(home, inputs)
    assert "resuming run" in log
    if point == "shard:2":
        assert len(re.findall(r"shard \d+: reused checkpoint", log)) >= 3  # shards 0, 1, 2 were committed
    assert outputs(home) == reference


def test_sigterm_mid_encode_stops_promptly_as_interrupted_and_resumes(
    tmp_path: Path, inputs: Path, prefect_server: str, reference: dict[str, object]
) -> None:
    home = tmp_path / "home"
    proc = paused(home, inputs, prefect_server, "shard:1")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    took = time.monotonic() - started
    log = Path(f"{home}.log").read_text()
    assert code == 143, log[-2000:]
    assert took < 120
    con = duckdb.connect(str(home / "warehouse.duckdb"), read_only=True)
    [(run_id, status)] = con.execute("select run_id, status from scoring_runs").fetchall()
    con.close()
    assert status == "interrupted"
    assert f"nightscore: error: run {run_id} interrupted by SIGTERM" in log and f"--resume {run_id})" in log
    log = run_to_end(home, inputs)
    assert "shard 0: reused checkpoint" in log and "shard 1: reused checkpoint" in log
    assert outputs(home) == reference


def summary_counts(log: str) -> tuple[int, int]:
    """Return (computed, reused) of the last run summary in a log."""
    found = re.findall(r"encode: (\d+) computed, (\d+) reused", log)
    assert found, log[-2000:]
    return int(found[-1][0]), int(found[-1][1])


def test_unchanged_inputs_encode_nothing_and_changed_texts_exactly_those(
    tmp_path: Path, inputs: Path, uninterrupted: Reference
) -> None:
    assert summary_counts(uninterrupted.log) == (300, 0)  # the first run of a fresh home encodes every text
    home = uninterrupted.restored()
    first = outputs(home)
    assert summary_counts(run_to_end(home, inputs)) == (0, 300)
    assert outputs(home) == first  # reused vectors give exactly the same scores

    items = pl.read_parquet(inputs / "items.parquet")
    changed = np.random.default_rng(0).choice(items.height, size=15, replace=False)
    edited = items.with_columns(
        pl.when(pl.int_range(pl.len()).is_in(changed.tolist()))
        .then(pl.col("body") + " edited")
        .otherwise(pl.col("body"))
        .alias("body")
    )
    edited_path = tmp_path / "items_edited.parquet"
    edited.write_parquet(edited_path)
    assert summary_counts(run_to_end(home, inputs, items=edited_path)) == (15, 285)
    con = duckdb.connect(str(home / "warehouse.duckdb"), read_only=True)
    count = con.execute("select count(*) from item_scores").fetchone()
    assert count is not None and count[0] == 300  # the run_date's rows replaced
    con.close()
