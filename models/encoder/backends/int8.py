"""int8 Linear layers: per-channel symmetric weights with per-token (per-row) dynamic activation scales.

Per-tensor activation scales (torch's dynamic quantisation) lose too much on small sentence encoders
(min cosine 0.94-0.97 on all-MiniLM-L6-v2); one scale per token alone reached 0.984 (the shortest texts
are worst), and with SmoothQuant-style smoothing (alpha 0.5: per-input-channel factors from activation
maxima measured on the built-in calibration corpus, moved from the activations into the weights) 0.995.
`Int8Linear` computes with torch._int_mm (torch backend, CPU); OpenVINO's int8 is static (openvino_int8).

Where the CPU has no int8 GEMM kernel for torch (no VNNI: `_int_mm` fell back to 2.5 GOP/s on a 2-core AVX2 EPYC
against 63 GOP/s for fp32), the same integer products are summed by an fp32 GEMM instead. Every product of two
int8 values is exact in float32, and so is their sum while it stays under 2**24 (a 1,536-wide row of values all
near 127 could pass it and then round by one unit in ~10**7), so the vectors are int8's at fp32's speed: no faster
than fp32, which is why `auto` leaves that mode out. Which kernel runs is measured once per process and thread
count (`gemm_kernel`), not read from CPU flags.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from models.encoder.backends.timing import best_seconds

GemmKernel = Literal["int_mm", "fp32"]
PROBE_SHAPE = (128, 384, 1536)  # rows x in x out: an FFN up-projection of a small encoder on one short batch


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (int8 weight [out, in], float32 scale [out]) of a weight, symmetric per output channel."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


SMOOTHING_ALPHA = 0.5  # measured on MiniLM: 0.3 -> 0.9875, 0.5 -> 0.9952, 0.7 -> 0.9940, 0.85 -> 0.9861


def smoothing_factors(weight: torch.Tensor, input_max: torch.Tensor, alpha: float = SMOOTHING_ALPHA) -> torch.Tensor:
    """Return per-input-channel factors s (x / s and W * s): max|x|^alpha / max|W|^(1 - alpha)."""
    w_max = weight.detach().float().abs().amax(dim=0).clamp(min=1e-5)
    return input_max.float().clamp(min=1e-5) ** alpha / w_max ** (1 - alpha)


def activation_maxima(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Return max |input| per channel of every Linear of model over the batches (the smoothing statistics)."""
    maxima: dict[str, torch.Tensor] = {}

    def record(name: str) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...], torch.Tensor], None]:
        def hook(_module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
            seen = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).abs().amax(dim=0).float()
            maxima[name] = torch.maximum(maxima[name], seen) if name in maxima else seen

        return hook

    handles = [m.register_forward_hook(record(n)) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    try:
        with torch.inference_mode():
            for ids, mask in batches:
                model(input_ids=ids, attention_mask=mask)
    finally:
        for handle in handles:
            handle.remove()
    return maxima


@dataclass(frozen=True)
class KernelChoice:
    """The int8 GEMM kernel chosen here, and the two GEMMs' measured rates (GOP/s) it was chosen by."""

    kernel: GemmKernel
    int_mm_gops: float
    fp32_gops: float
    int_mm_exact: bool = True  # whether torch._int_mm gave the probe's exact integer sums

    def describe(self) -> str:
        """Return the measured rates and the choice, for logs and refusals."""
        inexact = "" if self.int_mm_exact else " (inexact: its int32 sums differ from the exact ones)"
        return (
            f"torch._int_mm {self.int_mm_gops:.1f} GOP/s{inexact} against {self.fp32_gops:.1f} for an fp32 GEMM: "
            f"{self.kernel} kernel"
        )


def choose_kernel(int_mm_seconds: float, fp32_seconds: float, int_mm_exact: bool) -> GemmKernel:
    """Return "int_mm" where torch._int_mm is exact and faster than the fp32 GEMM, else "fp32"."""
    return "int_mm" if int_mm_exact and int_mm_seconds < fp32_seconds else "fp32"


@functools.cache
def gemm_kernel(threads: int) -> KernelChoice:
    """Return "int_mm" where torch._int_mm outruns an fp32 GEMM of the same shape on this CPU and sums exactly, else "fp32".

    Exactly: an int8 GEMM without VNNI may add pairs of products in saturating int16 (x86's vpmaddubsw). With oneDNN
    held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2) on a VNNI Xeon, 7,674 of the 7,680 sums of a random 80x384 by 384x96 int8
    product were wrong; with MKL held to AVX2 as well, _int_mm was also the faster, and pinned int8 fell to min cosine
    0.979 (refused by its floor; on other texts the saturation could have passed it).
    """
    rows, inner, out = PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (rows, inner), dtype=torch.int8, generator=generator)
    b = torch.randint(-127, 128, (inner, out), dtype=torch.int8, generator=generator)
    a_float, b_float = a.float(), b.float()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        int_mm, fp32 = best_seconds([lambda: torch._int_mm(a, b), lambda: torch.mm(a_float, b_float)])
        exact = torch.equal(torch._int_mm(a, b).float(), torch.mm(a_float, b_float))  # fp32 sums exact under 2**24
    finally:
        torch.set_num_threads(previous)
    operations = 2 * rows * inner * out / 1e9
    return KernelChoice(choose_kernel(int_mm, fp32, exact), operations / int_mm, operations / fp32, exact)


class Int8Linear(torch.nn.Module):
    """A Linear computed as int8 x int8 -> int32 with one activation scale per row (after smoothing).

    kernel: "int_mm" multiplies in int8; "fp32" sums the same integer products in float32 (exact: see the module).
    """

    def __init__(self, linear: torch.nn.Linear, input_max: torch.Tensor | None, kernel: GemmKernel) -> None:
        super().__init__()
        self.kernel = kernel
        weight = linear.weight.detach().float()
        if input_max is not None:
            factors = smoothing_factors(weight, input_max)
            weight = weight * factors[None, :]
            self.register_buffer("inv_smooth", 1.0 / factors)
        else:
            self.inv_smooth = None
        q, scale = quantize_weight(weight)
        weight_t = q.t().contiguous()  # [in, out]: the GEMM's right operand
        self.register_buffer("qweight_t", weight_t if self.kernel == "int_mm" else weight_t.float())
        self.register_buffer("wscale", scale)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return x @ W^T + b with x smoothed, then quantised per row to int8."""
        rows = x.reshape(-1, x.shape[-1]).float()
        if self.inv_smooth is not None:
            rows = rows * self.inv_smooth
        scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
        q = torch.round(rows / scale)
        # int32 x float scale in one kernel (no separate int -> float copy), then in place: the elementwise
        # passes over the [rows, out] result cost more than the int8 matmul itself otherwise.
        out = torch.mul(self._integer_product(q), scale).mul_(self.get_buffer("wscale"))
        if self.bias is not None:
            out.add_(self.bias)
        return out.reshape(*x.shape[:-1], out.shape[-1]).to(x.dtype)

    def _integer_product(self, q: torch.Tensor) -> torch.Tensor:
        """Return q @ qweight_t for integer-valued q [rows, in]: int32 from _int_mm, or float32 (exact) from an fp32 GEMM."""
        if self.kernel == "fp32":
            return torch.mm(q, self.get_buffer("qweight_t"))
        rows = q.shape[0]
        q8 = q.to(torch.int8)
        if rows <= 16:  # _int_mm wants more than 16 rows; pad and drop the extra rows
            q8 = torch.nn.functional.pad(q8, (0, 0, 0, 17 - rows))
        return torch._int_mm(q8, self.get_buffer("qweight_t"))[:rows]


def quantized_copy(model: torch.nn.Module, kernel: GemmKernel, maxima: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    """Return a copy of model with every Linear (embeddings stay float) replaced by an Int8Linear on kernel.

    ``maxima`` (from `activation_maxima`, keyed by module name) turns smoothing on.
    """
    twin = copy.deepcopy(model)
    for parent_name, parent in list(twin.named_modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                full = f"{parent_name}.{name}" if parent_name else name
                setattr(parent, name, Int8Linear(child, maxima[full] if maxima else None, kernel))
    return twin.eval()
