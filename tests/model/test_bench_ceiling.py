"""The inference benchmark's ceiling: no padding, every text whole, each text charged at its own length's rate."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.inference import CEILING_STEP, ceiling_grid, run_ceiling, run_engine
from models.encoder.loader import load_encoder
from models.encoder.spec import EncoderSpec
from models.encoder.text_encoder import TextEncoder
from tests.model.st_models import ARCHS, save_random_model


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> TextEncoder:
    folder = save_random_model(ARCHS[0], tmp_path_factory.mktemp("ceiling-model"))
    spec = EncoderSpec(device="cpu", backend="torch", precision="fp32", model_path=str(folder), token_budget=512)
    return load_encoder(spec)


def test_the_grid_spans_the_shortest_and_longest_text_in_steps() -> None:
    lengths = np.array([5, 7, 40, 41, 100])
    grid = ceiling_grid(lengths)
    assert grid[0] == 5 and grid[-1] == 100
    assert list(grid[1:-1]) == list(range(CEILING_STEP, 100, CEILING_STEP))
    assert list(ceiling_grid(np.array([30, 30]))) == [30]


def test_the_ceiling_pads_nothing_and_counts_every_texts_tokens(encoder: TextEncoder) -> None:
    texts = ["short", "a somewhat longer text about prices " * 3, "long " * 90, "x"] * 8
    ceiling = run_ceiling(encoder, texts)
    engine = run_engine(encoder, texts)
    assert ceiling.real_tokens == ceiling.padded_tokens == engine.real_tokens
    assert ceiling.texts == len(texts) and ceiling.seconds > 0
    assert ceiling.extra["grid_lengths"] == len(ceiling_grid(np.array([len(x) for x in encoder.tokenize(texts)[0]])))
