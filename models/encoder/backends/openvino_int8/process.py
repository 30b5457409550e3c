"""The OpenVINO int8 search in a child process, so that a crash of the runtime fails int8 alone, not the caller.

The search compiles a few dozen models. On an AMD EPYC Zen 4 host one of those compiles once died with a
general protection fault inside OpenVINO's CPU plugin (2026.4.1), which took the whole calibrating process with
it. Here the float IR, the statistics and validation batches, and the job's settings are written to a folder;
a fresh interpreter runs `quantize_to_target` over them and writes the int8 IR and its report back. A child
killed by a signal, or one that exits without a result, becomes `Int8SearchCrashed` (a `BackendUnavailable`:
calibration notes it and goes on without OpenVINO int8); the search's own refusals keep their types.
"""

from __future__ import annotations

import gc
import json
import logging
import signal
import subprocess
import sys
import tempfile
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from core.collector import imports_held
from models.encoder.backends import vendor_telemetry
from models.encoder.backends.base import BackendUnavailable
from models.encoder.backends.openvino_int8.search import (
    Int8NotFaster,
    QuantizationFailed,
    SpeedGate,
    StaticInt8,
    Validation,
    quantize_to_target,
)

log = logging.getLogger(__name__)

REFUSALS: dict[str, type[BackendUnavailable]] = {
    "QuantizationFailed": QuantizationFailed,
    "Int8NotFaster": Int8NotFaster,
    "BackendUnavailable": BackendUnavailable,
}


class Int8SearchCrashed(BackendUnavailable):
    """The child running the int8 search died (a signal) or left no result: int8 is unavailable this time."""


def quantize_isolated(
    model: Any,
    calibration: list[dict[str, np.ndarray]],
    validation: Validation,
    floor: float,
    config: dict[str, object],
    min_speedup: float = 0.0,
) -> StaticInt8:
    """Return `quantize_to_target`'s result for these inputs, computed in a child process."""
    with tempfile.TemporaryDirectory(prefix="nightscore-int8-") as tmp:
        folder = Path(tmp)
        write_job(folder, model, calibration, validation, {"floor": floor, "config": config, "min_speedup": min_speedup})
        returncode = _run_child(folder)
        return read_result(folder, returncode)


def write_job(folder: Path, model: Any, calibration: list[dict[str, np.ndarray]], validation: Validation, job: dict) -> None:
    """Write the float IR, the batches and the job's settings into folder."""
    import openvino as ov

    ov.save_model(model, str(folder / "float.xml"), compress_to_fp16=False)
    arrays: dict[str, Any] = {f"calibration_{i}_{k}": v for i, batch in enumerate(calibration) for k, v in batch.items()}
    arrays |= {f"validation_{i}_{k}": v for i, batch in enumerate(validation.batches) for k, v in batch.items()}
    arrays["expected"] = validation.expected
    np.savez(folder / "batches.npz", **arrays)
    settings = {**job, "pooling": validation.pooling, "normalize": validation.normalize}
    settings |= {"calibration": len(calibration), "validation": len(validation.batches)}
    (folder / "job.json").write_text(json.dumps(settings))


def _run_child(folder: Path) -> int:
    """Return the exit status of a fresh interpreter running the job in folder (negative: killed by that signal)."""
    return subprocess.run(child_command(folder), check=False).returncode


def child_command(folder: Path) -> list[str]:
    """Return the command of a fresh interpreter that runs the job in folder, its imports held off the collector.

    The search builds NNCF graphs for a few dozen quantisations, and each full collection walked the 340,000
    objects torch, OpenVINO and NNCF leave. Frozen (core/collector.py), a random BERT's search at the int8 floor
    took 7.1 CPU-s against 8.3 on a 2-core AVX2 EPYC (benchmarks/int8_child.py).
    """
    paths = [p for p in sys.path if p]  # the child imports what this process does
    script = (
        f"import sys; sys.path[:0] = {paths!r}\n"
        "from core.collector import imports_held\n"
        f"with imports_held():\n    from {__name__} import main\n"
        f"main({str(folder)!r})\n"
    )
    return [sys.executable, "-c", script]


def read_result(folder: Path, returncode: int) -> StaticInt8:
    """Return the child's result; raise its refusal by type, or Int8SearchCrashed when it left none."""
    import openvino as ov

    error, result = folder / "error.json", folder / "result.json"
    if error.is_file():
        raised = json.loads(error.read_text())
        raise REFUSALS.get(raised["type"], Int8SearchCrashed)(raised["message"])
    if returncode != 0 or not result.is_file():
        raise Int8SearchCrashed(f"the OpenVINO int8 search {_how_it_ended(returncode)} and left no result")
    report: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(result.read_text()).items()}
    return StaticInt8(model=ov.Core().read_model(str(folder / "int8.xml")), **report)


def _how_it_ended(returncode: int) -> str:
    """Return 'was killed by SIGSEGV' for a negative status, 'exited with status N' otherwise."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def read_job(folder: Path) -> tuple[Any, list[dict[str, np.ndarray]], Validation, dict]:
    """Return (float model, calibration batches, validation, settings) as write_job left them."""
    import openvino as ov

    settings = json.loads((folder / "job.json").read_text())
    with np.load(folder / "batches.npz") as arrays:
        keys = ("input_ids", "attention_mask")
        calibration = [{k: arrays[f"calibration_{i}_{k}"] for k in keys} for i in range(settings["calibration"])]
        batches = [{k: arrays[f"validation_{i}_{k}"] for k in keys} for i in range(settings["validation"])]
        validation = Validation(batches, arrays["expected"], settings["pooling"], settings["normalize"])
    return ov.Core().read_model(str(folder / "float.xml")), calibration, validation, settings


def main(folder_name: str) -> None:
    """Run the job in folder_name (the child's entry point): int8.xml + result.json, or error.json."""
    vendor_telemetry.decline()  # before OpenVINO and NNCF load: their usage events otherwise
    with imports_held():  # the runtime loads in the child only, and the search's NNCF with it
        import nncf  # noqa: F401
        import openvino as ov

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    frozen, collections = gc.get_freeze_count(), gc.get_stats()[2]["collections"]
    log.info("int8 search child: %d objects frozen, %d full collections before the search", frozen, collections)
    folder = Path(folder_name)
    model, calibration, validation, settings = read_job(folder)
    gate = SpeedGate(settings["min_speedup"], model) if settings["min_speedup"] > 0 else None
    try:
        result = quantize_to_target(model, calibration, validation, settings["floor"], settings["config"], gate)
    except BackendUnavailable as exc:
        (folder / "error.json").write_text(json.dumps({"type": type(exc).__name__, "message": str(exc)}))
        return
    ov.save_model(result.model, str(folder / "int8.xml"), compress_to_fp16=False)
    report = {f.name: getattr(result, f.name) for f in fields(result) if f.name != "model"}
    (folder / "result.json").write_text(json.dumps(report))
