"""Unit tests of the encoding engine on the tiny random encoder (real tokenizer, 1-layer BERT)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from models.encoder.engine import EncodeStats, encode_texts, warm_up
from models.encoder.loader import get_encoder
from models.encoder.phases import NO_TIMER, PhaseTimer
from models.encoder.text_encoder import Batch, TextEncoder
from tests.helpers import cos_rows
from tests.tiny_model import tiny_spec

TEXTS = [
    "a",
    "The quick brown fox jumps over the lazy dog.",
    "Stocks rallied on Tuesday after the central bank held rates steady.",
    "¿Dónde está la biblioteca? Ünïcödé — ok 🙂",
    "42 1337 3.14159 2024-01-31",
    "goal goal goal goal goal goal goal goal goal goal goal goal",
    "Short.",
    "A recipe: whisk two eggs, add flour, fold gently and bake for twenty minutes at 180 degrees.",
    "",
    "!!! ??? ... ;;; :::",
    "the match ended in a draw after extra time and penalties were not needed",
    "Quantum error correction protects logical qubits from noise in physical qubits.",
]


@pytest.fixture(scope="module")
def tiny() -> TextEncoder:
    return get_encoder(tiny_spec())


@pytest.fixture(scope="module")
def tiny32() -> TextEncoder:
    return get_encoder(tiny_spec(max_seq_length=32))


def _long_text(n_words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    words = ["river", "mountain", "engine", "coffee", "signal", "harvest", "window", "planet", "violin", "ledger"]
    return " ".join(rng.choice(words, size=n_words).tolist())


def test_encode_texts_shape_dtype_unit_norm(tiny: TextEncoder) -> None:
    out, stats = encode_texts(tiny, TEXTS)
    assert out.shape == (len(TEXTS), tiny.dim) == (len(TEXTS), 384)
    assert out.dtype == np.float32
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert stats.texts == len(TEXTS)
    assert stats.batches >= 1


@pytest.mark.parametrize("budget", [None, 64, 100_000])
def test_encode_texts_keeps_input_order(tiny: TextEncoder, budget: int | None) -> None:
    out, _ = encode_texts(tiny, TEXTS, token_budget=budget)
    alone = np.vstack([encode_texts(tiny, [t])[0] for t in TEXTS])
    cos = cos_rows(out, alone)
    assert np.all(cos >= 0.9999), cos
    # The rows are not all the same vector, so a permutation would have been caught above.
    off_diag = cos_rows(out, np.roll(alone, 1, axis=0))
    assert np.all(off_diag < 0.9999)


def test_encode_texts_bit_identical_across_calls(tiny: TextEncoder) -> None:
    a, _ = encode_texts(tiny, TEXTS, token_budget=128)
    b, _ = encode_texts(tiny, TEXTS, token_budget=128)
    assert np.array_equal(a, b)


def test_encode_texts_stats_truncation_and_tokens(tiny32: TextEncoder) -> None:
    texts = ["short one", _long_text(80, 0), "another short text here", _long_text(200, 1), _long_text(40, 2)]
    ids, full = tiny32.tokenize(texts)
    out, stats = encode_texts(tiny32, texts, token_budget=96)
    assert full[1] > 32 and full[3] > 32 and full[4] > 32 and full[0] <= 32 and full[2] <= 32
    assert stats.truncated == 3
    assert all(len(x) <= 32 for x in ids)
    assert stats.real_tokens == int(np.minimum(full, 32).sum()) == sum(len(x) for x in ids)
    assert stats.padded_tokens >= stats.real_tokens
    assert 0.0 < stats.padding_efficiency <= 1.0
    # Budget 96 fits three 32-token rows; lengths 32, 32, 32, then the two short ones.
    assert stats.batches == 2
    assert stats.oom_splits == 0
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)


def test_truncation_keeps_the_final_sep(tiny32: TextEncoder) -> None:
    ids, full = tiny32.tokenize([_long_text(100, 3)])
    sep = tiny32.tokenizer.token_to_id("[SEP]")
    cls = tiny32.tokenizer.token_to_id("[CLS]")
    assert full[0] > 32 and len(ids[0]) == 32
    assert ids[0][0] == cls and ids[0][-1] == sep


def test_no_truncation_counts_zero_and_padding_efficiency_one_for_equal_lengths(tiny: TextEncoder) -> None:
    texts = ["goal goal goal"] * 6
    _, stats = encode_texts(tiny, texts)
    assert stats.truncated == 0
    assert stats.padded_tokens == stats.real_tokens
    assert stats.padding_efficiency == 1.0


def test_padding_efficiency_below_one_for_mixed_lengths(tiny: TextEncoder) -> None:
    _, stats = encode_texts(tiny, TEXTS, token_budget=100_000)  # one batch: everything pads to the longest
    assert stats.batches == 1
    assert stats.padding_efficiency < 1.0
    assert stats.padded_tokens == len(TEXTS) * max(len(x) for x in tiny.tokenize(TEXTS)[0])


def test_encode_texts_empty(tiny: TextEncoder) -> None:
    out, stats = encode_texts(tiny, [])
    assert out.shape == (0, tiny.dim)
    assert stats.texts == 0 and stats.batches == 0 and stats.padding_efficiency == 1.0


def test_encode_stats_merge_and_dict() -> None:
    a = EncodeStats(texts=2, real_tokens=10, padded_tokens=20, truncated=1, batches=1, oom_splits=0, seconds=0.5)
    b = EncodeStats(texts=3, real_tokens=30, padded_tokens=30, truncated=0, batches=2, oom_splits=1, seconds=1.0)
    m = a.merge(b)
    assert (m.texts, m.real_tokens, m.padded_tokens, m.truncated, m.batches, m.oom_splits) == (5, 40, 50, 1, 3, 1)
    assert m.seconds == pytest.approx(1.5)
    assert m.as_dict()["padding_efficiency"] == 0.8


def test_oom_back_off_splits_and_loses_nothing(tiny: TextEncoder, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = TEXTS * 3  # 36 rows
    expected, clean = encode_texts(tiny, texts, token_budget=100_000)
    assert clean.oom_splits == 0
    real_vectors = tiny.vectors
    seen_rows: list[int] = []

    def flaky_vectors(batch: Batch, timer: PhaseTimer = NO_TIMER) -> torch.Tensor | np.ndarray:
        assert isinstance(batch, tuple)  # the tiny encoder runs padded
        input_ids, _ = batch
        if input_ids.shape[0] > 4:
            raise torch.OutOfMemoryError("fake")
        seen_rows.append(int(input_ids.shape[0]))
        return real_vectors(batch, timer)

    monkeypatch.setattr(tiny, "vectors", flaky_vectors)
    out, stats = encode_texts(tiny, texts, token_budget=100_000)
    assert stats.oom_splits > 0
    assert stats.texts == len(texts)
    assert sum(seen_rows) == len(texts)  # every row encoded exactly once after the splits
    assert max(seen_rows) <= 4
    assert stats.batches == len(seen_rows)
    assert np.all(cos_rows(out, expected) >= 0.9999)
    assert stats.padded_tokens >= stats.real_tokens == clean.real_tokens


def test_oom_on_a_single_row_is_raised(tiny: TextEncoder, monkeypatch: pytest.MonkeyPatch) -> None:
    def always_oom(batch: Batch, timer: PhaseTimer = NO_TIMER) -> np.ndarray:
        raise torch.OutOfMemoryError("fake")

    monkeypatch.setattr(tiny, "vectors", always_oom)
    with pytest.raises(torch.OutOfMemoryError):
        encode_texts(tiny, TEXTS[:3])


def test_length_multiple_pads_batches_and_counts_the_padding(tiny: TextEncoder) -> None:
    expected, plain = encode_texts(tiny, TEXTS, token_budget=256)
    tiny.backend.length_multiple = 16
    try:
        ids, mask = tiny.collate([[101, 7, 102], [101, 102]])
        assert ids.shape == mask.shape == (2, 16)
        assert int(mask.sum()) == 5 and bool((ids[mask == 0] == tiny.pad_id).all())
        out, stats = encode_texts(tiny, TEXTS, token_budget=256)
    finally:
        tiny.backend.length_multiple = 1
    assert stats.padded_tokens % 16 == 0 and stats.padded_tokens > plain.padded_tokens
    assert np.all(cos_rows(out, expected) >= 0.9999)  # padding is masked out: the vectors do not move


@pytest.mark.parametrize("mode", ["mean", "cls", "max"])
def test_pooling_modes_ignore_padding(mode: str) -> None:
    from models.encoder.pooling import pool

    hidden = torch.tensor([[[1.0, 5.0], [3.0, -1.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    expected = {"mean": [2.0, 2.0], "cls": [1.0, 5.0], "max": [3.0, 5.0]}[mode]
    np.testing.assert_allclose(pool(hidden, mask, mode, normalize=False)[0], expected)
    unit = pool(hidden, mask, mode, normalize=True)[0]
    np.testing.assert_allclose(unit, np.asarray(expected) / np.linalg.norm(expected), rtol=1e-6)
    # numpy hidden states (OpenVINO's) take the numpy path: same numbers
    np.testing.assert_allclose(pool(hidden.numpy(), mask.numpy(), mode, normalize=True)[0], unit, rtol=1e-6)


def test_a_pinned_mode_never_calibrates_even_with_a_cache_folder(tmp_path: Path) -> None:
    from models.encoder.loader import spec_version

    spec = tiny_spec(cache_dir=str(tmp_path))
    encoder = get_encoder(spec)
    assert (encoder.backend.name, encoder.backend.precision, encoder.calibration) == ("torch", "fp32", None)
    assert spec_version(spec) == encoder.version and encoder.version.startswith("tiny-bert-random@")
    assert not (tmp_path / "calibration").exists()


@pytest.mark.parametrize("mode", ["mean", "cls", "max"])
@pytest.mark.parametrize("normalize", [True, False])
def test_numpy_and_torch_pooling_agree_on_random_batches(mode: str, normalize: bool) -> None:
    from models.encoder.pooling import pool

    rng = np.random.default_rng(3)
    hidden = rng.normal(size=(7, 11, 16)).astype(np.float32)
    lengths = rng.integers(1, 12, size=7)
    mask = (np.arange(11)[None, :] < lengths[:, None]).astype(np.int64)
    a = pool(torch.from_numpy(hidden), torch.from_numpy(mask), mode, normalize)
    b = pool(hidden, mask, mode, normalize)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_calibration_choice_fastest_wins_but_a_tie_goes_to_less_padding_then_float() -> None:
    from models.encoder.calibration import Trial, choose
    from models.encoder.precision import Fidelity
    from models.encoder.spec import Mode

    def trial(backend: str, precision: str, budget: int, multiple: int, speed: float, cos: float) -> Trial:
        floor = 0.99 if precision == "int8" else 0.999
        return Trial(Mode(backend, precision, budget, multiple), floor, Fidelity(cos, cos, cos), speed)

    fast_pad = trial("openvino", "bf16", 1024, 16, 103.0, 0.9999)
    plain = trial("openvino", "bf16", 2048, 1, 100.0, 0.9999)
    int8 = trial("openvino", "int8", 2048, 1, 101.0, 0.995)
    assert choose([fast_pad, plain, int8]) is plain  # all within 5%: no extra padding, then float
    clear_win = trial("openvino", "int8", 4096, 1, 120.0, 0.995)
    assert choose([fast_pad, plain, int8, clear_win]) is clear_win  # 20% faster is not noise


def test_a_length_multiple_is_tried_only_where_its_rounding_keeps_padding_at_the_floor() -> None:
    from models.encoder.calibration import multiple_padding, shape_multiples

    short = [3, 17, 20, 33, 40, 9]  # rounding to 16 computes 192 slots for 122 tokens
    assert multiple_padding(short, 16) == pytest.approx(122 / 192)
    assert multiple_padding(short, 1) == 1.0
    assert shape_multiples(short, 0.97) == (1,)
    assert shape_multiples(short, 0.6) == (1, 16)
    long = [250, 241, 255, 230]  # long texts: rounding to 16 adds under 3%
    assert multiple_padding(long, 16) == pytest.approx(976 / 1008)
    assert shape_multiples(long, 0.97) == (1,) and shape_multiples(long, 0.968) == (1, 16)
    assert shape_multiples([], 0.97) == (1, 16)  # nothing to pad


class _Slowed:
    """A real backend that waits after every batch for `factor` times the batch took, plus delay_s: a runtime
    that many times slower than the one it wraps, however loaded the machine is."""

    def __init__(self, backend: object, factor: float, delay_s: float) -> None:
        self._backend, self._factor, self._delay = backend, factor, delay_s
        self.name, self.precision, self.streams, self.length_multiple = "slowed", "fp32", 1, 1
        self.calls = 0

    def hidden_states(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        import time

        self.calls += 1
        started = time.perf_counter()
        hidden = self._backend.hidden_states(input_ids, mask)  # type: ignore[attr-defined]
        time.sleep(self._factor * (time.perf_counter() - started) + self._delay)
        return hidden


def test_screening_drops_a_candidate_far_slower_on_one_batch_before_its_corpus_passes(tiny: TextEncoder) -> None:
    from models.encoder.calibration import SCREEN, Trial, _screen
    from models.encoder.spec import Mode

    slow = TextEncoder(tiny.info, tiny.tokenizer, _Slowed(tiny.backend, 9.0, 0.1), tiny.device, 256)  # type: ignore[arg-type]
    fast_trial, slow_trial = Trial(Mode("torch", "fp32", 256), 0.999), Trial(Mode("slowed", "fp32", 256), 0.999)
    texts = [_long_text(40, seed) for seed in range(24)]  # several batches: the slow one waits once per batch
    _screen([(fast_trial, tiny), (slow_trial, slow)], texts)
    assert fast_trial.note == "" and fast_trial.fidelity is None  # kept for the fidelity and timing passes
    assert slow_trial.note.startswith("dropped on one screening batch") and f"1/{SCREEN}" in slow_trial.note
    assert slow_trial.tokens_per_s > 0 and not slow_trial.meets_floor
    kept = Trial(Mode("slowed", "fp32", 256), 0.999)
    _screen([(kept, slow)], texts)  # alone it is the fastest there is: nothing to drop it for
    assert kept.note == ""


def test_a_trial_far_behind_after_one_corpus_pass_is_not_timed_again(tiny: TextEncoder) -> None:
    from models.encoder.calibration import KEEP, REPEATS, Trial, _time_trials
    from models.encoder.spec import Mode

    slowed = _Slowed(tiny.backend, 3.0, 0.0)  # a quarter of the speed: far under KEEP of the best
    slow = TextEncoder(tiny.info, tiny.tokenizer, slowed, tiny.device, 256)  # type: ignore[arg-type]
    texts = [_long_text(40, seed) for seed in range(24)]
    encode_texts(slow, texts, 256)
    per_pass, slowed.calls = slowed.calls, 0
    assert warm_up(slow, texts, 256) > 0  # its shapes run once here, so the timing below meets none cold
    slowed.calls = 0
    fast_trial, slow_trial = Trial(Mode("torch", "fp32", 256), 0.999), Trial(Mode("slowed", "fp32", 256), 0.999)
    _time_trials([fast_trial, slow_trial], {("slowed", "fp32", 1): slow}, texts, tiny)
    assert per_pass > 1 and slowed.calls == per_pass  # one pass, then no more
    assert slow_trial.note == f"dropped after one pass (under {KEEP:g} of the best)"
    assert 0 < slow_trial.tokens_per_s < fast_trial.tokens_per_s * KEEP and fast_trial.note == ""
    assert REPEATS > 1  # the best was timed again: a repeat is what the drop saves


def test_warm_up_runs_each_batch_shape_once_and_then_none(tiny: TextEncoder) -> None:
    slowed = _Slowed(tiny.backend, 0.0, 0.0)
    fresh = TextEncoder(tiny.info, tiny.tokenizer, slowed, tiny.device, 256)  # type: ignore[arg-type]
    texts = [_long_text(n, n) for n in (3, 3, 3, 40, 41, 90)] * 4
    shapes = warm_up(fresh, texts, 256)
    assert shapes == slowed.calls > 0
    _, stats = encode_texts(fresh, texts, 256)
    assert shapes < stats.batches  # batches of one shape ran once, not once each
    slowed.calls = 0
    assert warm_up(fresh, texts, 256) == 0 and slowed.calls == 0  # all warm already
    assert warm_up(fresh, texts, 128) > 0  # another budget, other shapes
