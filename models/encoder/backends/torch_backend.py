"""The torch backend: fp32, bf16/fp16 with the weights cast (pooling stays fp32), int8 per-token (CPU)."""

from __future__ import annotations

import copy
import functools
import logging

import numpy as np
import torch

from models.encoder.backends.base import BackendRequest, BackendUnavailable
from models.encoder.backends.int8 import PROBE_SHAPE, activation_maxima, gemm_kernel, quantized_copy
from models.encoder.backends.timing import best_seconds

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = ("fp32", "bf16", "fp16", "int8")
# auto refuses CPU bf16 whose Linear runs under this fraction of fp32's rate: GEMMs are most of an encoder's work,
# so such a model cannot beat fp32 (emulated bf16 on an AVX2-only EPYC: 0.15-0.29; native AVX-512 bf16: about 2)
BF16_MIN_GEMM_RATIO = 0.5

log = logging.getLogger(__name__)


def unavailable_reason(precision: str, device: torch.device) -> str | None:
    """Return why torch cannot run precision on device, or None when it can."""
    if precision not in PRECISIONS:
        return f"torch has no precision {precision!r}"
    if precision == "int8" and device.type != "cpu":
        return "torch int8 (per-token _int_mm) runs on CPU only"
    if precision == "fp16" and device.type == "cpu":
        return "fp16 on CPU is emulated (slow); use bf16 or int8"
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this CUDA device has no bf16"
    return None


def _int8_model(request: BackendRequest) -> torch.nn.Module:
    """Return the int8 copy of the request's model; refuse where it cannot beat fp32 and auto asks it to.

    Without an int8 GEMM kernel the products are summed in fp32 (int8's vectors at fp32's speed, never faster).
    """
    choice = gemm_kernel(request.threads)
    log.info("torch int8: %s", choice.describe())
    if choice.kernel == "fp32" and request.int8_min_speedup > 0:
        raise BackendUnavailable(f"torch int8 cannot beat fp32 here: {choice.describe()}")
    maxima = activation_maxima(request.module, list(request.sample_batches)) if request.sample_batches else None
    return quantized_copy(request.module, choice.kernel, maxima)


@functools.cache
def bf16_gemm_ratio(threads: int) -> float:
    """Return a bf16 Linear's rate over an fp32 Linear's on the FFN probe shape on this CPU (under 1: slower)."""
    rows, inner, out = PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    x, linear = torch.randn(rows, inner, generator=generator), torch.nn.Linear(inner, out)
    x_bf16, linear_bf16 = x.bfloat16(), copy.deepcopy(linear).bfloat16()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            fp32, bf16 = best_seconds([lambda: linear(x), lambda: linear_bf16(x_bf16)])
    finally:
        torch.set_num_threads(previous)
    return fp32 / bf16


def _refuse_slow_bf16(request: BackendRequest) -> None:
    """Raise BackendUnavailable when auto asks for CPU bf16 and its Linear runs under BF16_MIN_GEMM_RATIO of fp32's."""
    if not request.refuse_slow_kernels or request.precision != "bf16" or request.device.type != "cpu":
        return
    ratio = bf16_gemm_ratio(request.threads)
    if ratio < BF16_MIN_GEMM_RATIO:
        raise BackendUnavailable(
            f"torch bf16 cannot beat fp32 here: a bf16 Linear ran at {ratio:.2f}x fp32's rate "
            f"(under {BF16_MIN_GEMM_RATIO:g}x: bf16 is emulated on this CPU)"
        )


def prepared_module(request: BackendRequest) -> torch.nn.Module:
    """Return the request's model in its precision on its device (fp32: the module itself; bf16/fp16: a cast copy;
    int8: a quantised copy); BackendUnavailable where torch cannot run that precision here."""
    reason = unavailable_reason(request.precision, request.device)
    if reason:
        raise BackendUnavailable(reason)
    _refuse_slow_bf16(request)
    if request.precision == "int8":
        model = _int8_model(request)
    elif request.precision == "fp32":
        model = request.module
    else:
        model = copy.deepcopy(request.module).to(DTYPES[request.precision])
    return model.to(request.device).eval()


class TorchBackend:
    """A transformers model run by torch eagerly in one precision."""

    name = "torch"
    shape_sensitive = False

    def __init__(self, request: BackendRequest) -> None:
        self.precision = request.precision
        self.device = request.device
        self.length_multiple = 1
        self.streams = 1  # torch's intra-op threads already share one batch
        self.model = prepared_module(request)

    @property
    def version(self) -> str:
        """Return torch's version and the precision."""
        return f"torch-{torch.__version__.split('+')[0]}/{self.precision}"

    def warm_up(self, input_ids: np.ndarray, mask: np.ndarray) -> None:
        """Run one batch and discard it."""
        self.hidden_states(input_ids, mask)

    def hidden_states(self, input_ids: np.ndarray | torch.Tensor, mask: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Return the last hidden states of one padded batch (on the model's device, its dtype)."""
        non_blocking = self.device.type == "cuda"
        ids = torch.as_tensor(input_ids).to(self.device, non_blocking=non_blocking)
        attention = torch.as_tensor(mask).to(self.device, non_blocking=non_blocking)
        with torch.inference_mode():
            return self.model(input_ids=ids, attention_mask=attention).last_hidden_state
