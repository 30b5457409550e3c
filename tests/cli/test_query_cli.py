"""CLI tier: `nightscore query` on a small DuckDB warehouse: row cap, timeout, Ctrl-C, memory (issue 34).

No model runs here (unlike test_cli.py): the warehouse is written by the storage tier's helpers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import pytest

from nightscore import cli
from storage.warehouse.duckdb_warehouse import DuckDBWarehouse
from tests.helpers import fresh_interpreter_output
from tests.storage.conftest import DIM
from tests.storage.test_warehouse import publish

ROOT = Path(__file__).resolve().parents[2]
SLOW = "SELECT count(*) FROM range(100000000000) t(i) WHERE i % 7 = 3"
# The CLI in a child process that reports its peak memory (MB) on stderr's last line.
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent (the test process) across exec.
MEASURED = """
import re, sys
from pathlib import Path
from nightscore.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
peak_kb = int(re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1))
print(f"peak_mb={peak_kb / 1024:.0f}", file=sys.stderr)
sys.exit(code)
"""


@pytest.fixture
def analyst_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Return a home whose DuckDB warehouse holds one published run (4 items); no NIGHTSCORE_ variable is set."""
    for name in [n for n in os.environ if n.startswith("NIGHTSCORE_")]:
        monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    publish(DuckDBWarehouse(str(home / "warehouse.duckdb"), embedding_dim=DIM), "r1", date(2026, 11, 30), n=4)
    return home


def child(*args: str, home: Path, **popen: object) -> subprocess.Popen[str]:
    """Start the CLI (measured) in a child process with an isolated environment; return it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSCORE_")}
    command = [sys.executable, "-c", MEASURED, *args, "--home", str(home)]
    return subprocess.Popen(command, cwd=ROOT, env=env, text=True, **popen)  # type: ignore[call-overload]


def peak_mb(stderr: str) -> int:
    """Return the peak memory a measured child reported."""
    return int(stderr.strip().splitlines()[-1].removeprefix("peak_mb="))


def test_the_result_is_capped_by_default_and_the_cut_is_said(
    analyst_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NIGHTSCORE_QUERY_MAX_ROWS", "5")
    sql = "SELECT i FROM range(20) t(i) ORDER BY i"
    assert cli.main(["query", sql, "--format", "csv", "--home", str(analyst_home)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["i", "0", "1", "2", "3", "4"]
    assert err.count("\n") == 1 and "first 5 rows" in err and "--limit" in err
    assert cli.main(["query", sql, "--format", "json", "--limit", "0", "--home", str(analyst_home)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == [{"i": i} for i in range(20)] and err == ""


def test_a_query_past_the_timeout_setting_stops_with_one_line(
    analyst_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NIGHTSCORE_QUERY_TIMEOUT_S", "1")
    started = time.monotonic()
    assert cli.main(["query", SLOW, "--home", str(analyst_home)]) == 2
    err = capsys.readouterr().err
    assert time.monotonic() - started < 10
    assert err.count("\n") == 1 and "stopped after 1 s" in err and "NIGHTSCORE_QUERY_TIMEOUT_S" in err


def test_ctrl_c_cancels_a_running_query_with_one_line(analyst_home: Path) -> None:
    proc = child("query", SLOW, home=analyst_home, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    snapshot = analyst_home / "warehouse.duckdb.snapshot"
    deadline = time.monotonic() + 60
    while not snapshot.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # the statement is running now
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert time.monotonic() - sent < 5, "the query went on after Ctrl-C"
    assert proc.returncode == 130
    lines = err.strip().splitlines()[:-1]  # the last line is the measurement
    assert lines == ["nightscore: aborted"], err


def test_an_unlimited_result_streams_in_flat_memory(analyst_home: Path) -> None:
    rows = 500_000
    big = f"SELECT i, i * 0.5 AS x, 'row ' || i AS label FROM range({rows}) t(i)"
    baseline = child("query", "SELECT 1", "--format", "json", home=analyst_home, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, base_err = baseline.communicate(timeout=120)
    streamed = child(
        "query", big, "--format", "json", "--limit", "0", home=analyst_home, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = streamed.communicate(timeout=300)
    assert baseline.returncode == 0 and streamed.returncode == 0, err
    parsed = json.loads(out)
    assert len(parsed) == rows and parsed[-1] == {"i": rows - 1, "x": (rows - 1) / 2, "label": f"row {rows - 1}"}
    grown = peak_mb(err) - peak_mb(base_err)
    assert grown < 80, f"{rows} rows as JSON took {grown} MB more than one row (fetched whole: ~280 MB)"


def test_a_reader_that_stops_early_ends_the_query_quietly(analyst_home: Path) -> None:
    proc = child(
        "query",
        "SELECT i FROM range(100000000) t(i)",
        "--limit",
        "0",
        "--format",
        "csv",
        home=analyst_home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "i\n"  # `| head -1`
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err.strip().splitlines()[:-1] == [], err


# What an analyst's command line must not load: the lake's polars and fsspec, the cache's redis client, the flows'
# Prefect and the model's torch (most of a second of start-up before the commands imported them on use).
NOT_FOR_READS = ("polars", "fsspec", "redis", "prefect", "torch", "flows.params", "storage.lake", "storage.cache")
LOADED = """
import sys
from nightscore.cli import main
code = main({argv!r})
sys.stdout.flush()
print("loaded:", *sorted(m for m in {names!r} if m in sys.modules))
sys.exit(code)
"""


READS = [["query", "SELECT count(*) AS n FROM latest_item_scores", "--format", "csv"], ["runs"], ["--help"]]


@pytest.mark.parametrize("argv", READS, ids=["query", "runs", "help"])
def test_reading_the_warehouse_loads_only_what_it_uses(argv: list[str], analyst_home: Path) -> None:
    home = [] if argv == ["--help"] else ["--home", str(analyst_home)]
    script = LOADED.format(argv=[*argv, *home], names=(*NOT_FOR_READS, "duckdb"))
    *printed, last = fresh_interpreter_output(script).splitlines()  # the fixture left no NIGHTSCORE_ variable set
    assert last.startswith("loaded:"), last
    loaded = last.split()[1:]
    assert not set(loaded) & set(NOT_FOR_READS), loaded
    assert ("duckdb" in loaded) == (argv != ["--help"])  # the reads did open the warehouse
    if argv[0] == "query":
        assert " ".join(printed).split() == ["n", "4"], printed
