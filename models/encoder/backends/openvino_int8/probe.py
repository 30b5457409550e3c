"""The int8 speed gate's first check: the model's largest weight MatMul alone, in static int8 against float.

An all-int8 model is never faster than int8 makes its MatMuls, and the rest of the model runs the same ops either
way, so when one MatMul quantised is clearly slower than float (no VNNI) the whole model cannot gain `min_speedup`.
This check costs a few seconds; the model-level gate it spares needs the search's statistics first (about 60 s on
a 2-core AVX2 EPYC, where the MatMul ran at 0.69x float and all-int8 at 0.46x). Where the MatMul is not clearly
slower, the model-level gate decides as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from models.encoder.backends.timing import best_seconds

MARGIN = 0.8  # the MatMul must run under min_speedup x MARGIN to refuse: one op's reading may differ from the model's
REPEATS = 5


def largest_matmul(model: Any) -> Any:  # an openvino.Node
    """Return the MatMul of model whose constant weight is the largest."""
    weighted = [
        op
        for op in model.get_ops()
        if op.get_type_name() == "MatMul" and op.input_value(1).get_node().get_type_name() == "Constant"
    ]
    if not weighted:
        raise ValueError("the model has no MatMul with a constant weight")
    return max(weighted, key=lambda op: int(op.input_value(1).get_node().get_data().size))


def probe_model(matmul: Any) -> tuple[Any, int]:
    """Return (a model of that one MatMul over [rows, inner] inputs, inner), with its weight and transpose."""
    import openvino as ov
    import openvino.opset8 as ops

    weight = np.array(matmul.input_value(1).get_node().get_data(), dtype=np.float32)
    transpose_b = bool(matmul.get_attributes()["transpose_b"])
    inner = weight.shape[1] if transpose_b else weight.shape[0]
    x = ops.parameter([-1, inner], ov.Type.f32, name="x")
    product = ops.matmul(x, ops.constant(weight), False, transpose_b)
    return ov.Model([product.output(0)], [x], "int8-probe"), inner


def matmul_speedup(float_model: Any, config: dict[str, object], rows: int) -> float:
    """Return how many times faster float_model's largest MatMul runs in static int8 than in float, on rows rows."""
    import nncf

    model, inner = probe_model(largest_matmul(float_model))
    sample = np.random.default_rng(0).standard_normal((rows, inner)).astype(np.float32)
    quantized = nncf.quantize(model, nncf.Dataset([sample]), subset_size=1)
    float_seconds, int8_seconds = best_seconds(latency_calls([model, quantized], sample, config), REPEATS)
    return float_seconds / int8_seconds


def latency_calls(models: Sequence[Any], inputs: Any, config: dict[str, object]) -> list[Callable[[], object]]:
    """Return one call per model that runs it on inputs, each compiled for latency on the CPU with config."""
    import openvino as ov

    compiled = [ov.Core().compile_model(model, "CPU", {**config, "PERFORMANCE_HINT": "LATENCY"}) for model in models]
    return [partial(run, inputs) for run in compiled]
