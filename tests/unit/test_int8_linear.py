"""torch int8 Linear: the fp32 kernel (for CPUs without an int8 GEMM) gives int8's own numbers; the kernel is measured."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from models.encoder.backends.base import BackendRequest, BackendUnavailable
from models.encoder.backends.int8 import Int8Linear, choose_kernel, gemm_kernel
from models.encoder.backends.torch_backend import TorchBackend
from models.encoder.st_layout import ModelInfo
from tests.helpers import fresh_interpreter_output


def _layer(inner: int, out: int) -> tuple[torch.nn.Linear, torch.Tensor]:
    """Return a seeded Linear and the activation maxima it is smoothed with."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(inner, out)
    return linear, torch.rand(inner) * 8 + 0.1


@pytest.mark.parametrize("rows", [3, 40])  # 3: the padded path of _int_mm (it wants more than 16 rows)
def test_the_fp32_kernel_sums_exactly_the_integer_products_of_int_mm(rows: int) -> None:
    if not gemm_kernel(1).int_mm_exact:
        pytest.skip(f"torch._int_mm does not sum exactly on this CPU, so it is never used: {gemm_kernel(1).describe()}")
    linear, maxima = _layer(384, 96)
    x = torch.randn(2, rows, 384) * 3
    on_int8 = Int8Linear(linear, maxima, "int_mm")(x)
    on_fp32 = Int8Linear(linear, maxima, "fp32")(x)
    assert on_fp32.shape == (2, rows, 96)
    assert torch.equal(on_int8, on_fp32)  # sums under 2**24 are exact in float32: the same bits
    assert not torch.equal(on_fp32, linear(x))  # and it is int8, not the float layer
    assert torch.nn.functional.cosine_similarity(on_fp32, linear(x), dim=-1).min() > 0.999


def test_the_kernel_is_the_faster_of_the_two_gemms_measured() -> None:
    choice = gemm_kernel(1)
    assert choice.int_mm_gops > 0 and choice.fp32_gops > 0
    assert choice.kernel == ("int_mm" if choice.int_mm_exact and choice.int_mm_gops > choice.fp32_gops else "fp32")
    assert gemm_kernel(1) is choice  # measured once per thread count
    assert choice.kernel in choice.describe() and f"{choice.fp32_gops:.1f}" in choice.describe()


def test_a_faster_int_mm_that_sums_wrongly_is_not_chosen() -> None:
    assert choose_kernel(1.0, 2.0, int_mm_exact=True) == "int_mm"
    assert choose_kernel(1.0, 2.0, int_mm_exact=False) == "fp32"
    assert choose_kernel(2.0, 1.0, int_mm_exact=True) == "fp32"


# torch's kernels held to AVX2 on this CPU (oneDNN, MKL, ATen): where the CPU has VNNI, oneDNN's AVX2 int8 GEMM adds
# pairs of products in saturating int16, and _int_mm can be both the faster and wrong.
AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
PROBE = """
import json, torch
from models.encoder.backends.int8 import PROBE_SHAPE, gemm_kernel
rows, inner, out = PROBE_SHAPE
g = torch.Generator().manual_seed(1)
a = torch.randint(-127, 128, (rows, inner), dtype=torch.int8, generator=g)
b = torch.randint(-127, 128, (inner, out), dtype=torch.int8, generator=g)
exact = torch.equal(torch._int_mm(a, b).float(), a.float() @ b.float())
choice = gemm_kernel(2)
print(json.dumps({"exact": exact, "kernel": choice.kernel, "seen_exact": choice.int_mm_exact, "note": choice.describe()}))
"""


def test_int_mm_is_not_chosen_where_torchs_int8_gemm_is_inexact() -> None:
    seen = json.loads(fresh_interpreter_output(PROBE, env={**os.environ, **AVX2_ONLY}).splitlines()[-1])
    assert seen["seen_exact"] == seen["exact"], seen
    if seen["exact"]:
        pytest.skip(f"torch._int_mm held to AVX2 sums exactly on this CPU: {seen['note']}")
    assert seen["kernel"] == "fp32" and "inexact" in seen["note"], seen


@pytest.mark.parametrize("auto", [False, True])
def test_auto_leaves_out_int8_that_cannot_beat_fp32_and_a_pin_still_gets_it(auto: bool) -> None:
    torch.manual_seed(0)
    from transformers import BertConfig, BertModel

    module = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)).eval()
    info = ModelInfo(Path("unsaved"), "bert", "bert", 32, "mean", True, 32, "0" * 12)
    request = BackendRequest(info, module, "int8", torch.device("cpu"), 1, None, int8_min_speedup=1.05 if auto else 0.0)
    choice = gemm_kernel(1)
    if auto and choice.kernel == "fp32":
        with pytest.raises(BackendUnavailable, match=r"cannot beat fp32 here: torch\._int_mm"):
            TorchBackend(request)
        return
    backend = TorchBackend(request)
    kernels = {m.kernel for m in backend.model.modules() if isinstance(m, Int8Linear)}
    assert kernels == {choice.kernel}
    hidden = backend.hidden_states(torch.randint(0, 100, (2, 8)), torch.ones(2, 8, dtype=torch.long))
    assert hidden.shape == (2, 8, 32) and torch.isfinite(hidden).all()
