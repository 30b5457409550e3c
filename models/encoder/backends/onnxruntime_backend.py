"""The ONNX Runtime backend (CPU, fp32): the model exported locally from its torch module, cached by digest.

On an AVX2-only CPU (no VNNI, no native bf16) there is no precision faster than fp32 over the int8 floor, and
ONNX Runtime's fp32 ran MiniLM's length-sorted batches 1.1-1.4x torch fp32 and 0.94-1.17x OpenVINO fp32
(docs/engine.md); `auto` measures which wins on the machine it finds. Its int8 paths were measured and left
out: dynamic int8 with one activation scale per tensor falls to min cosine 0.83-0.96, and per-token scales
built from standard operators (faithful, 0.992) or 8-bit MatMulNBits (0.998) ran no faster than fp32 there.
`streams` > 1 opens that many sessions, the threads split between them, so that the engine can run that many
batches at once.
"""

from __future__ import annotations

import logging
import queue
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.encoder.backends.base import BackendRequest, BackendUnavailable, HiddenStates, converted_dir, write_atomically

log = logging.getLogger(__name__)

PRECISIONS = ("fp32",)
OPSET = 17


def unavailable_reason(precision: str, device: torch.device) -> str | None:
    """Return why ONNX Runtime cannot run precision on device, or None when it can."""
    try:
        import onnx  # noqa: F401  (torch's exporter writes through it)
        import onnxruntime  # noqa: F401
    except ImportError:
        return "onnxruntime and onnx are not installed (pip install onnxruntime onnx)"
    if device.type != "cpu":
        return f"the ONNX Runtime backend runs on CPU only, not {device.type}"
    if precision not in PRECISIONS:
        return f"onnxruntime runs fp32 only here, not {precision!r} (its int8 measured unfaithful or no faster)"
    return None


def _eager_copy(module: torch.nn.Module) -> torch.nn.Module:
    """Return a copy of module with eager attention: its exported graph ran 5-8% faster than SDPA's in ONNX Runtime."""
    import copy

    twin = copy.deepcopy(module)
    set_attention = getattr(twin, "set_attn_implementation", None)
    if callable(set_attention):
        try:
            set_attention("eager")
        except (ValueError, ImportError):  # an architecture without an eager path keeps its own
            return module
    return twin.eval()


def export(module: torch.nn.Module) -> bytes:
    """Return the fp32 ONNX graph of a torch module (dynamic batch and length), serialised."""
    example = (torch.ones(2, 16, dtype=torch.long), torch.ones(2, 16, dtype=torch.long))
    dynamic = {0: "rows", 1: "length"}
    # warnings off: the tracer's notes on Python-side shape checks (the tests pin the outputs on several shapes)
    with tempfile.TemporaryDirectory(prefix="nightscore-onnx-") as scratch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            HiddenStates(_eager_copy(module)).eval(),
            example,
            f"{scratch}/model.onnx",
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_axes={"input_ids": dynamic, "attention_mask": dynamic, "last_hidden_state": dynamic},
            opset_version=OPSET,
            dynamo=False,
        )
        return Path(scratch, "model.onnx").read_bytes()


def load_or_export(request: BackendRequest, folder: Path | None) -> str | bytes:
    """Return the cached graph's path, else the graph exported now (and written atomically into folder, if any)."""
    path = folder / "model.onnx" if folder is not None else None
    if path is not None and path.is_file():
        return str(path)
    started = time.perf_counter()
    try:
        graph = export(request.module)
    except (RuntimeError, ValueError, torch.onnx.OnnxExporterError) as exc:
        raise BackendUnavailable(f"cannot export {request.info.version} to ONNX: {str(exc)[:200]}") from exc
    log.info("exported %s to ONNX in %.1fs", request.info.version, time.perf_counter() - started)
    if path is not None:
        write_atomically(path, graph)
    return graph


def _session_options(threads: int, streams: int) -> Any:  # an onnxruntime.SessionOptions
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads // streams)
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # warnings about initialisers the optimiser folded away are noise
    if streams > 1:  # sessions share the cores: idle threads must not spin on another session's core
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class OnnxRuntimeBackend:
    """A model exported to ONNX and run by ONNX Runtime's CPU execution provider in fp32."""

    name = "onnxruntime"
    shape_sensitive = False  # no per-shape compilation: lengths padded to 16 would only add work
    multi_stream = True  # calibration tries several sessions (batches at once)

    def __init__(self, request: BackendRequest) -> None:
        reason = unavailable_reason(request.precision, request.device)
        if reason:
            raise BackendUnavailable(reason)
        import onnxruntime as ort

        self._ort_version = ort.__version__
        graph = load_or_export(request, converted_dir(request, f"onnxruntime-{self._ort_version}"))
        self.precision = request.precision
        self.length_multiple = 1
        self.streams = max(1, min(request.streams, request.threads))
        options = _session_options(request.threads, self.streams)
        self._sessions: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(self.streams):
            self._sessions.put(ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"]))

    @property
    def version(self) -> str:
        """Return ONNX Runtime's version and the precision."""
        return f"onnxruntime-{self._ort_version}/{self.precision}"

    def warm_up(self, input_ids: np.ndarray, mask: np.ndarray) -> None:
        """Run one batch and discard it."""
        self.hidden_states(input_ids, mask)

    def hidden_states(self, input_ids: np.ndarray | torch.Tensor, mask: np.ndarray | torch.Tensor) -> np.ndarray:
        """Return the last hidden states of one padded batch (float32). Thread-safe: one session per stream."""
        feeds = {"input_ids": np.asarray(input_ids, dtype=np.int64), "attention_mask": np.asarray(mask, dtype=np.int64)}
        session = self._sessions.get()
        try:
            return session.run(None, feeds)[0]
        finally:
            self._sessions.put(session)
