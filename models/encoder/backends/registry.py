"""Backends by name: which exist, which can run a precision here (and why not), and loading one."""

from __future__ import annotations

import torch

from models.encoder.backends import onnxruntime_backend, openvino_backend, torch_backend, torch_packed
from models.encoder.backends.base import Backend, BackendRequest, BackendUnavailable

BACKENDS = ("torch", "torch-packed", "openvino", "onnxruntime")


def unavailable_reason(backend: str, precision: str, device: torch.device) -> str | None:
    """Return why backend cannot run precision on device (None: it can)."""
    if backend == "torch":
        return torch_backend.unavailable_reason(precision, device)
    if backend == "torch-packed":
        return torch_packed.unavailable_reason(precision, device)
    if backend == "openvino":
        return openvino_backend.unavailable_reason(precision, device)
    if backend == "onnxruntime":
        return onnxruntime_backend.unavailable_reason(precision, device)
    return f"unknown backend {backend!r} (one of {', '.join(BACKENDS)})"


def load_backend(backend: str, request: BackendRequest) -> Backend:
    """Return the loaded backend; raise BackendUnavailable (with the reason) when it cannot run here."""
    reason = unavailable_reason(backend, request.precision, request.device)
    if reason:
        raise BackendUnavailable(reason)
    if backend == "torch":
        return torch_backend.TorchBackend(request)
    if backend == "torch-packed":
        return torch_packed.TorchPackedBackend(request)
    if backend == "onnxruntime":
        return onnxruntime_backend.OnnxRuntimeBackend(request)
    return openvino_backend.OpenVINOBackend(request)
