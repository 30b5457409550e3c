"""What a `nightscore run nightly` process costs on a small input, with the cyclic collector held off during the
heavy imports (core/collector.py, A) and left to Python (B), pair by pair in alternating order.

Each run is a fresh `nightscore run nightly` subprocess with its own home, on the same demo inputs (tests/helpers.py's
generator, --items items), the tiny random encoder (tests/tiny_model.py, torch fp32) so the model costs nothing, and one
Prefect server shared by all runs (so its start is not counted). The process's own CPU time and peak RSS come from
the kernel (`os.wait4`). B is the same checkout with `core.collector.imports_held` replaced by a no-op before the CLI
imports, or another checkout given by --repo-b (a baseline tree).

    python benchmarks/run_start.py [--pairs 5] [--items 300] [--repo-b CHECKOUT]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.candidate_scale import cpu_flags
from tests.helpers import demo_inputs, nightly_args, small_run_environment
from tests.tiny_model import FOLDER, NAME, write_tiny_model

log = logging.getLogger("bench")
REPO = Path(__file__).resolve().parents[1]
CLI = "import sys; sys.path.insert(0, '.'); from nightscore.cli import entrypoint; entrypoint()"
UNHELD = "import contextlib, core.collector; core.collector.imports_held = contextlib.nullcontext; "


@dataclass(frozen=True)
class Run:
    """One run's wall seconds, CPU seconds (its own process) and peak RSS in MiB."""

    wall: float
    cpu: float
    peak_mib: float


def one_run(code: str, cwd: Path, args: list[str], env: dict[str, str], log_file: Path) -> Run:
    """Return what one CLI process running `code` with args cost (reaped here with os.wait4 for its own rusage)."""
    started = time.perf_counter()
    with log_file.open("w+b") as out:
        process = subprocess.Popen([sys.executable, "-c", code, *args], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        run = reaped(process, started)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if process.returncode != 0 or "published" not in text:
        raise SystemExit(f"run failed (exit {process.returncode}): {text[-2000:]}")
    return run


def reaped(process: subprocess.Popen[bytes], started: float) -> Run:
    """Return what a child started at `started` (perf_counter) cost, reaped here with os.wait4 for its own rusage."""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    return Run(time.perf_counter() - started, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


def measure(pairs: int, items: int, repo_b: Path | None, root: Path, api_url: str) -> dict[str, list[Run]]:
    """Return the runs of each arm: `pairs` pairs, A first in even pairs and B first in odd ones."""
    inputs = demo_inputs(root / "inputs", items=items, users=max(20, items // 5), seed=1)
    base = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSCORE_")}
    env = {**base, **small_run_environment(), "PREFECT_API_URL": api_url, "PYTHONPATH": ""}
    arms = {"A": (CLI, REPO), "B": (CLI, repo_b) if repo_b else (UNHELD + CLI, REPO)}
    runs: dict[str, list[Run]] = {"A": [], "B": []}
    for pair in range(pairs):
        for arm in ("A", "B") if pair % 2 == 0 else ("B", "A"):
            code, cwd = arms[arm]
            home = root / f"home-{arm}-{pair}"
            runs[arm].append(one_run(code, cwd, nightly_args(inputs, "2026-11-30", home), env, root / f"{arm}-{pair}.log"))
            log.info("pair %d %s: %s", pair, arm, runs[arm][-1])
    return runs


def table(runs: dict[str, list[Run]], repo_b: Path | None) -> str:
    """Return the side-by-side table: medians per arm and the median of the pairs' A/B ratios."""
    b_name = f"B: {repo_b}" if repo_b else "B: collector left to Python"
    lines = [
        f"CPU: {cpu_flags()}; {os.cpu_count()} cores",
        "",
        "| arm | runs | wall s | CPU s | peak RSS MiB |",
        "|---|---|---|---|---|",
    ]
    for arm, name in (("A", "A: imports held (core/collector.py)"), ("B", b_name)):
        rows = runs[arm]
        lines.append(
            f"| {name} | {len(rows)} | {median(r.wall for r in rows):.2f} | {median(r.cpu for r in rows):.2f} | "
            f"{median(r.peak_mib for r in rows):.0f} |"
        )
    ratio = {
        field: median(getattr(a, field) / getattr(b, field) for a, b in zip(runs["A"], runs["B"], strict=True))
        for field in ("wall", "cpu", "peak_mib")
    }
    lines.append(f"| A/B (median of pairs) | | {ratio['wall']:.3f} | {ratio['cpu']:.3f} | {ratio['peak_mib']:.3f} |")
    return "\n".join(lines)


def median(values: Iterable[float]) -> float:
    """Return the median of values."""
    return statistics.median(list(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--repo-b", type=Path, default=None, help="another checkout to run as B")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_UI_ENABLED", "false")
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with tempfile.TemporaryDirectory(prefix="run-start-") as tmp, prefect_test_harness(server_startup_timeout=120):
        root = Path(tmp)
        FOLDER[:] = [write_tiny_model(root / NAME)]
        runs = measure(args.pairs, args.items, args.repo_b, root, str(PREFECT_API_URL.value()))
    print(table(runs, args.repo_b))


if __name__ == "__main__":
    main()
