"""benchmarks/gpu_check.sh run --dry-run walks every step of the GPU check (issue 35) on the CPU into one folder.

Slow (5-10 minutes on 2 cores: calibration, the benchmark's rows, a nightly run) and a repeat of what the model and
flow tiers test at tiny sizes: opt-in (marker gpu_dry_run, `make test-gpu-dry-run`); run it before a session on a GPU
host and whenever benchmarks/gpu_check.sh, gpu_steps.py or inference.py change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from models.encoder.backends.registry import BACKENDS
from models.encoder.phases import PHASES

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["env", "encoder_tests", "inference", "nightly"]


@pytest.mark.slow
@pytest.mark.gpu_dry_run
@pytest.mark.timeout(1500)  # over the suite's 600 s: on a loaded 2-core machine the walk takes 10 minutes
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
    assert "dry run on the CPU" in summary and "ray" not in rows
    # Every file comes back through the device tool: at most 8 files, none in sub-folders.
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(["summary.md", *(f"{s}.log" for s in STEPS), "inference.json"]), files
    result = json.loads((out / "inference.json").read_text())
    assert {"sentence_transformers", "engine", "pretokenized", "host", "ceiling", "engine[torch-packed/fp32]"} <= set(result)
    assert result["_meta"]["auto"]["backend"] in BACKENDS
    breakdown = result["_meta"]["breakdown_s"]
    assert {"engine", "host", "engine[torch-packed/fp32]"} <= set(breakdown)
    assert set(PHASES) <= set(breakdown["engine"]) and breakdown["host"]["tokenize"] > 0
    assert "torch" in rows["env"] and "cpu" in rows["env"]
    assert "device-seconds per 1M items" in rows["nightly"] and "encode stage:" in rows["nightly"]
    assert "passed" in rows["encoder_tests"] and "failed" not in rows["encoder_tests"]


def test_carried_wheels_are_unzipped_onto_a_path_not_installed(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "demo_pkg-1.0-py3-none-any.whl", "w") as archive:
        archive.writestr("demo_pkg/__init__.py", "VALUE = 42\n")
        archive.writestr("demo_pkg-1.0.dist-info/METADATA", "Name: demo-pkg\nVersion: 1.0\n")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_steps.py"), "unpack", "--wheels", str(wheels), "--site", str(site)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == str(site)
    probe = subprocess.run(
        [sys.executable, "-c", "import demo_pkg, importlib.metadata as m; print(demo_pkg.VALUE, m.version('demo-pkg'))"],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.split() == ["42", "1.0"]
