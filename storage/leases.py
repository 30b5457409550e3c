"""A run's lease on its run date: one live attempt per date, renewed by a heartbeat, taken over only once it lapsed.

The lease is a row of the warehouse's ``run_leases`` table (key ``run_date:YYYY-MM-DD``). The attempt that holds
it is the only one that may resume, write, stage or publish that date's run; a second attempt waits for it
(bounded by ``run_lease_wait_s``) and then fails naming the holder. A lease lapses when its heartbeat stops for
``run_lease_ttl_s`` (its process died on another host), at once when its holder is a process of this host that
no longer runs (SIGKILL), or when its holder released it (every final state of the flow). A publication checks,
inside its warehouse transaction, that it still holds the lease (`LeaseFence`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from core.errors import NightscoreError, RunBusy, WarehouseBusy
from storage.warehouse.base import LeaseFence, LeaseRow, Warehouse

log = logging.getLogger(__name__)

SEP = "|"
WAIT_POLL_S = 1.0
_ACTIVE: dict[str, RunLease] = {}  # token (the flow run id) -> the lease this process holds for it
_GUARD = threading.Lock()


def lease_key(run_date: str) -> str:
    """Return the lease key of a run date."""
    return f"run_date:{run_date}"


def _start_ticks(pid: int) -> str:
    """Return a process's start time in clock ticks since boot (Linux /proc), or '?' where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def holder_id(token: str) -> str:
    """Return this process's holder name for a token: host|pid|start ticks|token."""
    pid = os.getpid()
    return SEP.join([socket.gethostname(), str(pid), _start_ticks(pid), token])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holder_is_stale(holder: str) -> bool:
    """Return True when a holder is certainly gone: a process of this host that no longer runs, or a lease of this
    process it no longer holds. Holders on other hosts are live until their lease expires."""
    parts = holder.split(SEP)
    if len(parts) != 4 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return parts[3] not in _ACTIVE
    if not _alive(pid):
        return True
    ticks = _start_ticks(pid)
    return "?" not in (ticks, parts[2]) and ticks != parts[2]  # the pid now belongs to another process


def describe(row: LeaseRow) -> str:
    """Return who holds a lease, in words: run, flow run, process, host and how fresh it is."""
    host, pid, _, token = (row.holder.split(SEP) + ["?"] * 4)[:4]
    now = datetime.now(UTC)
    expires = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=UTC)
    return (
        f"run {row.run_id or '(starting)'} (flow run {token}, pid {pid} on {host}; "
        f"lease expires in {max(0.0, (expires - now).total_seconds()):.0f} s)"
    )


class RunLease:
    """A lease this process holds, renewed by a daemon thread every third of its time to live."""

    def __init__(self, warehouse: Warehouse, key: str, holder: str, ttl_s: float) -> None:
        self.warehouse, self.key, self.holder, self.ttl_s = warehouse, key, holder, ttl_s
        self.run_id: str | None = None
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease {key}", daemon=True)

    @property
    def fence(self) -> LeaseFence:
        """Return what a publication checks it still holds."""
        return LeaseFence(self.key, self.holder)

    def start(self) -> RunLease:
        """Start the heartbeat; return self."""
        self._thread.start()
        return self

    def attach(self, run_id: str) -> None:
        """Record which run holds the lease (named to attempts that wait for it)."""
        self.run_id = run_id
        self.renew()

    def renew(self) -> bool:
        """Push the lease ttl_s ahead; return False (and remember it) when another attempt took it over."""
        try:
            held = self.warehouse.renew_lease(self.key, self.holder, self.ttl_s, self.run_id)
        except Exception as exc:  # noqa: BLE001 - a locked or unreachable warehouse: try again at the next beat
            log.warning("could not renew the lease on %s: %s", self.key, exc)
            return True
        if not held and not self.lost:
            self.lost = True
            log.error("lease on %s was taken over by another attempt: this run will not publish", self.key)
        return held

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            self.renew()

    def release(self) -> None:
        """Stop the heartbeat and drop the lease."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.ttl_s)
        try:
            self.warehouse.release_lease(self.key, self.holder)
        except NightscoreError as exc:  # it lapses on its own after ttl_s
            log.warning("could not release the lease on %s (it lapses in %.0f s): %s", self.key, self.ttl_s, exc)


def hold(
    warehouse: Warehouse,
    heartbeat: Warehouse,
    run_date: str,
    token: str,
    ttl_s: float,
    wait_s: float,
    say: Callable[[str], None] | None = None,
) -> RunLease:
    """Take the run date's lease for token (waiting at most wait_s for a live holder); return it, renewed until released.

    warehouse: the adapter that takes the lease (a run's, which may create the table); heartbeat: the one renewals
    and the release use; say: where "waiting" is told (the run's log). Raises RunBusy naming the live holder when
    the wait ends.
    """
    say = say or log.warning
    key, holder = lease_key(run_date), holder_id(token)
    deadline, said = time.monotonic() + wait_s, 0.0
    while True:
        busy: WarehouseBusy | None = None
        try:
            held = warehouse.acquire_lease(key, holder, ttl_s, holder_is_stale)
        except WarehouseBusy as exc:  # another process writes: the lease is still to be had
            held, busy = None, exc
        else:
            if held is None:
                return _register(RunLease(heartbeat, key, holder, ttl_s), token)
        left = deadline - time.monotonic()
        if left <= 0:
            who = describe(held) if held is not None else f"a warehouse lock ({busy})"
            raise RunBusy(
                f"run date {run_date} is held by {who}; waited {wait_s:.0f} s (NIGHTSCORE_RUN_LEASE_WAIT_S): "
                "try again when it has finished"
            )
        if time.monotonic() - said > 30:
            said = time.monotonic()
            say(
                f"waiting for the lease on {run_date} (up to {left:.0f} s more): held by "
                f"{describe(held) if held is not None else 'a warehouse lock'}"
            )
        time.sleep(min(WAIT_POLL_S, left))


def _register(lease: RunLease, token: str) -> RunLease:
    with _GUARD:
        previous = _ACTIVE.pop(token, None)
        _ACTIVE[token] = lease.start()
    if previous is not None:
        previous.release()
    return lease


def held_by(token: str) -> RunLease | None:
    """Return the lease this process holds for token, if any."""
    with _GUARD:
        return _ACTIVE.get(token)


def release(token: str) -> bool:
    """Release the lease this process holds for token; return whether there was one."""
    with _GUARD:
        lease = _ACTIVE.pop(token, None)
    if lease is None:
        return False
    lease.release()
    return True
