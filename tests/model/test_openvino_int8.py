"""OpenVINO static int8 (the measured choice of float roles) and multi-stream runs, on random and real models."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch

from models.encoder.backends.int8 import SMOOTHING_ALPHA
from models.encoder.backends.openvino_backend import _validation, convert
from models.encoder.backends.openvino_int8.probe import largest_matmul, matmul_speedup, probe_model
from models.encoder.backends.openvino_int8.search import (
    MARGIN,
    Int8NotFaster,
    QuantizationFailed,
    SpeedGate,
    check_speed,
    min_cosine,
    quantize_to_target,
    quantized_roles,
    timing_batch,
    tokens_per_s,
)
from models.encoder.backends.openvino_int8.shared_statistics import SharedStatistics
from models.encoder.backends.registry import unavailable_reason
from models.encoder.calibration import stream_counts
from models.encoder.engine import encode_texts
from models.encoder.files import load_module, load_tokenizer, model_info
from models.encoder.loader import backend_request, load_encoder
from models.encoder.precision import FidelityRefused
from models.encoder.spec import EncoderSpec
from tests.helpers import cos_rows
from tests.model.st_models import ARCHS, int8_request, int8_search_inputs, save_random_model

TEXTS = ["a", "", "ok?", "Hello world", "The striker scored twice in the final.", "goal " * 60, "東京は日本の首都です。"] * 3


def _skip_unless(precision: str) -> None:
    reason = unavailable_reason("openvino", precision, torch.device("cpu"))
    if reason:
        pytest.skip(f"openvino/{precision}: {reason}")


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_model(ARCHS[0], tmp_path_factory.mktemp("ov-int8"), seed=3)


def test_quantized_operations_are_grouped_by_role_across_blocks(bert: Path) -> None:
    _skip_unless("fp32")
    request = int8_request(bert)
    roles = quantized_roles(convert(request.module))
    layers = json.loads((bert / "config.json").read_text())["num_hidden_layers"]
    assert len(roles) >= 7  # query, key, value, attention, attention output, FFN up, FFN down
    assert all(len(names) == layers for names in roles.values()), roles
    assert not any(re.search(r"\.\d+\.", role) for role in roles)
    assert any(role.endswith("output.dense") and "attention" not in role for role in roles)
    assert len(_attention(roles)) == layers


def _attention(roles: dict[str, list[str]]) -> list[str]:
    """Return the fused attention operations among the roles' (BERT's `attention.self`, one per block)."""
    return [name for role, names in roles.items() if role.endswith("attention.self") for name in names]


def _quantized_attention_inputs(model: Any) -> list[tuple[str, int]]:
    """Return (attention operation, input index) for each attention input a FakeQuantize feeds, through layout ops."""
    found = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "ScaledDotProductAttention":
            continue
        for index, port in enumerate(op.inputs()):
            node = port.get_source_output().get_node()
            while node.get_type_name() in ("Reshape", "Transpose"):
                node = node.input(0).get_source_output().get_node()
            if node.get_type_name() == "FakeQuantize":
                found.append((op.get_friendly_name(), index))
    return found


def test_attention_kept_float_loses_its_query_and_key_quantizers(bert: Path) -> None:
    # On an AMX Xeon int8 attention cost the random BERT min cos 0.997 -> 0.952 whatever MatMuls stayed float:
    # the search keeps it float by name like any role, which must drop exactly its quantizers
    _skip_unless("int8")
    float_model, calibration, _, _ = int8_search_inputs(bert)
    attention = _attention(quantized_roles(float_model))
    shared = SharedStatistics(float_model, calibration, SMOOTHING_ALPHA)
    assert sorted(_quantized_attention_inputs(shared.quantize([]))) == [(name, i) for name in sorted(attention) for i in (0, 1)]
    assert _quantized_attention_inputs(shared.quantize(attention)) == []


def test_static_int8_meets_floor_plus_margin_with_the_fewest_float_roles(bert: Path) -> None:
    _skip_unless("int8")
    float_model, calibration, validation, config = int8_search_inputs(bert)
    loose = quantize_to_target(float_model, calibration, validation, 0.5, config)
    assert loose.float_ops == () and loose.quantized_ops == loose.ops  # everything int8 when it is enough
    assert min_cosine(loose.model, validation, config) == pytest.approx(loose.min_cosine, abs=1e-6)
    strict_floor = min(loose.min_cosine + 0.5 * (1 - loose.min_cosine), 1.0 - MARGIN - 1e-4)  # all-int8 misses it
    try:
        strict = quantize_to_target(float_model, calibration, validation, strict_floor, config)
    except QuantizationFailed as exc:
        assert f"under floor {strict_floor}" in str(exc)
        return
    assert strict.min_cosine >= strict_floor + MARGIN
    assert strict.float_ops and strict.quantized_ops == strict.ops - len(strict.float_ops)
    assert strict.min_cosine > loose.min_cosine


def test_int8_that_cannot_beat_float_is_refused_before_any_search(bert: Path) -> None:
    _skip_unless("int8")
    float_model, calibration, validation, config = int8_search_inputs(bert)
    strict_floor = 1.0 - MARGIN  # would need a long search of float roles
    with pytest.raises(Int8NotFaster, match=r"largest MatMul alone ran at \d+\.\d\dx float in int8 \(under 100x x 0\.8\)"):
        quantize_to_target(float_model, calibration, validation, strict_floor, config, SpeedGate(100.0, float_model))
    passed = quantize_to_target(float_model, calibration, validation, 0.5, config, SpeedGate(1e-6, float_model))
    assert passed.quantized_ops == passed.ops  # a gate it clears changes nothing
    with pytest.raises(Int8NotFaster, match=r"all-int8 ran at \d+ tokens/s against float \d+ \(\d+\.\d\dx, under the 100x"):
        check_speed(passed.model, validation, config, SpeedGate(100.0, float_model))  # the model-level gate after it


def test_the_matmul_probe_is_the_largest_weight_matmul_as_the_model_computes_it(bert: Path) -> None:
    _skip_unless("int8")
    import openvino as ov

    float_model = convert(int8_request(bert).module)
    matmul = largest_matmul(float_model)
    sizes = [
        op.input_value(1).get_node().get_data().size
        for op in float_model.get_ops()
        if op.get_type_name() == "MatMul" and op.input_value(1).get_node().get_type_name() == "Constant"
    ]
    weight = np.array(matmul.input_value(1).get_node().get_data())
    assert weight.size == max(sizes) and len(sizes) > 1
    model, inner = probe_model(matmul)
    x = np.random.default_rng(1).standard_normal((5, inner)).astype(np.float32)
    expected = x @ (weight.T if matmul.get_attributes()["transpose_b"] else weight)
    got = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(x)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert 0 < matmul_speedup(float_model, {"INFERENCE_NUM_THREADS": 1}, 256) < 50


def test_the_timing_batch_is_planned_size_and_models_are_timed_alike(bert: Path) -> None:
    _skip_unless("fp32")
    validation = _validation(int8_request(bert))
    batch = timing_batch(validation, 8, 16)
    assert batch["input_ids"].shape == (8, 16) and batch["attention_mask"].all()
    assert batch["input_ids"][0, 0] == validation.batches[0]["input_ids"][0, 0]
    model = convert(int8_request(bert).module)
    speeds = tokens_per_s([model, model], batch, {"INFERENCE_NUM_THREADS": 1}, 3)
    assert len(speeds) == 2 and all(speed > 0 for speed in speeds)
    assert 0.2 < speeds[0] / speeds[1] < 5  # one model twice: the same speed within machine noise


def test_auto_asks_int8_to_beat_float_and_a_pinned_int8_does_not(bert: Path) -> None:
    tokenizer = load_tokenizer(str(bert))
    for precision, expected in (("auto", 1.05), ("int8", 0.0)):
        spec = EncoderSpec(device="cpu", model_path=str(bert), precision=precision)
        info = model_info(spec)
        request = backend_request(spec, info, load_module(info), "int8", torch.device("cpu"), 2, tokenizer)
        assert request.int8_min_speedup == expected


def test_an_unreachable_int8_floor_is_refused_naming_it(bert: Path) -> None:
    """The search's QuantizationFailed crosses its child process by type: any other type would be a UsageError here."""
    _skip_unless("int8")
    spec = EncoderSpec(device="cpu", backend="openvino", precision="int8", model_path=str(bert), int8_floor=0.99999)
    with pytest.raises(FidelityRefused, match=r"openvino/int8 refused: static int8 reached min cosine 0\.\d{6} .*floor 0\.99999"):
        load_encoder(spec)


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_two_streams_give_the_same_vectors_in_input_order(bert: Path, tmp_path: Path, precision: str) -> None:
    _skip_unless(precision)
    spec = EncoderSpec(  # int8_floor 0.5: all-int8 passes at the first trial (streams are under test here, not the search)
        device="cpu",
        backend="openvino",
        precision=precision,
        model_path=str(bert),
        num_threads=2,
        cache_dir=str(tmp_path),
        int8_floor=0.5,
    )
    one = load_encoder(spec)
    two = load_encoder(replace(spec, streams=2))
    assert (one.backend.streams, two.backend.streams, two.mode.streams) == (1, 2, 2)
    assert two.mode.label.endswith("/s2") and two.mode_record()["streams"] == 2
    texts = [f"{t} {i}" for i, t in enumerate(TEXTS)]
    a, stats_a = encode_texts(one, texts, token_budget=64)
    b, stats_b = encode_texts(two, texts, token_budget=64)
    assert stats_b.batches == stats_a.batches > 4 and stats_b.padded_tokens == stats_a.padded_tokens
    assert cos_rows(a, b).min() >= 0.9999  # same rows in the same places: order restored across streams
    solo = np.vstack([two.embed_texts([t]) for t in texts[:5]])
    assert cos_rows(solo, b[:5]).min() >= 0.999


def test_a_stop_between_batches_lets_running_streams_finish_then_raises(bert: Path, tmp_path: Path) -> None:
    _skip_unless("fp32")
    spec = EncoderSpec(device="cpu", backend="openvino", precision="fp32", model_path=str(bert), num_threads=2, streams=2)
    encoder = load_encoder(spec)
    calls = {"n": 0}

    def stop_after_three() -> None:
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt):
        encode_texts(encoder, TEXTS, token_budget=32, before_batch=stop_after_three)
    assert calls["n"] == 4


def test_stream_counts_never_exceed_the_threads() -> None:
    assert stream_counts(1) == []
    assert stream_counts(2) == [2]
    assert stream_counts(3) == [2, 3]
    assert stream_counts(16) == [2, 4, 16]


def test_auto_tries_streams_for_a_multi_stream_finalist(bert: Path, tmp_path: Path) -> None:
    _skip_unless("fp32")
    spec = EncoderSpec(
        device="cpu", backend="openvino", model_path=str(bert), cache_dir=str(tmp_path), num_threads=2, calibration_budgets=(256,)
    )
    chosen = load_encoder(spec)
    table = cast("list[dict[str, Any]]", chosen.mode_record()["calibration_candidates"])
    assert any(row["mode"].endswith("/s2") and row["tokens_per_s"] > 0 for row in table)
    assert chosen.backend.streams == chosen.mode.streams
    again = load_encoder(spec)  # the persisted choice loads the same streams
    assert (again.mode, again.backend.streams) == (chosen.mode, chosen.mode.streams)
