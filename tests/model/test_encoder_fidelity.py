"""Model tests: the engine's all-MiniLM-L6-v2 against sentence-transformers' own output, plus behaviour."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from models.encoder.engine import encode_texts
from models.encoder.files import MODEL_NAME, model_dir
from models.encoder.loader import get_encoder, load_encoder
from models.encoder.spec import EncoderSpec
from models.encoder.text_encoder import TextEncoder
from tests.helpers import cos_rows
from tests.tiny_model import tiny_spec

if TYPE_CHECKING:
    from tests.conftest import SharedInt8

_LONG_A = " ".join(
    [
        "The",
        "committee",
        "reviewed",
        "the",
        "quarterly",
        "budget,",
        "discussed",
        "staffing,",
        "and",
        "postponed",
        "the",
        "vote",
        "on",
        "the",
        "new",
        "library",
        "wing",
        "until",
        "the",
        "auditors",
        "had",
        "finished",
        "their",
        "report.",
    ]
    * 12
)
_LONG_B = " ".join(f"item{i} costs {i * 3.5:.2f} euros;" for i in range(150))
_LONG_C = "Ünïcödé naïve café résumé — Zürich, Kraków, São Paulo, 東京, Москва. " * 25

TEXTS = [
    # short
    "Hello world",
    "ok",
    "a",
    "Yes!",
    "",
    "Breaking news",
    # ordinary sentences
    "The striker scored twice in the second half to win the cup final.",
    "Simmer the tomatoes with garlic and basil for twenty minutes.",
    "The central bank raised interest rates by a quarter point on Wednesday.",
    "Researchers trained a neural network to predict protein structures.",
    "The orchestra performed Beethoven's ninth symphony to a sold-out hall.",
    "Heavy rain is expected across the north of the country this weekend.",
    "She repaired the bicycle chain with a borrowed multitool.",
    "Parliament passed the bill after a long night of debate.",
    # punctuation and casing
    "!!! ??? ... ;;; ::: ---",
    "WHY IS EVERYTHING IN CAPITALS???",
    "e-mail: someone@example.com, url: https://example.org/a?b=c&d=e#frag",
    "(parentheses) [brackets] {braces} <angles> 'quotes' \"double\"",
    # numbers
    "42",
    "3.14159 2.71828 1.41421 1.73205",
    "On 2024-01-31 at 23:59:59 UTC the balance was -1,234,567.89 USD.",
    "Call +44 20 7946 0958 or 555-0100 before 9 a.m.",
    # unicode
    "¿Dónde está la biblioteca? Está cerca del río.",
    "Straße, Grüße und Äpfel für die Kinder.",
    "東京は日本の首都です。",
    "Москва — столица России.",
    "emoji time 🙂🚀🔥 and more 🎉",
    "naïve café résumé coöperate",
    # repeated words
    "goal " * 20,
    "the the the the the the the the",
    "buffalo buffalo buffalo buffalo buffalo buffalo buffalo buffalo",
    "very " * 300 + "long",
    # long, past 256 tokens
    _LONG_A,
    _LONG_B,
    _LONG_C,
    "word " * 600,
]


@pytest.fixture(scope="module")
def minilm() -> TextEncoder:
    return get_encoder(EncoderSpec(device="cpu"))


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir()), device="cpu")
    assert model.max_seq_length == 256
    return model.encode(TEXTS, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)


def test_corpus_covers_truncation(minilm: TextEncoder) -> None:
    _, full = minilm.tokenize(TEXTS)
    assert len(TEXTS) >= 36
    assert (full > 256).sum() >= 4


def test_matches_sentence_transformers(minilm: TextEncoder, reference: np.ndarray) -> None:
    out, stats = encode_texts(minilm, TEXTS)
    assert out.shape == reference.shape == (len(TEXTS), 384)
    cos = cos_rows(out, reference)
    worst = int(np.argmin(cos))
    assert cos.min() >= 0.9999, (worst, TEXTS[worst][:60], float(cos[worst]))
    assert stats.truncated >= 4


@pytest.mark.parametrize("budget", [256, 100_000])
def test_matches_sentence_transformers_any_budget(minilm: TextEncoder, reference: np.ndarray, budget: int) -> None:
    out, _ = encode_texts(minilm, TEXTS, token_budget=budget)
    assert np.all(cos_rows(out, reference) >= 0.9999)


def test_deterministic(minilm: TextEncoder) -> None:
    a, _ = encode_texts(minilm, TEXTS)
    b, _ = encode_texts(minilm, TEXTS)
    assert np.array_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)


def test_model_version(minilm: TextEncoder) -> None:
    assert minilm.version == minilm_version()
    assert minilm.version.startswith(f"{MODEL_NAME}@")
    assert minilm.version.startswith("all-MiniLM-L6-v2@")
    digest = minilm.version.split("@", 1)[1]
    assert len(digest) == 12 and all(c in "0123456789abcdef" for c in digest)
    assert minilm.dim == 384


def test_sports_closer_to_sports_than_cooking(minilm: TextEncoder) -> None:
    sports_a = "The goalkeeper saved a penalty in the last minute of the football match."
    sports_b = "The striker scored a late goal and the team won the championship game."
    cooking = "Chop the onions, fry them in butter and stir in the cream for the sauce."
    vecs, _ = encode_texts(minilm, [sports_a, sports_b, cooking])
    sims = vecs @ vecs.T
    assert sims[0, 1] > sims[0, 2] + 0.1
    assert sims[1, 0] > sims[1, 2] + 0.1


@pytest.mark.parametrize(
    ("backend", "precision"),
    [("torch", "int8"), ("openvino", "int8"), ("openvino", "fp32"), ("openvino", "bf16"), ("torch", "bf16")],
)
def test_other_modes_against_sentence_transformers(
    reference: np.ndarray, backend: str, precision: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Each mode meets its floor on this corpus too (the shortest texts are the worst case for int8)."""
    import torch

    from models.encoder.backends.registry import unavailable_reason

    reason = unavailable_reason(backend, precision, torch.device("cpu"))
    if reason:
        pytest.skip(f"{backend}/{precision}: {reason}")
    static_int8 = (backend, precision) == ("openvino", "int8")
    cache = request.getfixturevalue("minilm_int8").cache_dir if static_int8 else tmp_path
    encoder = load_encoder(EncoderSpec(device="cpu", backend=backend, precision=precision, cache_dir=str(cache)))
    out, _ = encode_texts(encoder, TEXTS)
    cos = cos_rows(out, reference)
    floor = 0.99 if precision == "int8" else (0.9999 if precision == "fp32" else 0.999)
    assert cos.min() >= floor, (TEXTS[int(np.argmin(cos))][:40], float(cos.min()))
    assert encoder.version == f"{minilm_version()}+{backend}-{precision}"
    if static_int8:
        _check_static_int8_report(request.getfixturevalue("minilm_int8"), encoder)


def _check_static_int8_report(shared: SharedInt8, encoder: TextEncoder) -> None:
    """On MiniLM all-int8 misses the floor (min cos about 0.977): the search kept roles float, and cached its answer."""
    import json

    from models.encoder.backends.openvino_int8.search import MARGIN

    found = (shared.cache_dir / "converted").glob("*/openvino-*-int8-floor0.99/quantization.json")
    report = json.loads(next(found).read_text())
    assert report["float_ops"] and report["quantized_ops"] == report["ops"] - len(report["float_ops"])
    assert report["quantized_ops"] >= report["ops"] // 2
    assert report["validation_min_cosine"] >= 0.99 + MARGIN
    assert encoder.load_seconds < shared.search_seconds / 3  # read from the cache folder: no second search


def minilm_version() -> str:
    from models.encoder.files import model_info

    return model_info(EncoderSpec()).version


def test_torch_dynamic_quantisation_would_be_under_the_int8_floor(minilm: TextEncoder, reference: np.ndarray) -> None:
    """Why int8 is per-token + smoothed: torch's per-tensor dynamic quantisation misses the 0.99 floor here."""
    import copy

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    quantized = quantize_dynamic(copy.deepcopy(minilm.model), {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    with torch.inference_mode():
        ids, mask = minilm.collate(minilm.tokenize(TEXTS)[0])
        hidden = quantized(input_ids=ids, attention_mask=mask).last_hidden_state
    from models.encoder.pooling import pool

    cos = cos_rows(pool(hidden, mask, "mean", True), reference)
    assert cos.min() < 0.99


def test_a_precision_over_its_floor_runs_and_is_versioned() -> None:
    encoder = load_encoder(tiny_spec(device="cpu", precision="int8"))
    assert encoder.version.endswith("+torch-int8") and 0.99 <= encoder.fidelity.min <= 1.0001
