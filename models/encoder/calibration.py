"""`auto`: choose backend x precision x token budget by measurement at warm-up.

For every candidate the calibration measures fidelity against torch fp32 (min cosine over the probe texts and a
corpus of mixed lengths) and throughput (real tokens/s through the engine, best of interleaved repeats); the
fastest candidate that meets its floor wins (within 5% it is a tie, settled for less padding, then higher
fidelity). A length multiple (batch lengths rounded up for a runtime's kernels) is tried only where its rounding
keeps the calibration corpus's padding efficiency at the padding floor. Loading is the caller's (``load(mode)``);
keeping the choice is calibration_store's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch
from tokenizers import Tokenizer

from core import progress
from models.encoder.backends.base import BackendUnavailable
from models.encoder.backends.registry import BACKENDS, unavailable_reason
from models.encoder.device import device_kind
from models.encoder.engine import encode_texts, warm_up
from models.encoder.precision import PROBE_TEXTS, Fidelity, fidelity, floor_for
from models.encoder.spec import Calibration, EncoderSpec, Mode
from models.encoder.st_layout import ModelInfo
from models.encoder.text_encoder import TextEncoder, probe_fidelity

Loader = Callable[[Mode], TextEncoder]  # the loader's load(mode): the model's encoder in a mode

log = logging.getLogger(__name__)


CPU_PRECISIONS = ("fp32", "bf16", "int8")
CUDA_PRECISIONS = ("bf16", "fp16", "fp32")
CPU_BUDGETS = (1024, 2048, 4096)
CUDA_BUDGETS = (16384, 32768, 65536, 131072)
SHAPE_MULTIPLES = (1, 16)  # tried for the finalists: does padding lengths to 16 help a runtime's kernels?
STREAM_COUNTS = (2, 4)  # tried for the finalists of a multi-stream backend (never more than the threads)
REPEATS = 2
FINALISTS = 2
SCREEN = 3  # a candidate under a third of the fastest on one batch cannot win on the corpus: dropped unmeasured
KEEP = 0.75  # after one corpus pass, a trial under 3/4 of the best is not timed again (passes swung up to 30%)


PHASES = 2  # progress steps after the candidates' loads: timing passes, the finalists' sweep
TIE = 0.05  # trials within 5% of the fastest are a tie on a shared machine (repeated passes swing more than that)


@dataclass
class Trial:
    """One measured candidate: its mode, fidelity to torch fp32, best throughput, and verdict."""

    mode: Mode
    floor: float
    fidelity: Fidelity | None = None
    tokens_per_s: float = 0.0
    note: str = ""
    padding_efficiency: float = 1.0  # real tokens / computed token slots on the calibration corpus

    @property
    def meets_floor(self) -> bool:
        """Return whether the trial's min cosine is at or over its floor."""
        return self.fidelity is not None and self.fidelity.min >= self.floor

    def as_dict(self) -> dict[str, object]:
        """Return the trial as a row of the calibration table."""
        return {
            "mode": self.mode.label,
            "floor": self.floor,
            "tokens_per_s": round(self.tokens_per_s, 1),
            "padding_efficiency": round(self.padding_efficiency, 4),
            "fidelity": self.fidelity.as_dict() if self.fidelity else None,
            "note": self.note,
        }


def candidates(spec: EncoderSpec, device: torch.device) -> list[tuple[str, str]]:
    """Return the (backend, precision) pairs auto considers: the spec's pins, the rest open."""
    precisions = CUDA_PRECISIONS if device.type == "cuda" else CPU_PRECISIONS
    backends = [spec.backend] if spec.backend != "auto" else list(BACKENDS)
    chosen = [spec.precision] if spec.precision != "auto" else list(precisions)
    return [(b, p) for b in backends for p in chosen]


def budgets(spec: EncoderSpec, device: torch.device) -> tuple[int, ...]:
    """Return the token budgets auto tries: the spec's pinned one, its list, or the device's."""
    if spec.token_budget:
        return (spec.token_budget,)
    return tuple(spec.calibration_budgets or (CUDA_BUDGETS if device.type == "cuda" else CPU_BUDGETS))


def calibration_texts(tokenizer: Tokenizer, max_length: int, tokens: int, seed: int = 0) -> list[str]:
    """Return a deterministic corpus of about `tokens` tokens whose lengths spread log-uniformly up to max_length.

    Every fourth text repeats one word: degenerate inputs (a word over and over, up to the length limit) push
    activations far past what sentences do, and static int8 scales must cover them.
    """
    rng = np.random.default_rng(seed)
    words = corpus_words()
    texts: list[str] = []
    total = 0
    while total < tokens:
        n_words = max(int(np.exp(rng.uniform(0.0, np.log(max(max_length, 2))))), 1)
        start = int(rng.integers(0, len(words)))
        if len(texts) % 4 == 3:
            text = " ".join([words[start]] * n_words)
        else:
            text = " ".join(words[(start + i) % len(words)] for i in range(n_words))
        texts.append(text)
        total += min(len(tokenizer.encode(text).ids), max_length)
    return texts


def corpus_words() -> list[str]:
    """Return the words the calibration corpora are made of (those of the sentence-like probe texts)."""
    return " ".join(PROBE_TEXTS[:8] + PROBE_TEXTS[11:14]).split()


def limit_repeats(max_length: int, count: int, seed: int = 0) -> list[str]:
    """Return `count` texts that each repeat one word past max_length (drawn by seed from calibration_texts' words).

    calibration_texts' log-uniform lengths rarely reach the limit, and there a repeated word is the hardest input for
    static int8: on an AMX Xeon (model 207) MiniLM's int8 met its target on corpora without such texts, then scored
    min cosine 0.9895 on "very " * 300, under its 0.99 floor. The int8 statistics and verdict corpora carry them.
    """
    rng = np.random.default_rng(seed)
    words = corpus_words()
    return [" ".join([words[int(rng.integers(0, len(words)))]] * max_length) for _ in range(count)]


def choose(ok: list[Trial]) -> Trial:
    """Return the winner among trials over their floors: the fastest, except that a tie (within TIE of it)
    goes to the trial that pads less (length multiple 1), then to float over int8 (higher fidelity), then to speed."""
    fastest = max(t.tokens_per_s for t in ok)
    tied = [t for t in ok if t.tokens_per_s >= fastest * (1 - TIE)]
    return min(tied, key=lambda t: (t.mode.length_multiple != 1, t.mode.precision == "int8", -t.tokens_per_s))


def multiple_padding(lengths: list[int], multiple: int) -> float:
    """Return the padding efficiency that rounding each length up to `multiple` alone leaves (1.0: none added)."""
    rounded = sum(-(-n // multiple) * multiple for n in lengths)
    return sum(lengths) / rounded if rounded else 1.0


def shape_multiples(lengths: list[int], padding_floor: float) -> tuple[int, ...]:
    """Return the length multiples worth timing: those whose rounding keeps these lengths at the padding floor."""
    kept = tuple(m for m in SHAPE_MULTIPLES if multiple_padding(lengths, m) >= padding_floor)
    for multiple in sorted(set(SHAPE_MULTIPLES) - set(kept)):
        log.info(
            "auto: length multiple %d not tried: it alone leaves padding efficiency %.3f, under the padding floor %s",
            multiple,
            multiple_padding(lengths, multiple),
            padding_floor,
        )
    return kept or (1,)


def run_calibration(
    spec: EncoderSpec, info: ModelInfo, tokenizer: Tokenizer, device: torch.device, threads: int, load: Loader
) -> tuple[TextEncoder, Calibration]:
    """Return (the winner's loaded encoder, the calibration) after measuring every candidate here.

    ``load(mode)`` returns the model's encoder in a mode (the loader's; the calibration never loads a backend itself).
    """
    started = time.perf_counter()
    tried = budgets(spec, device)
    default = tried[len(tried) // 2]
    corpus = calibration_texts(tokenizer, info.max_seq_length, 2 * max(tried))
    reference = load(Mode("torch", "fp32", default))
    loaded: dict[tuple[str, str, int], TextEncoder] = {}
    trials = _screened_trials(spec, device, default, load, reference, loaded, corpus, tokenizer, info)
    steps = len(candidates(spec, device)) + PHASES
    progress.report("calibrate", steps - 2, steps)  # loaded, screened, checked against torch fp32
    _time_trials([t for t in trials if t.meets_floor], loaded, corpus, reference)
    progress.report("calibrate", steps - 1, steps)
    finalists = sorted((t for t in trials if t.meets_floor), key=lambda t: -t.tokens_per_s)[:FINALISTS]
    _load_streams(finalists, loaded, threads, load)
    lengths = [min(len(tokenizer.encode(text).ids), info.max_seq_length) for text in corpus]
    trials += _sweep(finalists, loaded, corpus, tried, reference, shape_multiples(lengths, spec.padding_floor))
    progress.report("calibrate", steps, steps)
    best = _best(trials)
    winner = loaded.get(_key(best.mode), reference)
    winner.backend.length_multiple = best.mode.length_multiple
    assert best.fidelity is not None
    calibration = Calibration(
        best.mode,
        best.fidelity,
        best.tokens_per_s,
        device_kind(device, threads),
        time.perf_counter() - started,
        False,
        [t.as_dict() for t in trials],
    )
    log.info(
        "auto: chose %s at %.0f real tokens/s, min cosine %.5f (calibrated in %.1fs over %d trials)",
        best.mode.label,
        best.tokens_per_s,
        best.fidelity.min,
        calibration.seconds,
        len(trials),
    )
    return winner, calibration


def _screened_trials(
    spec: EncoderSpec,
    device: torch.device,
    default: int,
    load: Loader,
    reference: TextEncoder,
    loaded: dict[tuple[str, str, int], TextEncoder],
    corpus: list[str],
    tokenizer: Tokenizer,
    info: ModelInfo,
) -> list[Trial]:
    """Return a trial per candidate, loaded, screened on one batch and checked for fidelity; those over their floor
    are kept in ``loaded``."""
    trials: list[Trial] = []
    encoders: list[tuple[Trial, TextEncoder]] = []
    pairs = candidates(spec, device)
    for index, (backend_name, precision) in enumerate(pairs, start=1):
        trial = Trial(Mode(backend_name, precision, default), floor_for(precision, spec.float_floor, spec.int8_floor))
        trials.append(trial)
        encoder = _try_load(trial, reference, device, load)
        if encoder is not None:
            encoders.append((trial, encoder))
        progress.report("calibrate", index, len(pairs) + PHASES)
    _screen(encoders, calibration_texts(tokenizer, info.max_seq_length, default, seed=2))
    expected = _vectors(reference, corpus)
    for trial, encoder in encoders:
        if trial.note:
            continue
        trial.fidelity = _combined_fidelity(reference, encoder, expected, corpus)
        if trial.meets_floor:
            loaded[_key(trial.mode)] = encoder
        else:
            trial.note = f"under floor {trial.floor}"
    return trials


def _best(trials: list[Trial]) -> Trial:
    """Return the winner among the measured trials over their floors; BackendUnavailable when there is none."""
    ok = [t for t in trials if t.meets_floor and t.tokens_per_s > 0]
    if not ok:
        raise BackendUnavailable("no candidate met its fidelity floor: " + "; ".join(f"{t.mode.label}: {t.note}" for t in trials))
    return choose(ok)


def _screen(encoders: list[tuple[Trial, TextEncoder]], texts: list[str]) -> None:
    """Note as dropped each candidate whose tokens/s on one batch of texts is under 1/SCREEN of the fastest's.

    Its fidelity and timing passes over the corpus are skipped: on a CPU without VNNI or native bf16, torch
    int8 ran at 100 and emulated bf16 at 475 tokens/s against 4,000 for fp32, and their passes took 200 s.
    """
    for trial, encoder in encoders:  # a cold first batch is not the mode's speed (bf16 on an H200 was dropped so)
        _warm(encoder, texts, trial.mode)
    speeds = [_throughput(encoder, texts, trial.mode)[0] for trial, encoder in encoders]
    fastest = max(speeds, default=0.0)
    for (trial, _), speed in zip(encoders, speeds, strict=True):
        if speed < fastest / SCREEN:
            trial.tokens_per_s = speed
            trial.note = f"dropped on one screening batch: {speed:.0f} tokens/s, under 1/{SCREEN} of the fastest {fastest:.0f}"


def _key(mode: Mode) -> tuple[str, str, int]:
    """Return what a loaded encoder is shared by: backend, precision and streams (budgets are per call)."""
    return mode.backend, mode.precision, mode.streams


def stream_counts(threads: int) -> list[int]:
    """Return the stream counts over 1 that a multi-stream backend is tried with on this many threads."""
    return sorted({n for n in (*STREAM_COUNTS, threads) if 1 < n <= threads})


def _load_streams(finalists: list[Trial], loaded: dict[tuple[str, str, int], TextEncoder], threads: int, load: Loader) -> None:
    """Load each finalist of a multi-stream backend again with every stream count (its converted model is cached)."""
    for final in finalists:
        encoder = loaded.get(_key(final.mode))
        if encoder is None or not getattr(encoder.backend, "multi_stream", False):
            continue
        for streams in stream_counts(threads):
            mode = replace(final.mode, streams=streams)
            loaded[_key(mode)] = load(mode)


def _try_load(trial: Trial, reference: TextEncoder, device: torch.device, load: Loader) -> TextEncoder | None:
    """Return the candidate's encoder (the reference itself for torch fp32), or None with the reason noted."""
    mode = trial.mode
    if (mode.backend, mode.precision) == ("torch", "fp32"):
        return reference
    reason = unavailable_reason(mode.backend, mode.precision, device)
    if reason:
        trial.note = f"skipped: {reason}"
        return None
    try:
        return load(mode)
    except (BackendUnavailable, RuntimeError, ValueError) as exc:  # a runtime that cannot take this model
        trial.note = f"skipped: {type(exc).__name__}: {str(exc)[:160]}"
        return None


def _vectors(encoder: TextEncoder, corpus: list[str]) -> np.ndarray:
    return encode_texts(encoder, corpus, encoder.token_budget)[0]


def _combined_fidelity(reference: TextEncoder, encoder: TextEncoder, expected: np.ndarray, corpus: list[str]) -> Fidelity:
    """Return fidelity over the probe texts (one per batch) and the corpus (planned batches) together."""
    probes = probe_fidelity(reference, encoder)
    planned = fidelity(expected, _vectors(encoder, corpus))
    return Fidelity(min(probes.min, planned.min), min(probes.p1, planned.p1), (probes.mean + planned.mean) / 2)


def _warm(encoder: TextEncoder, corpus: list[str], mode: Mode) -> None:
    """Run every batch shape of the corpus in mode that the encoder has not run yet, untimed."""
    encoder.backend.length_multiple = mode.length_multiple
    try:
        warm_up(encoder, corpus, mode.token_budget)
    finally:
        encoder.backend.length_multiple = 1


def _throughput(encoder: TextEncoder, corpus: list[str], mode: Mode) -> tuple[float, float]:
    """Return (real tokens/s, padding efficiency) of one pass of the corpus through the engine in mode."""
    encoder.backend.length_multiple = mode.length_multiple
    try:
        _, stats = encode_texts(encoder, corpus, mode.token_budget)
    finally:
        encoder.backend.length_multiple = 1
    return stats.real_tokens / max(stats.seconds, 1e-9), stats.padding_efficiency


def _time_trials(
    trials: list[Trial], loaded: dict[tuple[str, str, int], TextEncoder], corpus: list[str], reference: TextEncoder
) -> None:
    """Set each trial's best-of-REPEATS throughput, modes interleaved so that machine noise hits all alike, every
    trial's batch shapes warmed first (a cold first pass could drop it after one pass)."""
    for trial in trials:
        if not trial.note:
            _warm(loaded.get(_key(trial.mode), reference), corpus, trial.mode)
    for repeat in range(REPEATS):
        for trial in trials:
            if trial.note:
                continue
            encoder = loaded.get(_key(trial.mode), reference)
            speed, trial.padding_efficiency = _throughput(encoder, corpus, trial.mode)
            trial.tokens_per_s = max(trial.tokens_per_s, speed)
        if repeat == 0 and trials:  # a trial far behind after one pass cannot win on a repeat: stop timing it
            best = max(t.tokens_per_s for t in trials)
            for trial in trials:
                if trial.tokens_per_s < best * KEEP and not trial.note:
                    trial.note = f"dropped after one pass (under {KEEP:g} of the best)"


def _sweep(
    finalists: list[Trial],
    loaded: dict[tuple[str, str, int], TextEncoder],
    corpus: list[str],
    tried: tuple[int, ...],
    reference: TextEncoder,
    shape_multiples: tuple[int, ...] = (1,),
) -> list[Trial]:
    """Return trials of the finalists at the other budgets, length multiples (where shapes matter to the runtime)
    and stream counts (where the backend was loaded with several).

    The finalists are timed again in the same interleaved passes, so the comparison is made in one noise window.
    """
    extra: list[Trial] = []
    for final in finalists:
        encoder = loaded.get(_key(final.mode), reference)
        multiples = shape_multiples if getattr(encoder.backend, "shape_sensitive", False) else (1,)
        streams = [n for (b, p, n) in loaded if (b, p) == (final.mode.backend, final.mode.precision)] or [1]
        for budget in tried:
            for multiple in multiples:
                for count in streams:
                    mode = Mode(final.mode.backend, final.mode.precision, budget, multiple, count)
                    if mode != final.mode:
                        extra.append(Trial(mode, final.floor, final.fidelity))
        final.tokens_per_s = 0.0  # timed again beside its variants, in the same noise
    _time_trials([*finalists, *extra], loaded, corpus, reference)
    return extra
