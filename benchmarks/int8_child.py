"""What one OpenVINO int8 search child costs with its imports held off the cyclic collector (core/collector.py, A)
and with the collector left to Python (B), pair by pair in alternating order.

The job is the model tier's: a random BERT (tests/model/st_models.py) written once, searched at the int8 floor by a
fresh interpreter each time (`models.encoder.backends.openvino_int8.process.child_command`). B runs the same command
with `core.collector.imports_held` replaced by a no-op first. The child's own CPU time comes from the kernel
(`os.wait4`); its peak RSS is not shown, as it counts the forked parent's pages from before the exec.

    python benchmarks/int8_child.py [--pairs 4] [--floor 0.99]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.candidate_scale import cpu_flags
from benchmarks.run_start import Run, median, reaped

log = logging.getLogger("int8_child")
UNHELD = "import contextlib, core.collector; core.collector.imports_held = contextlib.nullcontext\n"


def one_search(command: list[str], folder: Path) -> Run:
    """Return what one child searching the job in folder cost (reaped here with os.wait4 for its own rusage)."""
    import subprocess
    import time

    for leftover in ("result.json", "error.json"):
        (folder / leftover).unlink(missing_ok=True)
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    search = reaped(process, started)
    if process.returncode != 0 or not ((folder / "result.json").exists() or (folder / "error.json").exists()):
        raise SystemExit(f"the search child failed (exit {process.returncode})")
    return search


def measure(pairs: int, floor: float, folder: Path) -> dict[str, list[Run]]:
    """Return the searches of each arm: `pairs` pairs, A first in even pairs and B first in odd ones."""
    from models.encoder.backends.openvino_int8.process import child_command, write_job
    from tests.model.st_models import ARCHS, int8_search_inputs, save_random_model

    model, calibration, validation, config = int8_search_inputs(save_random_model(ARCHS[0], folder / "model", seed=5))
    write_job(folder, model, calibration, validation, {"floor": floor, "config": config, "min_speedup": 0.0})
    held = child_command(folder)
    arms = {"A": held, "B": [*held[:-1], UNHELD + held[-1]]}
    runs: dict[str, list[Run]] = {"A": [], "B": []}
    for pair in range(pairs):
        for arm in ("A", "B") if pair % 2 == 0 else ("B", "A"):
            runs[arm].append(one_search(arms[arm], folder))
            log.info("pair %d %s: %s", pair, arm, runs[arm][-1])
    return runs


def table(runs: dict[str, list[Run]]) -> str:
    """Return the side-by-side table: medians per arm and the median of the pairs' A/B ratios."""
    lines = [f"CPU: {cpu_flags()}; {os.cpu_count()} cores", "", "| arm | searches | wall s | CPU s |", "|---|---|---|---|"]
    for arm, name in (("A", "A: imports held (core/collector.py)"), ("B", "B: collector left to Python")):
        rows = runs[arm]
        lines.append(f"| {name} | {len(rows)} | {median(r.wall for r in rows):.2f} | {median(r.cpu for r in rows):.2f} |")
    ratio = [median(getattr(a, f) / getattr(b, f) for a, b in zip(runs["A"], runs["B"], strict=True)) for f in ("wall", "cpu")]
    lines.append(f"| A/B (median of pairs) | | {ratio[0]:.3f} | {ratio[1]:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--floor", type=float, default=0.99)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    with tempfile.TemporaryDirectory(prefix="int8-child-") as tmp:
        runs = measure(args.pairs, args.floor, Path(tmp))
    print(table(runs))


if __name__ == "__main__":
    main()
