"""benchmarks/gpu_check.sh run --dry-run walks all five steps of issue 19 on the CPU and leaves one results folder.

Slow (5-10 minutes on 2 cores: calibration, a nightly run, a Ray run against a Prefect server) and a repeat of
what the model and flow tiers test at tiny sizes: opt-in (marker gpu_dry_run, `make test-gpu-dry-run`); run it
before a session on a GPU host and whenever benchmarks/gpu_check.sh or gpu_steps.py change.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from models.encoder.backends.registry import BACKENDS

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["install", "encoder_tests", "inference", "nightly", "ray"]


@pytest.mark.slow
@pytest.mark.gpu_dry_run
@pytest.mark.timeout(1500)  # over the suite's 600 s: on a 2-core Zen 4 the walk took 10 min (MiniLM's int8 search)
def test_dry_run_walks_every_step_into_one_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTSCORE_", "PREFECT_API_URL"))}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "run", "--dry-run"],
        cwd=ROOT,
        env={**env, "OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=1500,
    )
    summary = (out / "summary.md").read_text()
    assert done.returncode == 0, summary + done.stdout[-3000:] + done.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in summary.splitlines() if line.startswith("| ") and "---" not in line}
    assert [s for s in STEPS if s in rows] == STEPS and all("| ok |" in rows[s] for s in STEPS), summary
    assert "dry run on the CPU" in summary
    # Every file comes back through the device tool: at most 8 files, none in sub-folders.
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(["summary.md", *(f"{s}.log" for s in STEPS), "inference.json"]), files
    result = json.loads((out / "inference.json").read_text())
    assert {"naive", "sentence_transformers", "engine", "ceiling"} <= set(result)
    assert result["_meta"]["auto"]["backend"] in BACKENDS
    assert "ray check: EQUAL" in rows["ray"] and "device-hours per 1M items" in rows["nightly"]
    assert "passed" in rows["encoder_tests"] and "failed" not in rows["encoder_tests"]
