"""Memory benchmark of the nightly run: wall time and peak RSS at two item counts (issue #9).

Each size gets its own home folder and synthetic inputs, then one ``nightscore run nightly`` subprocess
with the tiny random encoder (tests/tiny_model.py, torch fp32) on CPU, so the data path (ingest, contracts,
planning, candidates, publish) is measured rather than the model. Inputs (fast, vectorised, seeded; not the demo generator):

- items: ``item-NNNNNNN``, a 3-word title and an 8-word body drawn from one topic's vocabulary plus
  common words (about 16 tokens per text), created 100-300 days before the run date;
- interactions: a fixed ``--users`` users (default 2,000) x 20 interactions each (40,000 rows, whatever
  the item count), items uniform at random, events view/click/purchase, within the last 60 days.

Peak RSS of the flow process is the kernel's high-water mark of the CLI process (``os.wait4`` rusage;
the flow runs in that process). Prefect's temporary API server runs in a child process; its peak
(VmHWM, polled every 0.2 s over the process tree) is reported in its own column and not added.
A run whose flow process passes ``--cap-mib`` is killed (exit -9 in the table; its peak is then
"above the cap"), so a shared machine never meets the kernel's OOM killer.
Prints one side-by-side table with per-stage seconds from the run summary and the ratios last/first, then
one of RSS per task run: the flow's RSS when each task run ended and its highest RSS during it (from the
0.2 s samples and the "[task run name]: Finished in state" log lines), so a peak names its stage.

    python benchmarks/memory.py [--sizes 100000 1000000] [--users 2000] [--root bench-results/memory]
                                [--shard-size 16384] [--repo CHECKOUT] [--cap-mib 12000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import functools
import operator

from nightscore.demo import COMMON_WORDS, TOPIC_WORDS
from tests.tiny_model import write_tiny_model

log = logging.getLogger("bench")
RUN_DATE = "2026-11-01"
BASE_US = 1_793_577_600_000_000  # 2026-11-01T00:00:00Z in epoch microseconds
DAY_US = 86_400 * 1_000_000
TITLE_WORDS, BODY_WORDS, PER_USER = 3, 8, 20
# The CLI from the checkout in the working directory (--repo), so another checkout (a baseline) can be measured.
CLI = "import sys; sys.path.insert(0, '.'); from nightscore.cli import entrypoint; entrypoint()"


@dataclass
class Result:
    """One size's run: wall time, peaks, per-stage seconds and the exit code."""

    items: int
    wall_s: float
    flow_peak_mib: float
    server_peak_mib: float
    stages: dict[str, float] = field(default_factory=dict)
    rc: int = 0
    tasks: list[tuple[str, float, float]] = field(default_factory=list)  # (task, RSS at its end, max RSS during) MiB


def _words(rng: np.random.Generator, topic: np.ndarray, n_words: int) -> pl.Series:
    """Return one space-joined string per row of n_words words: half its topic's words, half common ones."""
    vocab = [w.split() for w in TOPIC_WORDS.values()]
    sizes = np.array([len(v) for v in vocab])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    words: list[str] = functools.reduce(operator.iadd, vocab, [])
    flat, common = np.array(words), np.array(COMMON_WORDS.split())
    cols = []
    for n in range(n_words):
        topical = flat[offsets[topic] + rng.integers(0, 1 << 30, topic.size) % sizes[topic]]
        word = np.where(rng.random(topic.size) < 0.5, topical, common[rng.integers(0, common.size, topic.size)])
        cols.append(pl.Series(f"w{n}", word))
    return pl.DataFrame(cols).select(pl.concat_str(pl.all(), separator=" ")).to_series()


def synthetic_items(n_items: int, seed: int = 0) -> pl.DataFrame:
    """Return n_items items (item_id, title, body, created_at) with short topical texts."""
    rng = np.random.default_rng([seed, 0])
    topic = rng.integers(0, len(TOPIC_WORDS), n_items)
    created = BASE_US - rng.integers(100 * DAY_US, 300 * DAY_US, n_items) // 1_000_000 * 1_000_000
    return pl.DataFrame(
        {
            "item_id": pl.int_range(1, n_items + 1, eager=True).cast(pl.String).str.zfill(7).str.replace(r"^", "item-"),
            "title": _words(rng, topic, TITLE_WORDS).str.to_titlecase(),
            "body": _words(rng, topic, BODY_WORDS) + ".",
            "created_at": pl.Series(created).cast(pl.Datetime("us", "UTC")),
        }
    )


def synthetic_interactions(n_items: int, n_users: int, seed: int = 0) -> pl.DataFrame:
    """Return n_users x PER_USER interactions over uniformly drawn items in the last 60 days."""
    rng = np.random.default_rng([seed, 1])
    n = n_users * PER_USER
    user = np.repeat(np.arange(1, n_users + 1), PER_USER)
    item = rng.integers(1, n_items + 1, n)
    ts = BASE_US - rng.integers(1, 60 * DAY_US, n) // 1_000_000 * 1_000_000
    return pl.DataFrame(
        {
            "user_id": pl.Series(user).cast(pl.String).str.zfill(5).str.replace(r"^", "user-"),
            "item_id": pl.Series(item).cast(pl.String).str.zfill(7).str.replace(r"^", "item-"),
            "event": pl.Series(np.array(["view", "click", "purchase"])[rng.choice(3, n, p=[0.85, 0.12, 0.03])]),
            "ts": pl.Series(ts).cast(pl.Datetime("us", "UTC")),
        }
    ).sort("user_id", "ts")


def _descendants(pid: int) -> list[int]:
    """Return the pids of every live descendant of pid (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _status_kib(pid: int, field: str) -> int:
    """Return a /proc/<pid>/status memory field (VmHWM: peak RSS so far, VmRSS: RSS now) in KiB, 0 when gone."""
    try:
        match = re.search(rf"{field}:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return 0
    return int(match.group(1)) if match else 0


def _hwm_kib(pid: int) -> int:
    """Return a process's peak RSS so far in KiB."""
    return _status_kib(pid, "VmHWM")


def _poll_children(pid: int, peaks: dict[int, int], done: threading.Event, cap_kib: int, trace: list[tuple[float, int]]) -> None:
    """Record the peak RSS of every descendant of pid and the flow's RSS over time until done; kill above cap_kib."""
    while not done.wait(0.2):
        trace.append((time.perf_counter(), _status_kib(pid, "VmRSS")))
        for child in _descendants(pid):
            peaks[child] = max(peaks.get(child, 0), _hwm_kib(child))
        if _hwm_kib(pid) > cap_kib:  # a shared machine: stop before the kernel's OOM killer picks a victim
            log.error("flow process above the %d MiB cap: killing run %d", cap_kib // 1024, pid)
            os.killpg(pid, signal.SIGKILL)
            return


def _stages(stdout: str) -> dict[str, float]:
    """Return the per-stage seconds printed in the run summary ("stages (s): ingest 1.0, ...")."""
    match = re.search(r"stages \(s\): (.*)", stdout)
    pairs = [p.rsplit(" ", 1) for p in match.group(1).split(", ")] if match else []
    return {name: float(value) for name, value in pairs}


FINISHED = re.compile(r"prefect\.task_runs \[([\w-]+?)(?:-\w+)?\]: Finished in state")


def _tee_stderr(stream: IO[str], logfile: IO[str], events: list[tuple[float, str]]) -> None:
    """Copy the run's stderr to its log; note when each task run finished (for the per-task RSS table)."""
    for line in stream:
        logfile.write(line)
        if match := FINISHED.search(line):
            events.append((time.perf_counter(), match.group(1)))


def per_task_rss(trace: list[tuple[float, int]], events: list[tuple[float, str]]) -> list[tuple[str, float, float]]:
    """Return (task, RSS at its end, max RSS since the previous task ended) in MiB for each finished task run."""
    rows, start = [], 0.0
    for end, name in events:
        at_end = min(trace, key=lambda tr: abs(tr[0] - end))[1] if trace else 0
        window = [rss for t, rss in trace if start <= t <= end] + [at_end]
        rows.append((name, at_end / 1024.0, max(window) / 1024.0))
        start = end
    return rows


def run_once(n_items: int, users: int, root: Path, shard_size: int, repo: Path, cap_mib: int) -> Result:
    """Generate the inputs of one size and time one nightly run over them in a subprocess."""
    home = root / f"items-{n_items}"
    shutil.rmtree(home, ignore_errors=True)
    (home / "inputs").mkdir(parents=True)
    items_uri, inter_uri = home / "inputs" / "items.parquet", home / "inputs" / "interactions.parquet"
    synthetic_items(n_items).write_parquet(items_uri)
    synthetic_interactions(n_items, users).write_parquet(inter_uri)
    env = {
        **os.environ,
        "NIGHTSCORE_MODEL": str(write_tiny_model(root / "tiny-bert-random")),
        "NIGHTSCORE_BACKEND": "torch",
        "NIGHTSCORE_PRECISION": "fp32",
        "NIGHTSCORE_DEVICE": "cpu",
        "NIGHTSCORE_TOKEN_BUDGET": "8192",
        "NIGHTSCORE_SHARD_SIZE": str(shard_size),
        # synthetic interactions have no structure a recommender could learn: measure memory, never gate on quality
        "NIGHTSCORE_CANDIDATE_GATE_RECALL_MARGIN": "-1",
        "PYTHONUNBUFFERED": "1",
    }
    cmd = [
        sys.executable,
        "-c",
        CLI,
        "run",
        "nightly",
        "--items",
        str(items_uri),
        "--interactions",
        str(inter_uri),
        "--run-date",
        RUN_DATE,
        "--home",
        str(home),
    ]
    peaks: dict[int, int] = {}
    trace: list[tuple[float, int]] = []
    events: list[tuple[float, str]] = []
    done = threading.Event()
    started = time.perf_counter()
    with open(home / "run.log", "w") as logfile:
        proc = subprocess.Popen(
            cmd, env=env, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )  # its own process group, so the cap can stop all of it
        poller = threading.Thread(target=_poll_children, args=(proc.pid, peaks, done, cap_mib * 1024, trace), daemon=True)
        tee = threading.Thread(target=_tee_stderr, args=(proc.stderr, logfile, events), daemon=True)
        poller.start()
        tee.start()
        stdout = proc.stdout.read() if proc.stdout else ""
        tee.join()
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    done.set()
    poller.join()
    (home / "summary.txt").write_text(stdout)
    rc = os.waitstatus_to_exitcode(status)
    if rc:
        log.error("run over %d items exited %d; see %s", n_items, rc, home / "run.log")
    return Result(
        n_items,
        wall,
        usage.ru_maxrss / 1024.0,
        max(peaks.values(), default=0) / 1024.0,
        _stages(stdout),
        rc,
        per_task_rss(trace, events),
    )


def table(results: list[Result]) -> str:
    """Return the side-by-side table: one column per size and one of ratios last/first."""
    names = list(dict.fromkeys(name for r in results for name in r.stages))
    rows: list[tuple[str, list[float | int]]] = [
        ("items", [r.items for r in results]),
        ("exit code", [r.rc for r in results]),
        ("wall s", [r.wall_s for r in results]),
        ("flow peak RSS MiB", [r.flow_peak_mib for r in results]),
        ("server peak RSS MiB", [r.server_peak_mib for r in results]),
    ]
    rows += [(f"  stage {n} s", [r.stages.get(n, float("nan")) for r in results]) for n in names]
    head = f"{'':24}" + "".join(f"{r.items:>14,}" for r in results) + f"{'ratio':>10}"
    lines = [head]
    for label, values in rows:
        ratio = values[-1] / values[0] if len(values) > 1 and values[0] else float("nan")
        cells = "".join(f"{v:>14,.1f}" if isinstance(v, float) else f"{v:>14,}" for v in values)
        lines.append(f"{label:24}{cells}{ratio:>10.2f}")
    return "\n".join(lines)


def task_table(results: list[Result]) -> str:
    """Return per task run: the flow's RSS when it ended and its max RSS during it (MiB), one pair per size."""
    lines = [f"{'task run (RSS at end / max during, MiB)':40}" + "".join(f"{r.items:>22,}" for r in results)]
    names = list(dict.fromkeys(name for r in results for name, _, _ in r.tasks))
    for name in names:
        cells = []
        for r in results:
            rows = [(end, peak) for n, end, peak in r.tasks if n == name]
            cells.append(f"{max(e for e, _ in rows):>10,.0f} /{max(p for _, p in rows):>9,.0f}" if rows else f"{'-':>22}")
        lines.append(f"{name:40}" + "".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    """Run every size, print the table, optionally save the results as JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--users", type=int, default=2000)
    parser.add_argument("--shard-size", type=int, default=16384)
    parser.add_argument("--root", type=Path, default=Path("bench-results/memory"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cap-mib", type=int, default=12_000, help="kill a run whose flow process exceeds this RSS")
    parser.add_argument(
        "--repo", type=Path, default=Path(__file__).resolve().parents[1], help="checkout whose code runs (default: this one)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    results = []
    for n in args.sizes:
        log.info("nightly run over %d items, %d users", n, args.users)
        results.append(run_once(n, args.users, args.root.resolve(), args.shard_size, args.repo.resolve(), args.cap_mib))
        log.info("%d items: %.1fs, flow peak %.0f MiB", n, results[-1].wall_s, results[-1].flow_peak_mib)
    print(table(results))
    print(task_table(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
