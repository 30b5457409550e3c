"""Storage tier: run-date leases in the warehouse (run_leases), on DuckDB and PostgreSQL (issue 18, item 4)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from datetime import date

import pytest

from core.errors import PublishError, RunBusy
from storage import leases
from storage.warehouse.base import LeaseFence, Warehouse
from tests.storage.test_warehouse import candidates, one, run_row, scores

NEVER_STALE = lambda holder: False  # noqa: E731 - a holder on another host: only expiry frees its lease


def dead_holder() -> str:
    """Return the holder name of a process of this host that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return leases.SEP.join([socket.gethostname(), str(proc.pid), "1", "gone-flow-run"])


def test_a_live_lease_is_refused_to_others_until_it_expires(wh: Warehouse) -> None:
    wh.record_run(run_row("r0", date(2026, 11, 1)))  # creates the tables
    assert wh.acquire_lease("run_date:2026-11-30", "A", 0.6, NEVER_STALE) is None
    held = wh.acquire_lease("run_date:2026-11-30", "B", 30, NEVER_STALE)
    assert held is not None and held.holder == "A"
    assert wh.renew_lease("run_date:2026-11-30", "A", 0.6, run_id="run-a")
    assert wh.acquire_lease("run_date:2026-11-29", "B", 30, NEVER_STALE) is None  # another date is free
    time.sleep(0.8)
    assert wh.acquire_lease("run_date:2026-11-30", "B", 30, NEVER_STALE) is None  # A's heartbeat stopped: B takes over
    assert not wh.renew_lease("run_date:2026-11-30", "A", 30)  # A learns it lost the lease
    wh.release_lease("run_date:2026-11-30", "A")  # releasing a lost lease leaves B's alone
    assert wh.acquire_lease("run_date:2026-11-30", "C", 30, NEVER_STALE).holder == "B"  # type: ignore[union-attr]
    wh.release_lease("run_date:2026-11-30", "B")
    assert wh.acquire_lease("run_date:2026-11-30", "C", 30, NEVER_STALE) is None


def test_a_dead_holder_on_this_host_is_taken_over_at_once(wh: Warehouse) -> None:
    wh.record_run(run_row("r0", date(2026, 11, 1)))
    gone = dead_holder()
    assert leases.holder_is_stale(gone)
    assert leases.holder_is_stale(leases.holder_id("not-held"))  # this process, which holds no such lease
    assert not leases.holder_is_stale("another-host|1|1|flow-run")  # elsewhere: only expiry frees it
    assert wh.acquire_lease("run_date:2026-11-30", gone, 3600, NEVER_STALE) is None
    assert wh.acquire_lease("run_date:2026-11-30", "B", 30, leases.holder_is_stale) is None


def test_hold_waits_bounded_names_the_holder_and_its_heartbeat_renews(wh: Warehouse) -> None:
    wh.record_run(run_row("r0", date(2026, 11, 1)))
    first = leases.hold(wh, wh, "2026-11-30", "flow-run-1", ttl_s=0.9, wait_s=0)
    try:
        first.attach("nightly-2026-11-30-aaaa")
        renewed = one(wh, "SELECT expires_at FROM run_leases")
        held_by_first = r"run date 2026-11-30 is held by run nightly-2026-11-30-aaaa \(flow run flow-run-1, pid"
        with pytest.raises(RunBusy, match=held_by_first):  # waits longer than the ttl: the heartbeats kept it
            leases.hold(wh, wh, "2026-11-30", "flow-run-2", ttl_s=0.9, wait_s=1.5)
        assert one(wh, "SELECT expires_at FROM run_leases") > renewed  # type: ignore[operator]
    finally:
        assert leases.release("flow-run-1")
    second = leases.hold(wh, wh, "2026-11-30", "flow-run-2", ttl_s=30, wait_s=0)  # released: free at once
    assert leases.held_by("flow-run-2") is second
    assert leases.release("flow-run-2") and not leases.release("flow-run-2")


def test_a_publication_that_lost_its_lease_is_refused(wh: Warehouse) -> None:
    wh.record_run(run_row("r1", date(2026, 11, 30)))
    assert wh.acquire_lease("run_date:2026-11-30", "A", 30, NEVER_STALE) is None
    with pytest.raises(PublishError, match="no longer holds the lease"):
        wh.publish(
            run_row("r1", date(2026, 11, 30)),
            scores("r1", date(2026, 11, 30), 3),
            candidates("r1", date(2026, 11, 30), 2),
            fence=LeaseFence("run_date:2026-11-30", "B"),
        )
    assert one(wh, "SELECT count(*) FROM item_scores") == 0
    assert (
        wh.publish(
            run_row("r1", date(2026, 11, 30)),
            scores("r1", date(2026, 11, 30), 3),
            candidates("r1", date(2026, 11, 30), 2),
            fence=LeaseFence("run_date:2026-11-30", "A"),
        )
        == "r1"
    )
