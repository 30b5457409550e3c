"""auto's choice persisted per kind of machine and model: its key, its file, reading and writing it."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

import torch

from models.encoder.backends.base import write_atomically
from models.encoder.calibration import budgets, candidates
from models.encoder.device import device_kind, slug
from models.encoder.precision import Fidelity
from models.encoder.spec import Calibration, EncoderSpec, Mode
from models.encoder.st_layout import ModelInfo

log = logging.getLogger(__name__)


FORMAT = 4  # 2: modes carry streams; OpenVINO int8 is static. 3: the onnxruntime backend. 4: the padding floor


def calibration_key(spec: EncoderSpec, info: ModelInfo, device: torch.device, threads: int) -> dict[str, object]:
    """Return everything a persisted choice depends on; a stored choice with another key is measured again."""
    return {
        "format": FORMAT,
        "device_kind": device_kind(device, threads),
        "model": info.version,
        "max_seq_length": info.max_seq_length,
        "float_floor": spec.float_floor,
        "int8_floor": spec.int8_floor,
        "padding_floor": spec.padding_floor,
        "candidates": [list(c) for c in candidates(spec, device)],
        "budgets": list(budgets(spec, device)),
        "torch": torch.__version__,
        "openvino": _version_of("openvino"),
        "onnxruntime": _version_of("onnxruntime"),
    }


def _version_of(package: str) -> str:
    """Return an installed runtime's version, or 'none' (a runtime added or upgraded changes the answer)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "none"


def calibration_file(spec: EncoderSpec, info: ModelInfo, device: torch.device, threads: int) -> Path:
    """Return where the choice for this model on this kind of machine is persisted."""
    assert spec.cache_dir is not None
    return Path(spec.cache_dir) / "calibration" / device_kind(device, threads) / f"{slug(info.version)}.json"


def read_persisted(spec: EncoderSpec, info: ModelInfo, device: torch.device, threads: int) -> Calibration | None:
    """Return the persisted choice for this spec on this kind of machine (from_cache True), or None (none, or stale)."""
    file = calibration_file(spec, info, device, threads)
    if not file.is_file():
        return None
    try:
        stored = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError):
        log.warning("calibration file %s is unreadable: measuring again", file)
        return None
    if stored.get("key") != calibration_key(spec, info, device, threads):
        log.info("calibration file %s was made for other settings or runtimes: measuring again", file)
        return None
    return Calibration(
        Mode(**stored["mode"]),
        Fidelity(**stored["fidelity"]),
        stored["tokens_per_s"],
        stored["key"]["device_kind"],
        float(stored.get("seconds", 0.0)),
        True,
        stored["table"],
    )


def persist(spec: EncoderSpec, info: ModelInfo, device: torch.device, threads: int, calibration: Calibration) -> None:
    """Write the choice atomically (temporary name, then rename)."""
    file = calibration_file(spec, info, device, threads)
    body = {
        "key": calibration_key(spec, info, device, threads),
        "mode": asdict(calibration.mode),
        "fidelity": asdict(calibration.fidelity),
        "tokens_per_s": calibration.tokens_per_s,
        "seconds": calibration.seconds,
        "table": calibration.table,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_atomically(file, json.dumps(body, indent=2).encode())
