"""The int8 search's shared calibration statistics: each trial's model equals what NNCF makes of it from scratch."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch

from models.encoder.backends.int8 import SMOOTHING_ALPHA
from models.encoder.backends.openvino_backend import convert
from models.encoder.backends.openvino_int8.search import quantized_roles
from models.encoder.backends.openvino_int8.shared_statistics import SharedStatistics
from models.encoder.backends.registry import unavailable_reason
from tests.model.st_models import ARCHS, int8_request, save_random_model, search_calibration

CONFIG: dict[str, object] = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 2}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[dict[str, np.ndarray]]]:
    """Return a random BERT converted to OpenVINO and the calibration batches the search's tests take (st_models.py)."""
    reason = unavailable_reason("openvino", "int8", torch.device("cpu"))
    if reason:
        pytest.skip(f"openvino/int8: {reason}")
    request = int8_request(save_random_model(ARCHS[0], tmp_path_factory.mktemp("shared-stats"), seed=5))
    return convert(request.module), search_calibration(request)


def outputs(model: Any, batches: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """Return the model's hidden states for each batch, compiled with f32 inference."""
    import openvino as ov

    compiled = ov.Core().compile_model(model, "CPU", CONFIG)
    return [compiled(batch)[0] for batch in batches]


def from_scratch(shared: SharedStatistics, model: Any, calibration: list[dict[str, np.ndarray]], ignored: list[str]) -> Any:
    """Return the quantised model made by a fresh NNCF pipeline (every step's statistics collected anew)."""
    import nncf
    from nncf.common.factory import build_graph
    from nncf.quantization.algorithms.pipeline import collect_statistics
    from openvino._offline_transformations import compress_quantize_weights_transformation

    full, trial = shared.pipeline(()), shared.pipeline(ignored)
    dataset, step_model = nncf.Dataset(calibration), model.clone()
    for step, pipeline in ((0, full), (1, trial)):  # smoothing with nothing ignored, then the trial's quantisation
        graph = build_graph(step_model)
        points = pipeline.get_statistic_points_for_step(step, step_model, graph)
        statistics = collect_statistics(points, step_model, graph, dataset)
        step_model = pipeline.run_step(step, statistics, step_model, graph)
    compress_quantize_weights_transformation(step_model)
    return step_model


def test_nothing_ignored_is_exactly_nncf_quantize(setup: tuple[Any, list[dict[str, np.ndarray]]]) -> None:
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters

    model, calibration = setup
    shared = SharedStatistics(model, calibration, SMOOTHING_ALPHA)
    reference = nncf.quantize(
        model.clone(),
        nncf.Dataset(calibration),
        model_type=nncf.ModelType.TRANSFORMER,
        preset=nncf.QuantizationPreset.MIXED,
        subset_size=len(calibration),
        advanced_parameters=AdvancedQuantizationParameters(
            smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=SMOOTHING_ALPHA)
        ),
    )
    ours, theirs = outputs(shared.quantize([]), calibration), outputs(reference, calibration)
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert not np.array_equal(ours[0], outputs(model, calibration[:1])[0])  # it is quantised, not the float model


def test_every_trial_equals_a_fresh_pipeline_and_shared_points_are_collected_once(
    setup: tuple[Any, list[dict[str, np.ndarray]]], caplog: pytest.LogCaptureFixture
) -> None:
    model, calibration = setup
    roles = quantized_roles(model)
    query = next(names for role, names in roles.items() if role.endswith("query"))
    down = next(names for role, names in roles.items() if role.endswith("output.dense") and "attention" not in role)
    shared = SharedStatistics(model, calibration, SMOOTHING_ALPHA)
    trials = [down, query[:1], down + query[:1], query[:1]]  # one of Q/K/V float splits their shared input quantizer
    with caplog.at_level(logging.DEBUG, logger="models.encoder.backends.openvino_int8.shared_statistics"):
        for ignored in trials:
            ours = outputs(shared.quantize(ignored), calibration)
            theirs = outputs(from_scratch(shared, model, calibration, ignored), calibration)
            assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True)), ignored
    messages = [record.getMessage() for record in caplog.records]
    # the split needed more points once (one collection beyond the first); the other trials reused them
    assert sum("collecting" in m for m in messages) == 1 and "needs statistics at" in caplog.text, caplog.text
    # the fused-pattern graph was found once for the four trials (and copied)
    assert sum(m.startswith("fused-pattern graph built") for m in messages) == 1, caplog.text
