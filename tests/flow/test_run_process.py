"""A `nightscore run nightly` process: the cyclic collector kept off its imports (core/collector.py), and on the embedded
cache no redis-py (storage/cache_redis.py, storage/events_redis.py)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.helpers import demo_inputs, fresh_interpreter_output, nightly_args, small_run_environment

# The command's own main() in a new interpreter (the console script's code path), then what the collector did.
RUN = """
import gc, sys
from nightscore.cli.entry import main
code = main(sys.argv[1:])
print("collector:", code, gc.get_freeze_count(), gc.get_stats()[2]["collections"], gc.isenabled(), "redis" in sys.modules)
"""


def test_a_run_freezes_its_imports_makes_few_full_collections_and_no_redis(tmp_path: Path, prefect_server: str) -> None:
    inputs = demo_inputs(tmp_path / "inputs", items=120, users=30, seed=3)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSCORE_")}
    env |= {**small_run_environment(), "PREFECT_API_URL": prefect_server}
    argv = nightly_args(inputs, "2026-11-30", tmp_path / "home")
    output = fresh_interpreter_output(RUN.replace("sys.argv[1:]", repr(argv)), timeout=300, env=env)
    code, frozen, full, enabled, redis = output.splitlines()[-1].removeprefix("collector: ").split()
    assert code == "0", output[-2000:]
    assert int(frozen) >= 100_000, "the run's libraries were left in the collector's generations"
    assert int(full) <= 5, f"{full} full collections (a tiny run made 9 with its imports in reach: benchmarks/run_start.py)"
    assert enabled == "True"
    assert redis == "False", "a run on the embedded SQLite cache imported redis-py (0.2 s with its OpenTelemetry SDK)"
