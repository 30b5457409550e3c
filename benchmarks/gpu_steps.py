"""Steps 4 and 5 of benchmarks/gpu_check.sh: a nightly run on demo items, and one Ray run compared with a local one.

    python benchmarks/gpu_steps.py nightly --items N --users M --work DIR   # wall time by stage, device-hours / 1M items
    python benchmarks/gpu_steps.py nightly-figures LOG N                    # the figures line of a nightly log
    python benchmarks/gpu_steps.py ray --items N --work DIR                 # ray vs local: published rows equal?

Both run the `nightscore` console script in its own process, on NIGHTSCORE_DEVICE as set by the caller.
The Ray run needs a Prefect server (under Ray every worker would start its own): one is started on
loopback for it; Ray gives each encode shard a GPU (num_gpus=1) when the cluster has one.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CLI = str(Path(sys.executable).with_name("nightscore"))
RUN_DATE = "2026-11-30"
# "run <id> (<date>) published in 12.3s (the run 10.1s, Prefect start-up and the rest 2.2s) on cpu"
SUMMARY = re.compile(r"run \S+ \(\S+\) (\w+) in ([\d.]+)s(?: \(the run ([\d.]+)s[^)]*\))? on (\S+)")
STAGES = re.compile(r"stages \(s\): (.*)")
WORKER_SHARD = re.compile(r"\(encode-shard pid=(\d+)\).*? shard (\d+): \d+ texts")


def demo_inputs(folder: Path, items: int, users: int) -> Path:
    """Write demo inputs with the CLI (items.parquet, interactions.parquet) and return the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [CLI, "demo-data", "--out", str(folder), "--items", str(items), "--users", str(users), "--home", str(folder / "home")],
        check=True,
    )
    return folder


def run_nightly(home: Path, inputs: Path, **env: str) -> str:
    """Run `nightscore run nightly` on the inputs; return its output (raise with its tail when it fails)."""
    full = {**os.environ, **env}
    done = subprocess.run(
        [
            CLI,
            "run",
            "nightly",
            "--items",
            str(inputs / "items.parquet"),
            "--interactions",
            str(inputs / "interactions.parquet"),
            "--run-date",
            RUN_DATE,
            "--home",
            str(home),
        ],
        env=full,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"nightly run failed (rc {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout + done.stderr


def figures(log: str, items: int) -> str:
    """Return the figures line of a nightly run: status, wall, stages, device-hours per 1M items."""
    found = SUMMARY.search(log)
    if not found:
        return "no run summary in the log"
    status, device = found.group(1), found.group(4)
    wall = float(found.group(3) or found.group(2))  # the run's own wall time, without Prefect's start-up
    stages = STAGES.search(log)
    per_million = wall / 3600 * 1_000_000 / max(items, 1)
    return (
        f"nightly: {items} items {status} in {wall:.1f}s on {device}; {per_million:.3f} device-hours per 1M items; "
        f"stages (s): {stages.group(1) if stages else '?'}"
    )


def published(home: Path) -> tuple[list[tuple], list[tuple]]:
    """Return the published item_scores (embeddings included) and user_candidates of a home."""
    import duckdb

    con = duckdb.connect(str(home / "warehouse.duckdb"), read_only=True)
    try:
        scores = con.execute("select item_id, topic, topic_score, embedding from latest_item_scores order by item_id").fetchall()
        cands = con.execute("select user_id, rank, item_id from latest_user_candidates order by user_id, rank").fetchall()
    finally:
        con.close()
    return scores, cands


def ray_check(items: int, work: Path) -> str:
    """Return the ray check line: the Ray run's rows against the local run's, and the Ray resources seen."""
    import numpy as np

    from tests import servers

    if not Path(servers.PREFECT).exists():  # a venv that shares another's packages has no `prefect` script of its own
        shim = work / "prefect-cli"
        work.mkdir(parents=True, exist_ok=True)
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m prefect "$@"\n')
        shim.chmod(0o755)
        servers.PREFECT = str(shim)

    inputs = demo_inputs(work / "inputs", items, max(items // 5, 10))
    # one pinned mode for both runs: auto calibrates in each run and may pick another mode under load, which would
    # compare calibration noise, not the task runner
    cuda = os.environ.get("NIGHTSCORE_DEVICE") == "cuda"
    small = {
        "NIGHTSCORE_SHARD_SIZE": str(max(items // 8, 16)),
        "NIGHTSCORE_BACKEND": os.environ.get("NIGHTSCORE_BACKEND", "torch"),
        "NIGHTSCORE_PRECISION": os.environ.get("NIGHTSCORE_PRECISION", "bf16" if cuda else "fp32"),
    }
    started = time.perf_counter()
    (work / "prefect").mkdir(parents=True, exist_ok=True)
    with servers.prefect_server(work / "prefect") as api:
        local_log = run_nightly(work / "local", inputs, PREFECT_API_URL=api, **small)
        ray_log = run_nightly(
            work / "ray", inputs, PREFECT_API_URL=api, NIGHTSCORE_TASK_RUNNER="ray", RAY_DEDUP_LOGS="0", **small
        )
    local, on_ray = published(work / "local"), published(work / "ray")
    a = np.array([row[3] for row in local[0]], dtype=np.float32)
    b = np.array([row[3] for row in on_ray[0]], dtype=np.float32)
    same_ids = [r[0] for r in local[0]] == [r[0] for r in on_ray[0]]
    diff = float(np.abs(a - b).max()) if same_ids and a.shape == b.shape and a.size else float("nan")
    same = same_ids and local[1] == on_ray[1] and [r[1] for r in local[0]] == [r[1] for r in on_ray[0]]
    on_workers = len(set(WORKER_SHARD.findall(ray_log)))
    device = "cuda (num_gpus=1 per shard task)" if os.environ.get("NIGHTSCORE_DEVICE") == "cuda" else "cpu"
    print(local_log[-1500:], ray_log[-3000:], sep="\n---\n")
    verdict = "EQUAL" if same and diff <= 1e-5 and on_workers > 0 and "task runner: ray" in ray_log else "DIFFERENT"
    return (
        f"ray check: {verdict}: {len(on_ray[0])} items, max |embedding delta| {diff:.2e}, topics and candidates "
        f"{'equal' if same else 'differ'}; {on_workers} shards encoded in Ray workers on {device}; "
        f"both runs {time.perf_counter() - started:.0f}s"
    )


def main(argv: list[str] | None = None) -> int:
    """Run one step; return 0 (a failed step raises SystemExit with its reason)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="step", required=True)
    n = sub.add_parser("nightly")
    n.add_argument("--items", type=int, required=True)
    n.add_argument("--users", type=int, required=True)
    n.add_argument("--work", type=Path, required=True)
    f = sub.add_parser("nightly-figures")
    f.add_argument("log", type=Path)
    f.add_argument("items", type=int)
    r = sub.add_parser("ray")
    r.add_argument("--items", type=int, required=True)
    r.add_argument("--work", type=Path, required=True)
    args = p.parse_args(argv)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if args.step == "nightly":
        inputs = demo_inputs(args.work / "inputs", args.items, args.users)
        log = run_nightly(args.work / "home", inputs)
        print(log[-4000:])
        print(figures(log, args.items))
    elif args.step == "nightly-figures":
        print(figures(args.log.read_text(), args.items))
    else:
        line = ray_check(args.items, args.work)
        print(line)
        if "DIFFERENT" in line:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
