"""torch bf16 on the CPU: auto refuses it where its Linear is measured far slower than fp32's; a pin still loads it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.encoder.backends.base import BackendRequest, BackendUnavailable
from models.encoder.backends.torch_backend import BF16_MIN_GEMM_RATIO, TorchBackend, bf16_gemm_ratio
from models.encoder.st_layout import ModelInfo


def test_the_bf16_ratio_is_measured_once_per_thread_count() -> None:
    ratio = bf16_gemm_ratio(1)
    assert 0 < ratio < 100
    assert bf16_gemm_ratio(1) == ratio  # cached: one measurement per process and thread count


@pytest.mark.parametrize("auto", [False, True])
def test_auto_leaves_out_cpu_bf16_far_slower_than_fp32_and_a_pin_still_gets_it(auto: bool) -> None:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    module = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)).eval()
    info = ModelInfo(Path("unsaved"), "bert", "bert", 32, "mean", True, 32, "0" * 12)
    request = BackendRequest(info, module, "bf16", torch.device("cpu"), 1, None, refuse_slow_kernels=auto)
    ratio = bf16_gemm_ratio(1)
    if auto and ratio < BF16_MIN_GEMM_RATIO:
        with pytest.raises(BackendUnavailable, match=rf"torch bf16 cannot beat fp32 here: a bf16 Linear ran at {ratio:.2f}x"):
            TorchBackend(request)
        return
    backend = TorchBackend(request)
    assert {p.dtype for p in backend.model.parameters()} == {torch.bfloat16}
    hidden = backend.hidden_states(torch.randint(0, 100, (2, 8)), torch.ones(2, 8, dtype=torch.long))
    assert hidden.shape == (2, 8, 32) and torch.isfinite(hidden.float()).all()
