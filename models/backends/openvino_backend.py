"""The OpenVINO backend (CPU): the model converted locally from its torch module, cached by digest and precision.

fp32 and bf16 share one float IR (bf16 is OpenVINO's inference-precision hint, native on CPUs with
AVX-512 BF16 or AMX); int8 is an IR with int8-compressed weights that the CPU plugin multiplies with
dynamically quantised activations (one scale per group of 32 values of a token).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.backends.base import BackendRequest, BackendUnavailable, converted_dir
from models.backends.int8 import CompressedLinear, quantized_copy

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "int8")
HINTS = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}
INT8_GROUP = 32  # activation values per dynamic-quantisation scale (OpenVINO's CPU default)


def unavailable_reason(precision: str, device: torch.device) -> str | None:
    """Return why OpenVINO cannot run precision on device, or None when it can."""
    try:
        import openvino as ov
    except ImportError:
        return "openvino is not installed (pip install openvino)"
    if device.type != "cpu":
        return f"the OpenVINO backend runs on CPU only, not {device.type}"
    if precision not in PRECISIONS:
        return f"openvino has no precision {precision!r} here"
    if precision == "bf16" and "BF16" not in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        return "this CPU has no native bf16 (OpenVINO would silently run f32)"
    return None


class _HiddenStates(torch.nn.Module):
    """(input_ids, attention_mask) -> last_hidden_state: the traced signature."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Return the last hidden states."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def convert(module: torch.nn.Module, precision: str) -> Any:  # an openvino.Model (imported on first use)
    """Return the OpenVINO model of a torch module, with dynamic batch and length (int8: compressed weights)."""
    import openvino as ov

    source = quantized_copy(module, CompressedLinear) if precision == "int8" else module
    example = {"input_ids": torch.ones(2, 16, dtype=torch.long), "attention_mask": torch.ones(2, 16, dtype=torch.long)}
    return ov.convert_model(
        _HiddenStates(source).eval(),
        example_input=example,
        input=[("input_ids", [-1, -1], ov.Type.i64), ("attention_mask", [-1, -1], ov.Type.i64)],
    )


def load_or_convert(request: BackendRequest) -> Any:  # an openvino.Model
    """Return the converted model: read from the cache folder when there, else converted (and saved there)."""
    import openvino as ov

    folder = converted_dir(request, f"openvino-{ov.__version__.split('-')[0]}")
    xml = folder / "model.xml" if folder else None
    if xml is not None and xml.is_file():
        return ov.Core().read_model(str(xml))
    started = time.perf_counter()
    model = convert(request.module, request.precision)
    log.info("converted %s to OpenVINO %s in %.1fs", request.info.version, request.precision, time.perf_counter() - started)
    if xml is not None:
        _save_atomically(model, xml)
    return model


def _save_atomically(model: Any, xml: Path) -> None:
    """Write the IR under a temporary folder name, then rename it into place (a killed run leaves no half IR)."""
    import openvino as ov

    staging = xml.parent.with_name(f"{xml.parent.name}.tmp-{time.time_ns()}")
    staging.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(staging / xml.name), compress_to_fp16=False)
    try:
        staging.rename(xml.parent)
    except OSError:  # another process won the race: its copy is the same conversion
        import shutil

        shutil.rmtree(staging, ignore_errors=True)


class OpenVINOBackend:
    """A model compiled by OpenVINO's CPU plugin in one inference precision."""

    name = "openvino"
    shape_sensitive = True  # kernels are specialised per input shape: calibration tries lengths padded to 16

    def __init__(self, request: BackendRequest) -> None:
        reason = unavailable_reason(request.precision, request.device)
        if reason:
            raise BackendUnavailable(reason)
        import openvino as ov

        self.precision = request.precision
        self.length_multiple = 1
        config: dict[str, object] = {
            "INFERENCE_PRECISION_HINT": HINTS[request.precision],
            "INFERENCE_NUM_THREADS": request.threads,
            "PERFORMANCE_HINT": "LATENCY",
        }
        if request.precision == "int8":
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = INT8_GROUP
        self._compiled = ov.Core().compile_model(load_or_convert(request), "CPU", config)
        self._request = self._compiled.create_infer_request()
        self._ov_version = ov.__version__.split("-")[0]

    @property
    def version(self) -> str:
        """Return OpenVINO's version and the precision."""
        return f"openvino-{self._ov_version}/{self.precision}"

    def warm_up(self, input_ids: np.ndarray, mask: np.ndarray) -> None:
        """Run one batch and discard it."""
        self.hidden_states(input_ids, mask)

    def hidden_states(self, input_ids: np.ndarray | torch.Tensor, mask: np.ndarray | torch.Tensor) -> np.ndarray:
        """Return the last hidden states of one padded batch (float32, valid until the next call)."""
        ids = np.asarray(input_ids, dtype=np.int64)
        attention = np.asarray(mask, dtype=np.int64)
        return self._request.infer({"input_ids": ids, "attention_mask": attention})[0]
