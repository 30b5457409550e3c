"""CLI tier: the console script in real subprocesses, with the real all-MiniLM-L6-v2 model."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest

from tests.helpers import CLI_CALIBRATION, calibration_environment, command_logs
from tests.servers import free_port, http_answers, serving

CLI = [str(Path(sys.executable).with_name("nightscore"))]

# The first test's setup may wait for the session's MiniLM calibration (tests/conftest.py). When it was the whole
# machine's, on a 2-core AVX2-only host with the other worker busy, it took 279 s and over 330 s: more than the
# suite's 600 s per-test timeout, which then failed every test of the module at setup.
pytestmark = pytest.mark.timeout(1800)


def nightscore(
    *args: str, home: Path, timeout: int = 600, settings: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the nightscore console script with an isolated home (and the NIGHTSCORE_ settings given) and return it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSCORE_")} | (settings or {})
    return subprocess.run([*CLI, *args, "--home", str(home)], capture_output=True, text=True, timeout=timeout, env=env)


def query_json(sql: str, home: Path) -> list[dict[str, Any]]:
    """Return the rows of a `nightscore query --format json` call."""
    done = nightscore("query", sql, "--format", "json", home=home)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def demo_run(
    tmp_path_factory: pytest.TempPathFactory, calibrated_engine_cache: Path
) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """Return (home, inputs folder, finished run) of one real-model nightly run on 300 demo items.

    The run's `auto` reads the session's persisted calibration, as a second run on one machine kind does.
    """
    root = tmp_path_factory.mktemp("cli")
    home, inputs = root / "home", root / "inputs"
    made = nightscore("demo-data", "--out", str(inputs), "--items", "300", "--users", "80", "--seed", "1", home=home)
    assert made.returncode == 0, made.stderr
    run = nightscore(
        "run",
        "nightly",
        "--items",
        str(inputs / "items.parquet"),
        "--interactions",
        str(inputs / "interactions.parquet"),
        "--run-date",
        "2026-11-30",
        home=home,
        settings={"NIGHTSCORE_ENGINE_CACHE_DIR": str(calibrated_engine_cache), **calibration_environment(CLI_CALIBRATION)},
    )
    return home, inputs, run


def test_demo_run_publishes_and_query_counts_match(demo_run: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    home, inputs, run = demo_run
    assert run.returncode == 0, run.stderr[-3000:]
    assert "published" in run.stdout and "padding efficiency" in run.stdout
    # the summary's truncation warning is said once on the terminal: the run's log file keeps the run's own line
    assert "are truncated at 256 tokens" in run.stdout and "truncated" not in run.stderr, run.stderr
    assert "WARNING prefect.task_runs [report-run" in command_logs(home) and "are truncated at" in command_logs(home)
    assert re.search(r"engine: \w+/\w+@\d+ \(auto, calibrated [\d,.]+ tok/s on .+ \(persisted choice\)\)", run.stdout), run.stdout
    runs = query_json("select rows_in, rows_scored, rows_quarantined, model_version, status from scoring_runs", home)
    assert len(runs) == 1 and runs[0]["status"] == "published"
    assert runs[0]["rows_in"] == runs[0]["rows_scored"] + runs[0]["rows_quarantined"] == 300
    assert str(runs[0]["model_version"]).startswith("all-MiniLM-L6-v2@")
    assert query_json("select count(*) as n from latest_item_scores", home) == [{"n": 300}]
    users = pl.read_parquet(inputs / "interactions.parquet")["user_id"].n_unique()
    per_user = query_json("select user_id, count(*) as k from latest_user_candidates group by user_id", home)
    assert len(per_user) == users and {row["k"] for row in per_user} == {100}


def test_real_model_topics_match_the_generator_labels(demo_run: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    home, inputs, _ = demo_run
    truth = pl.read_parquet(inputs / "items.parquet").select("item_id", "topic")
    scored = pl.DataFrame(query_json("select item_id, topic from latest_item_scores", home))
    accuracy = scored.join(truth, on="item_id", suffix="_true").select((pl.col("topic") == pl.col("topic_true")).mean()).item()
    assert accuracy > 0.8  # zero-shot on label descriptions; the run never saw the generator's topic column


def test_the_serve_command_the_run_suggests_starts_and_serves_its_candidates(
    demo_run: tuple[Path, Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """The summary's `next:` serve line, run as printed (on a free port), answers with the run's candidates."""
    home, _, run = demo_run
    line = next(line for line in run.stdout.splitlines() if "nightscore serve" in line)
    words = shlex.split(line.split("#")[0])
    at = words.index("nightscore")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSCORE_")} | dict(w.split("=", 1) for w in words[:at])
    url = f"http://127.0.0.1:{free_port()}"
    user = query_json("select user_id from latest_user_candidates limit 1", home)[0]["user_id"]
    command = [*CLI, *words[at + 1 :], "--port", url.rsplit(":", 1)[1]]
    with serving(command, env, tmp_path / "serve.log", lambda: http_answers(f"{url}/readyz"), 120, "nightscore serve", 30):
        answer = httpx.get(f"{url}/v1/users/{user}/recommendations?n=5", timeout=30)
    assert answer.status_code == 200 and len(answer.json()["items"]) == 5 and answer.json()["fallback"] is None, answer.text


def test_query_formats(demo_run: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    home = demo_run[0]
    csv_out = nightscore("query", "select 1 as a, 'x' as b", "--format", "csv", home=home)
    assert csv_out.stdout.strip().splitlines() == ["a,b", "1,x"]
    table = nightscore("query", "select run_id from scoring_runs", home=home)
    assert "run_id" in table.stdout and "nightly-2026-11-30-" in table.stdout


def test_bad_usage_exits_2(tmp_path: Path) -> None:
    done = nightscore("run", "nightly", "--run-date", "2026-13-45", home=tmp_path)
    assert done.returncode == 2 and "2026-13-45" in done.stderr and "Traceback" not in done.stderr
    done = nightscore("query", "select 1", home=tmp_path / "empty")
    assert done.returncode == 2 and "no warehouse" in done.stderr


def test_unreadable_input_exits_3_naming_the_file(
    demo_run: tuple[Path, Path, subprocess.CompletedProcess[str]], tmp_path: Path, prefect_server: str
) -> None:
    home, inputs, _ = demo_run
    bad = tmp_path / "items.parquet"
    pl.read_parquet(inputs / "items.parquet").drop("item_id").write_parquet(bad)
    before = query_json("select run_id from latest_run", home)
    args = ("run", "nightly", "--items", str(bad), "--interactions", str(inputs / "interactions.parquet"))
    done = nightscore(*args, home=home, settings={"PREFECT_API_URL": prefect_server})  # the demo run tried the ephemeral API
    assert done.returncode == 3, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("nightscore: error")]
    assert len(errors) == 1 and str(bad) in errors[0] and "item_id" in errors[0]
    assert "Traceback" not in done.stderr  # not even the one Prefect's engine logs for the failed task
    assert done.stderr.count("\n") == 1, done.stderr  # Prefect's lines that repeat it are in the run's log file
    assert query_json("select run_id from latest_run", home) == before


def test_train_ranker_without_a_published_run_is_one_usage_line(tmp_path: Path, prefect_server: str) -> None:
    home = tmp_path / "home"
    done = nightscore("run", "train-ranker", home=home, settings={"PREFECT_API_URL": prefect_server})
    assert done.returncode == 2, done.stderr
    assert done.stderr == "nightscore: error: no published run to train the ranker on: run the nightly flow first\n"
    assert "Encountered exception during execution: UsageError('no published run to train" in command_logs(home)


def test_sql_error_and_refused_statements_exit_2_with_one_line(
    demo_run: tuple[Path, Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    done = nightscore("query", "select * from no_such_table", home=demo_run[0])
    assert done.returncode == 2 and "no_such_table" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    done = nightscore("query", "selec 1", home=demo_run[0])
    assert done.returncode == 2 and done.stderr.startswith("nightscore: error: query failed") and done.stderr.count("\n") == 1
    for sql in (f"copy scoring_runs to '{tmp_path}/out.csv'", "select * from read_text('/etc/hostname')", "install httpfs"):
        done = nightscore("query", sql, home=demo_run[0])
        assert done.returncode == 2 and done.stderr.startswith("nightscore: error: query refused"), (sql, done.stderr)
    assert not (tmp_path / "out.csv").exists()


def test_broken_warehouse_file_is_one_clear_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "warehouse.duckdb").write_bytes(b"this is not a DuckDB file" * 100)
    done = nightscore("runs", home=home)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "cannot be opened" in done.stderr and "locked" not in done.stderr and "Traceback" not in done.stderr


def test_unexpected_error_is_one_line_and_its_traceback_goes_to_the_log_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from nightscore import cli
    from storage import resources

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("a bug")  # a failure nothing maps: it must still end as one line

    monkeypatch.setattr(resources, "warehouse_for", broken)
    assert cli.main(["runs", "--home", str(tmp_path / "home")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nightscore: unexpected error: KeyError: 'a bug' (traceback in ")
    log_file = Path(err.rsplit("(traceback in ", 1)[1].rstrip(")\n"))
    assert log_file.parent == (tmp_path / "home" / "logs").resolve()
    assert "Traceback (most recent call last)" in log_file.read_text() and "a bug" in log_file.read_text()


def test_help_lists_commands() -> None:
    done = subprocess.run([*CLI, "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    for command in ("demo-data", "run", "query", "runs"):
        assert command in done.stdout


def test_a_run_without_inputs_refuses_naming_the_settings_and_never_scores_demo_data(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = nightscore("run", "nightly", home=home)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "NIGHTSCORE_ITEMS_URI" in done.stderr and "--demo" in done.stderr
    assert not (home / "lake" / "inputs" / "demo").exists() and not (home / "warehouse.duckdb").exists()


def test_schedules_without_inputs_are_refused_before_anything_starts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for command in ("deploy", "up"):
        done = nightscore(command, home=home, settings={"PREFECT_API_URL": "http://127.0.0.1:9/api"})
        assert done.returncode == 2 and done.stderr.count("\n") == 1, (command, done.stderr)
        assert "NIGHTSCORE_ITEMS_URI" in done.stderr and "--demo" in done.stderr
    assert not (home / "up.json").exists()
