"""Storage tier: one process's threads on one DuckDB file (a run's lease heartbeat beside its reads and writes)."""

from __future__ import annotations

import threading
from datetime import date
from pathlib import Path

import pytest

from core.errors import WarehouseBusy
from storage.warehouse.duckdb_gate import ConfigGate, config_key
from storage.warehouse.duckdb_warehouse import DuckDBWarehouse
from tests.storage.test_warehouse import run_row

DIM = 8


def test_a_read_waits_for_another_threads_open_write_instead_of_failing(tmp_path: Path) -> None:
    wh = DuckDBWarehouse(str(tmp_path / "w.duckdb"), embedding_dim=DIM)
    wh.record_run(run_row("r0", date(2026, 11, 1)))
    opened, results = threading.Event(), []

    def write() -> None:
        with wh._transaction() as session:  # a heartbeat's renewal, held open a moment
            opened.set()
            session.run("UPDATE scoring_runs SET status = 'failed' WHERE run_id = 'r0'")
            threading.Event().wait(0.3)

    writer = threading.Thread(target=write)
    writer.start()
    opened.wait(5)
    results.append(wh.query("SELECT status FROM scoring_runs").rows)  # different config: waits for the writer
    results.append(wh.analyst_query("SELECT count(*) FROM scoring_runs").rows)
    writer.join()
    assert results == [[("failed",)], [(1,)]]


def test_threads_creating_the_schema_at_once_do_not_conflict(tmp_path: Path) -> None:
    path = str(tmp_path / "w.duckdb")
    DuckDBWarehouse(path, embedding_dim=DIM).record_run(run_row("r0", date(2026, 11, 1)))
    start, errors = threading.Barrier(6), []

    def renew(n: int) -> None:
        adapter = DuckDBWarehouse(path, embedding_dim=DIM)  # each its own adapter: each replaces the views
        start.wait()
        try:
            for attempt in range(5):
                adapter.acquire_lease(f"k{n}-{attempt}", f"holder-{n}", 30, lambda holder: False)
        except Exception as exc:  # noqa: BLE001 - every failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=renew, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    count = DuckDBWarehouse(path).query("SELECT count(*) FROM run_leases").rows
    assert count == [(30,)]


def test_the_gate_bounds_the_wait_and_names_the_configuration_it_waited_for(tmp_path: Path) -> None:
    gate, path = ConfigGate(), str(tmp_path / "w.duckdb")
    with gate.holding(path, config_key(False, {}), 1):
        with gate.holding(path, config_key(False, {}), 0.01):  # the same configuration overlaps at once
            pass
        busy = pytest.raises(WarehouseBusy, match=r"another configuration \(waited 0 s\): read_only=False")
        with busy, gate.holding(path, config_key(True, {}), 0.2):
            pass
    with gate.holding(path, config_key(True, {}), 0.01):  # closed: free
        pass
