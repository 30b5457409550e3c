"""The padding-free path on the tiny random encoder: token-major batches, the packed BERT forward, segment pooling.

Packed must reproduce padded: same vectors (min cosine >= 0.9999) for every length from 1 to the maximum, a batch of
one, every pooling mode and precision the CPU runs.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch

from core.errors import UsageError
from models.encoder.backends.registry import BACKENDS
from models.encoder.batching import plan_packed
from models.encoder.engine import encode_texts, run_batches, warm_up
from models.encoder.loader import get_encoder, load_encoder
from models.encoder.packed import PackedBert, attend, attention_layout, choose_attention, fuse_qkv
from models.encoder.pooling import pool_packed, pool_tensor
from models.encoder.text_encoder import TextEncoder
from models.encoder.tokens import TokenizedTexts, TokenizerPool, pack_rows, pad_rows
from tests.tiny_model import tiny_spec

if TYPE_CHECKING:
    import transformers

    from models.encoder.spec import EncoderSpec

TEXTS = [
    "a",
    "",
    "ok",
    "The quick brown fox jumps over the lazy dog.",
    "Stocks rallied on Tuesday after the central bank held rates steady.",
    "¿Dónde está la biblioteca? Ünïcödé — ok 🙂",
    "goal " * 40,
    "word " * 600,  # past the maximum length: truncated
    "Quantum error correction protects logical qubits from noise in physical qubits.",
]


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


@pytest.fixture(scope="module")
def padded() -> TextEncoder:
    return get_encoder(tiny_spec())


@pytest.fixture(scope="module")
def packed() -> TextEncoder:
    return get_encoder(tiny_spec(backend="torch-packed"))


def _rows_of_every_length(encoder: TextEncoder, seed: int = 0) -> TokenizedTexts:
    """Return token rows of every length 1..max_length ([CLS] ... [SEP] from 2 on), ids drawn from the vocabulary."""
    rng = np.random.default_rng(seed)
    cls, sep = encoder.tokenizer.token_to_id("[CLS]"), encoder.tokenizer.token_to_id("[SEP]")
    rows = [[cls]] + [[cls, *rng.integers(1000, 29000, size=n - 2).tolist(), sep] for n in range(2, encoder.max_length + 1)]
    return TokenizedTexts.from_lists(rows)


def test_the_packed_backend_is_a_candidate_like_the_others(packed: TextEncoder) -> None:
    assert "torch-packed" in BACKENDS
    assert packed.packed and packed.backend.name == "torch-packed"
    assert packed.version.endswith("+torch-packed-fp32")
    assert choose_attention(packed.model, torch.device("cpu"), torch.float32) == "padded"  # varlen is CUDA's


@pytest.mark.parametrize("budget", [64, 512, 100_000])
def test_packed_equals_padded_on_texts(padded: TextEncoder, packed: TextEncoder, budget: int) -> None:
    expected, pad_stats = encode_texts(padded, TEXTS * 2, token_budget=budget)
    out, stats = encode_texts(packed, TEXTS * 2, token_budget=budget)
    assert _cos(out, expected).min() >= 0.9999
    assert stats.padded_tokens == stats.real_tokens == pad_stats.real_tokens  # padding-free: efficiency 1.0
    assert stats.truncated == pad_stats.truncated == 2
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)


def test_packed_equals_padded_for_every_length_and_a_batch_of_one(padded: TextEncoder, packed: TextEncoder) -> None:
    tokens = _rows_of_every_length(packed)
    lengths = tokens.lengths
    assert lengths.min() == 1 and lengths.max() == packed.max_length
    one_each = [np.array([i]) for i in range(len(tokens))]  # every row alone: a batch of one
    alone, _ = run_batches(padded, tokens, one_each)
    together, runner = run_batches(packed, tokens, plan_packed(lengths, 700))
    singles, _ = run_batches(packed, tokens, one_each)
    assert runner.batches > 1 and runner.padded == int(lengths.sum())
    assert _cos(together, alone).min() >= 0.9999
    assert _cos(singles, alone).min() >= 0.9999


def test_packed_hidden_states_equal_padded_ones_token_by_token(padded: TextEncoder, packed: TextEncoder) -> None:
    ids, mask = padded.collate(padded.tokenize(TEXTS)[0])
    with torch.inference_mode():
        reference = padded.backend.hidden_states(ids, mask)
        got = packed.backend.hidden_states(ids, mask)
    real = mask.bool()
    assert got.shape == reference.shape
    assert float((got[real] - reference[real]).abs().max()) < 1e-4
    assert float(got[~real].abs().max()) == 0.0  # padding positions are not computed at all


def test_rows_of_one_length_run_without_a_grid(packed: TextEncoder) -> None:
    """A batch whose rows are all as long as the longest needs no scatter: its packed rows already are a grid."""
    tokens = TokenizedTexts.from_lists([[101, 7592, 2088, 102]] * 3 + [[101, 2088, 7592, 102]])
    batch = pack_rows(tokens, np.arange(4))
    layout = attention_layout(batch.segments, batch.positions, batch.offsets, batch.longest, batch.tokens, padded=True)
    assert "index" not in layout and "mask" not in layout
    mixed = pack_rows(TokenizedTexts.from_lists([[101, 102], [101, 7592, 2088, 102]]), np.arange(2))
    mixed_layout = attention_layout(mixed.segments, mixed.positions, mixed.offsets, mixed.longest, mixed.tokens, padded=True)
    assert mixed_layout["index"].tolist() == [0, 1, 4, 5, 6, 7] and mixed_layout["mask"].shape == (2, 1, 1, 4)
    qkv = torch.randn(mixed.tokens, 3 * 384)
    context = attend(qkv, mixed_layout, heads=6, varlen=None)
    alone = attend(qkv[:2], attention_layout(*_layout_args(mixed, 0)), heads=6, varlen=None)
    torch.testing.assert_close(context[:2], alone)  # the short row never sees the long one


def _layout_args(batch: object, row: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int, bool]:
    """Return attention_layout's arguments for one row of a packed batch, alone."""
    from models.encoder.tokens import PackedBatch

    assert isinstance(batch, PackedBatch)
    start, stop = int(batch.offsets[row]), int(batch.offsets[row + 1])
    n = stop - start
    return torch.zeros(n, dtype=torch.int32), torch.arange(n), torch.tensor([0, n], dtype=torch.int32), n, n, True


@pytest.mark.parametrize("mode", ["mean", "cls", "max"])
@pytest.mark.parametrize("normalize", [True, False])
def test_segment_pooling_equals_masked_pooling(mode: str, normalize: bool) -> None:
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 12, size=7)
    tokens = TokenizedTexts.from_lists([list(range(n)) for n in lengths])
    batch = pack_rows(tokens, np.arange(7))
    hidden = torch.from_numpy(rng.normal(size=(batch.tokens, 16)).astype(np.float32))
    grid = torch.zeros(7, int(lengths.max()), 16)
    grid[torch.arange(int(lengths.max()))[None, :] < torch.from_numpy(lengths)[:, None]] = hidden
    _, mask = pad_rows(tokens, np.arange(7), pad_id=0)
    got = pool_packed(hidden, batch.segments, batch.offsets, batch.rows, mode, normalize)
    torch.testing.assert_close(got, pool_tensor(grid, mask, mode, normalize), rtol=1e-5, atol=1e-6)


def test_qkv_fusion_reuses_the_modules_own_parameters(padded: TextEncoder) -> None:
    model: Any = copy.deepcopy(padded.model)  # a transformers BertModel (submodules reached by name)
    attention = model.encoder.layer[0].attention.self
    x = torch.randn(5, 384)
    with torch.inference_mode():
        before = (attention.query(x), attention.key(x), attention.value(x))
    fused = fuse_qkv(attention)
    assert fused is not None
    weight, bias = fused
    assert weight.shape == (3 * 384, 384) and bias.shape == (3 * 384,)
    # the Linear layers now read their weights from the fused tensor: one copy of the values, not two
    assert attention.query.weight.data_ptr() == weight.data_ptr()
    assert attention.value.weight.data_ptr() == weight[2 * 384 :].data_ptr()
    assert attention.key.bias.data_ptr() == bias[384:].data_ptr()
    with torch.inference_mode():
        after = (attention.query(x), attention.key(x), attention.value(x))
        one = torch.nn.functional.linear(x, weight, bias)
    for a, b in zip(before, after, strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(one, torch.cat(before, dim=1))
    again = fuse_qkv(attention)
    assert again is not None and again[0].data_ptr() == weight.data_ptr()  # fused once per module, not again


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_reduced_precisions_packed_equal_padded(padded: TextEncoder, precision: str) -> None:
    texts = TEXTS * 2
    plain = load_encoder(tiny_spec(precision=precision))
    packed = load_encoder(tiny_spec(backend="torch-packed", precision=precision))
    expected, _ = encode_texts(plain, texts, token_budget=256)
    out, _ = encode_texts(packed, texts, token_budget=256)
    floor = 0.9999 if precision == "int8" else 0.999  # int8: per-token scales, the same tokens; bf16 rounds differently
    assert _cos(out, expected).min() >= floor
    reference, _ = encode_texts(padded, texts, token_budget=256)
    assert _cos(out, reference).min() >= (0.99 if precision == "int8" else 0.999)


def test_only_bert_encoders_run_packed(padded: TextEncoder) -> None:
    import transformers

    config = transformers.DistilBertConfig(dim=32, n_layers=1, n_heads=2, hidden_dim=64, vocab_size=100)
    with pytest.raises(ValueError, match="BERT encoders only"):
        PackedBert(transformers.DistilBertModel(config))
    with pytest.raises(UsageError, match="cannot run here"):
        load_encoder(_distilbert_spec(padded, config))


def _distilbert_spec(padded: TextEncoder, config: transformers.DistilBertConfig) -> EncoderSpec:
    """Return a pinned torch-packed spec of a tiny random DistilBERT folder beside the tiny BERT."""
    import shutil

    import transformers

    folder = padded.info.path.parent / "tiny-distilbert-random"
    if not (folder / "model.safetensors").is_file():
        transformers.DistilBertModel(config).save_pretrained(str(folder))
        shutil.copy(padded.info.path / "tokenizer.json", folder / "tokenizer.json")
    return tiny_spec(backend="torch-packed", model_path=str(folder))


def test_plan_packed_fills_batches_to_the_budget_by_real_tokens() -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 120, size=500)
    batches = plan_packed(lengths, 1000)
    rows = np.concatenate(batches)
    assert sorted(rows.tolist()) == list(range(500))  # every row once
    sums = [int(lengths[b].sum()) for b in batches]
    assert max(sums) <= 1000 and min(sums[:-1]) > 1000 - 120  # full but for the last
    assert plan_packed(np.array([5000, 3]), 1000)[0].tolist() == [0]  # a row over the budget runs alone


def test_pack_and_pad_rows_lay_out_the_same_tokens() -> None:
    tokens = TokenizedTexts.from_lists([[101, 5, 6, 102], [101, 102], [101, 7, 102]])
    batch = pack_rows(tokens, np.array([2, 0]))
    assert batch.ids.tolist() == [101, 7, 102, 101, 5, 6, 102]
    assert batch.positions.tolist() == [0, 1, 2, 0, 1, 2, 3]
    assert batch.segments.tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert batch.offsets.tolist() == [0, 3, 7] and (batch.rows, batch.longest) == (2, 4)
    ids, mask = pad_rows(tokens, np.array([2, 0]), pad_id=0, multiple=8)
    assert ids.tolist() == [[101, 7, 102, 0, 0, 0, 0, 0], [101, 5, 6, 102, 0, 0, 0, 0]]
    assert mask.sum(dim=1).tolist() == [3, 4]


def test_several_tokenizer_instances_give_the_same_ids(packed: TextEncoder) -> None:
    texts = [f"{t} {i}" for i in range(700) for t in TEXTS[:4]]  # several chunks of texts
    one = TokenizerPool(packed.tokenizer, packed.max_length, 1).encode(texts)
    three = TokenizerPool(packed.tokenizer, packed.max_length, 3).encode(texts)
    assert np.array_equal(one.ids, three.ids) and np.array_equal(one.offsets, three.offsets)
    assert one.ids.dtype == np.int32 and len(one) == len(texts)
    ids, full = packed.tokenize(texts[:5])
    assert [one.row(i) for i in range(5)] == ids and full.tolist() == one.full_lengths[:5].tolist()


def test_warm_up_covers_packed_shapes_once(packed: TextEncoder) -> None:
    fresh = TextEncoder(packed.info, packed.tokenizer, packed.backend, packed.device, 256)
    texts = TEXTS * 20
    assert warm_up(fresh, texts) > 0
    assert warm_up(fresh, texts) == 0


def test_tokenizing_overlaps_compute_window_by_window_with_the_same_vectors(packed: TextEncoder) -> None:
    from models.encoder.engine import stream_window, streamed

    texts = [f"{TEXTS[i % len(TEXTS)][:80]} {i}" for i in range(stream_window(256) + 300)]
    overlapped = TextEncoder(packed.info, packed.tokenizer, packed.backend, packed.device, 256, tokenizer_threads=2)
    assert streamed(overlapped, len(texts), 256) and not streamed(packed, len(texts), 256)
    expected, whole = encode_texts(packed, texts, token_budget=256)
    out, stats = encode_texts(overlapped, texts, token_budget=256)
    assert _cos(out, expected).min() >= 0.9999  # every text in its place
    assert (stats.texts, stats.real_tokens, stats.truncated) == (whole.texts, whole.real_tokens, whole.truncated)
    assert stats.padded_tokens == stats.real_tokens and stats.batches >= whole.batches
