"""The OpenVINO backend (CPU): the model converted locally from its torch module, cached by digest and precision.

fp32 and bf16 share one float IR (bf16 is OpenVINO's inference-precision hint, native on CPUs with
AVX-512 BF16 or AMX); int8 is the float IR statically quantised by NNCF, the lossiest layer roles kept float
by measurement (`openvino_int8`, searched in a child process: `int8_process`), run with the bf16 hint where the
CPU has it (the float parts), f32 elsewhere.
`streams` > 1 compiles that many CPU streams (threads split between them) with one infer request each, so
that the engine can run that many batches at once (small encoders leave cores idle inside one batch).
"""

from __future__ import annotations

import json
import logging
import queue
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.encoder.backends import vendor_telemetry
from models.encoder.backends.base import BackendRequest, BackendUnavailable, HiddenStates, converted_dir
from models.encoder.backends.openvino_int8.process import quantize_isolated
from models.encoder.backends.openvino_int8.search import MARGIN, Inputs, Validation
from models.encoder.pooling import pool

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "int8")


def unavailable_reason(precision: str, device: torch.device) -> str | None:
    """Return why OpenVINO cannot run precision on device, or None when it can."""
    vendor_telemetry.decline()  # before OpenVINO loads: importing it already writes a client id
    try:
        import openvino  # noqa: F401
    except ImportError:
        return "openvino is not installed (pip install openvino)"
    if device.type != "cpu":
        return f"the OpenVINO backend runs on CPU only, not {device.type}"
    if precision not in PRECISIONS:
        return f"openvino has no precision {precision!r} here"
    if precision == "bf16" and not _native_bf16():
        return "this CPU has no native bf16 (OpenVINO would silently run f32)"
    if precision == "int8":
        try:
            import nncf  # noqa: F401
        except ImportError:
            return "nncf is not installed (pip install nncf): OpenVINO int8 is quantised with it"
    return None


def _native_bf16() -> bool:
    import openvino as ov

    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def inference_hint(precision: str) -> str:
    """Return OpenVINO's inference precision for a mode: int8 runs its float layers in bf16 where that is native."""
    if precision == "bf16" or (precision == "int8" and _native_bf16()):
        return "bf16"
    return "f32"


def convert(module: torch.nn.Module) -> Any:  # an openvino.Model (imported on first use)
    """Return the float OpenVINO model of a torch module, with dynamic batch and length."""
    vendor_telemetry.decline()  # before OpenVINO loads; its converter sends an event per operation otherwise
    import openvino as ov

    example = {"input_ids": torch.ones(2, 16, dtype=torch.long), "attention_mask": torch.ones(2, 16, dtype=torch.long)}
    return ov.convert_model(
        HiddenStates(module).eval(),
        example_input=example,
        input=[("input_ids", [-1, -1], ov.Type.i64), ("attention_mask", [-1, -1], ov.Type.i64)],
    )


def _validation(request: BackendRequest) -> Validation:
    """Return the request's validation batches with torch fp32's vectors for them (the int8 verdict)."""
    batches: list[Inputs] = []
    expected = []
    with torch.inference_mode():
        for ids, mask in request.validation_batches:
            hidden = request.module(input_ids=ids, attention_mask=mask).last_hidden_state
            expected.append(pool(hidden, mask, request.info.pooling, request.info.normalize))
            batches.append({"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    return Validation(batches, np.vstack(expected), request.info.pooling, request.info.normalize)


def quantized(request: BackendRequest, float_model: Any) -> tuple[Any, dict[str, object]]:
    """Return (the static int8 model at the int8 floor plus margin, what was measured); raise QuantizationFailed."""
    if not request.sample_batches or not request.validation_batches:
        raise BackendUnavailable("OpenVINO int8 needs calibration and validation texts (none were given)")
    calibration = [{"input_ids": ids.numpy(), "attention_mask": mask.numpy()} for ids, mask in request.sample_batches]
    config = {"INFERENCE_PRECISION_HINT": inference_hint("int8"), "INFERENCE_NUM_THREADS": request.threads}
    validation = _validation(request)
    result = quantize_isolated(float_model, calibration, validation, request.int8_floor, config, request.int8_min_speedup)
    report: dict[str, object] = {
        "float_roles": list(result.float_roles),
        "float_ops": list(result.float_ops),
        "validation_min_cosine": round(result.min_cosine, 6),
        "target": round(min(request.int8_floor + MARGIN, 1.0), 6),
        "quantized_ops": result.quantized_ops,
        "ops": result.ops,
        "seconds": round(result.seconds, 1),
    }
    log.info("quantised %s to static int8: %s", request.info.version, report)
    return result.model, report


def load_or_convert(request: BackendRequest) -> Any:  # an openvino.Model
    """Return the converted model: read from the cache folder when there, else converted (and saved there)."""
    import openvino as ov

    folder = converted_dir(request, f"openvino-{ov.__version__.split('-')[0]}")
    if folder is not None and request.precision == "int8":  # which layers stay float depends on the floor
        folder = folder.with_name(f"{folder.name}-floor{request.int8_floor:g}")
    xml = folder / "model.xml" if folder else None
    if xml is not None and xml.is_file():
        return ov.Core().read_model(str(xml))
    started = time.perf_counter()
    model, report = convert(request.module), dict[str, object]()
    if request.precision == "int8":
        model, report = quantized(request, model)
    log.info("converted %s to OpenVINO %s in %.1fs", request.info.version, request.precision, time.perf_counter() - started)
    if xml is not None:
        _save_atomically(model, xml, report)
    return model


def _save_atomically(model: Any, xml: Path, report: dict[str, object]) -> None:
    """Write the IR under a temporary folder name, then rename it into place (a killed run leaves no half IR)."""
    import openvino as ov

    staging = xml.parent.with_name(f"{xml.parent.name}.tmp-{time.time_ns()}")
    staging.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(staging / xml.name), compress_to_fp16=False)
    if report:
        (staging / "quantization.json").write_text(json.dumps(report, indent=2))
    try:
        staging.rename(xml.parent)
    except OSError:  # another process won the race: its copy is the same conversion
        import shutil

        shutil.rmtree(staging, ignore_errors=True)


class OpenVINOBackend:
    """A model compiled by OpenVINO's CPU plugin in one inference precision."""

    name = "openvino"
    shape_sensitive = True  # kernels are specialised per input shape: calibration tries lengths padded to 16
    multi_stream = True  # calibration tries several CPU streams (batches at once)

    def __init__(self, request: BackendRequest) -> None:
        reason = unavailable_reason(request.precision, request.device)
        if reason:
            raise BackendUnavailable(reason)
        import openvino as ov

        self.precision = request.precision
        self.length_multiple = 1
        self.streams = max(1, min(request.streams, request.threads))
        config: dict[str, object] = {
            "INFERENCE_PRECISION_HINT": inference_hint(request.precision),
            "INFERENCE_NUM_THREADS": request.threads,
            "NUM_STREAMS": self.streams,
        }
        if self.streams == 1:
            config["PERFORMANCE_HINT"] = "LATENCY"
        self._compiled = ov.Core().compile_model(load_or_convert(request), "CPU", config)
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(self.streams):
            self._requests.put(self._compiled.create_infer_request())
        self._ov_version = ov.__version__.split("-")[0]

    @property
    def version(self) -> str:
        """Return OpenVINO's version and the precision."""
        return f"openvino-{self._ov_version}/{self.precision}"

    def warm_up(self, input_ids: np.ndarray, mask: np.ndarray) -> None:
        """Run one batch and discard it."""
        self.hidden_states(input_ids, mask)

    def hidden_states(self, input_ids: np.ndarray | torch.Tensor, mask: np.ndarray | torch.Tensor) -> np.ndarray:
        """Return the last hidden states of one padded batch (float32; one stream: valid until the next call).

        Thread-safe: each call takes a free infer request (one per stream) and gives it back.
        """
        ids = np.asarray(input_ids, dtype=np.int64)
        attention = np.asarray(mask, dtype=np.int64)
        request = self._requests.get()
        try:
            hidden = request.infer({"input_ids": ids, "attention_mask": attention})[0]
            return hidden if self.streams == 1 else np.array(hidden, copy=True)
        finally:
            self._requests.put(request)
