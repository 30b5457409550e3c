"""`auto`: choose backend x precision x token budget by measurement at warm-up, persisted per device kind.

For every candidate the calibration measures fidelity against torch fp32 (min cosine over the probe
texts and a corpus of mixed lengths) and throughput (real tokens/s through the engine, best of
interleaved repeats); the fastest candidate that meets its floor wins (within 5% it is a tie, settled for less
padding, then higher fidelity). A length multiple (batch lengths rounded up for a runtime's kernels) is tried only
where its rounding keeps the calibration corpus's padding efficiency at the padding floor. The choice is written to
``<cache_dir>/calibration/<device kind>/<model digest>.json`` so the next run on the same kind of machine
reads it instead of measuring again; anything that could change the answer (runtimes' versions, floors,
candidates, thread count, the model) is part of the stored key, and a mismatch recalibrates.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from models.backends.base import Backend, BackendUnavailable, write_atomically
from models.backends.registry import BACKENDS, load_backend, unavailable_reason
from models.precision import PROBE_TEXTS, Fidelity, fidelity, floor_for
from models.st_layout import ModelInfo

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from models.encoder import EncoderSpec, TextEncoder

log = logging.getLogger(__name__)

FORMAT = 4  # 2: modes carry streams; OpenVINO int8 is static. 3: the onnxruntime backend. 4: the padding floor
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
DEFAULT_PADDING_FLOOR = 0.97  # a length multiple whose rounding alone pads under this is not tried
TIE = 0.05  # trials within 5% of the fastest are a tie on a shared machine (repeated passes swing more than that)
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "avx512_fp16", "amx_bf16", "amx_int8", "amx_tile")


@dataclass(frozen=True)
class Mode:
    """One way to run the model: backend, precision, token budget per batch, batch-length multiple, streams."""

    backend: str
    precision: str
    token_budget: int
    length_multiple: int = 1
    streams: int = 1  # batches run at once (OpenVINO CPU streams, the threads split between them)

    @property
    def label(self) -> str:
        """Return 'backend/precision@budget' (and '/xN' for lengths padded to a multiple N, '/sN' for N streams)."""
        pad = f"/x{self.length_multiple}" if self.length_multiple > 1 else ""
        streams = f"/s{self.streams}" if self.streams > 1 else ""
        return f"{self.backend}/{self.precision}@{self.token_budget}{pad}{streams}"


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


@dataclass(frozen=True)
class Calibration:
    """The outcome of auto: the chosen mode, its fidelity and speed, where and how it was decided."""

    mode: Mode
    fidelity: Fidelity
    tokens_per_s: float
    device_kind: str
    seconds: float
    from_cache: bool
    table: list[dict[str, object]] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        """Return the calibration's fields for run records and artifacts."""
        return {
            "calibration_device_kind": self.device_kind,
            "calibration_tokens_per_s": round(self.tokens_per_s, 1),
            "calibration_seconds": round(self.seconds, 2),
            "calibration_from_cache": self.from_cache,
            "calibration_candidates": self.table,
        }


def device_kind(device: torch.device, threads: int) -> str:
    """Return a file-safe name of the kind of machine: GPU name, or CPU model + relevant flags + threads."""
    if device.type == "cuda":
        return _slug(f"cuda-{torch.cuda.get_device_name(device)}")
    model, flags = cpu_model_and_flags()
    present = [f for f in CPU_FLAGS if f in flags]
    return _slug(f"cpu-{model}-{'-'.join(present) or 'baseline'}-{threads}t")


def cpu_model_and_flags() -> tuple[str, set[str]]:
    """Return the CPU's model name ('cpu' when unknown) and its feature flags, from /proc/cpuinfo."""
    model, flags = "cpu", set[str]()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name") and model == "cpu":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    return model, flags


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:160]


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


def calibration_key(spec: EncoderSpec, info: ModelInfo, device: torch.device, threads: int) -> dict[str, object]:
    """Return everything a persisted choice depends on; a stored choice with another key is measured again."""
    return {
        "format": FORMAT,
        "device_kind": device_kind(device, threads),
        "model": info.version,
        "max_seq_length": info.max_seq_length,
        "float_floor": spec.float_floor,
        "int8_floor": spec.int8_floor,
        "padding_floor": spec.padding_floor,
        "candidates": [list(c) for c in candidates(spec, device)],
        "budgets": list(budgets(spec, device)),
        "torch": torch.__version__,
        "openvino": _version_of("openvino"),
        "onnxruntime": _version_of("onnxruntime"),
    }


def _version_of(package: str) -> str:
    """Return an installed runtime's version, or 'none' (a runtime added or upgraded changes the answer)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "none"


def calibration_file(spec: EncoderSpec, info: ModelInfo, device: torch.device, threads: int) -> Path:
    """Return where the choice for this model on this kind of machine is persisted."""
    assert spec.cache_dir is not None
    return Path(spec.cache_dir) / "calibration" / device_kind(device, threads) / f"{_slug(info.version)}.json"


def _read_persisted(spec: EncoderSpec, info: ModelInfo, device: torch.device, threads: int) -> dict | None:
    file = calibration_file(spec, info, device, threads)
    if not file.is_file():
        return None
    try:
        stored = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError):
        log.warning("calibration file %s is unreadable: measuring again", file)
        return None
    if stored.get("key") != calibration_key(spec, info, device, threads):
        log.info("calibration file %s was made for other settings or runtimes: measuring again", file)
        return None
    return stored


def persisted_mode(spec: EncoderSpec, info: ModelInfo, device: torch.device, threads: int) -> Mode | None:
    """Return the persisted choice for this spec on this kind of machine, or None when there is none (or stale)."""
    stored = _read_persisted(spec, info, device, threads)
    return Mode(**stored["mode"]) if stored else None


def persisted_summary(spec: EncoderSpec, info: ModelInfo, device: torch.device, threads: int) -> dict[str, object] | None:
    """Return the persisted calibration's summary fields (as Calibration.summary, from_cache True), or None."""
    stored = _read_persisted(spec, info, device, threads)
    if stored is None:
        return None
    return Calibration(
        Mode(**stored["mode"]),
        Fidelity(**stored["fidelity"]),
        stored["tokens_per_s"],
        stored["key"]["device_kind"],
        float(stored.get("seconds", 0.0)),
        True,
        stored["table"],
    ).summary()


def calibrate_or_load(
    spec: EncoderSpec, info: ModelInfo, module: torch.nn.Module, tokenizer: Tokenizer, device: torch.device, threads: int
) -> TextEncoder:
    """Return the encoder in the mode auto chooses: the persisted one when valid, else measured now and persisted."""
    from models.encoder import TextEncoder, _request

    stored = None if spec.recalibrate else _read_persisted(spec, info, device, threads)
    if stored is not None:
        mode = Mode(**stored["mode"])
        request = _request(spec, info, module, mode.precision, device, threads, tokenizer, mode.streams)
        backend = load_backend(mode.backend, request)
        backend.length_multiple = mode.length_multiple
        calibration = Calibration(
            mode, Fidelity(**stored["fidelity"]), stored["tokens_per_s"], stored["key"]["device_kind"], 0.0, True, stored["table"]
        )
        log.info("auto: %s from the persisted calibration (%s)", mode.label, calibration_file(spec, info, device, threads))
    else:
        backend, calibration = run_calibration(spec, info, module, tokenizer, device, threads)
        _persist(spec, info, device, threads, calibration)
    encoder = TextEncoder(info, tokenizer, backend, device, calibration.mode.token_budget, calibration)
    encoder.fidelity = calibration.fidelity
    return encoder


def _persist(spec: EncoderSpec, info: ModelInfo, device: torch.device, threads: int, calibration: Calibration) -> None:
    """Write the choice atomically (temporary name, then rename)."""
    file = calibration_file(spec, info, device, threads)
    body = {
        "key": calibration_key(spec, info, device, threads),
        "mode": asdict(calibration.mode),
        "fidelity": asdict(calibration.fidelity),
        "tokens_per_s": calibration.tokens_per_s,
        "seconds": calibration.seconds,
        "table": calibration.table,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_atomically(file, json.dumps(body, indent=2).encode())


def calibration_texts(tokenizer: Tokenizer, max_length: int, tokens: int, seed: int = 0) -> list[str]:
    """Return a deterministic corpus of about `tokens` tokens whose lengths spread log-uniformly up to max_length.

    Every fourth text repeats one word: degenerate inputs (a word over and over, up to the length limit) push
    activations far past what sentences do, and static int8 scales must cover them.
    """
    rng = np.random.default_rng(seed)
    words = " ".join(PROBE_TEXTS[:8] + PROBE_TEXTS[11:14]).split()
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
    spec: EncoderSpec, info: ModelInfo, module: torch.nn.Module, tokenizer: Tokenizer, device: torch.device, threads: int
) -> tuple[Backend, Calibration]:
    """Return (the winner's loaded backend, the calibration) after measuring every candidate here."""
    from models.encoder import TextEncoder, _request

    started = time.perf_counter()
    tried = budgets(spec, device)
    default = tried[len(tried) // 2]
    corpus = calibration_texts(tokenizer, info.max_seq_length, 2 * max(tried))
    reference = TextEncoder(
        info, tokenizer, load_backend("torch", _request(spec, info, module, "fp32", device, threads)), device, default
    )
    expected = _vectors(reference, corpus)
    loaded: dict[tuple[str, str, int], TextEncoder] = {}
    trials: list[Trial] = []
    encoders: list[tuple[Trial, TextEncoder]] = []
    for backend_name, precision in candidates(spec, device):
        trial = Trial(Mode(backend_name, precision, default), floor_for(precision, spec.float_floor, spec.int8_floor))
        trials.append(trial)
        encoder = _try_load(spec, info, module, tokenizer, device, threads, trial, reference)
        if encoder is not None:
            encoders.append((trial, encoder))
    _screen(encoders, calibration_texts(tokenizer, info.max_seq_length, default, seed=2))
    for trial, encoder in encoders:
        if trial.note:
            continue
        trial.fidelity = _combined_fidelity(reference, encoder, expected, corpus)
        if trial.meets_floor:
            loaded[_key(trial.mode)] = encoder
        else:
            trial.note = f"under floor {trial.floor}"
    _time_trials([t for t in trials if t.meets_floor], loaded, corpus, reference)
    finalists = sorted((t for t in trials if t.meets_floor), key=lambda t: -t.tokens_per_s)[:FINALISTS]

    def load(mode: Mode) -> TextEncoder:
        request = _request(spec, info, module, mode.precision, device, threads, tokenizer, mode.streams)
        return TextEncoder(info, tokenizer, load_backend(mode.backend, request), device, mode.token_budget)

    _load_streams(finalists, loaded, threads, load)
    lengths = [min(len(tokenizer.encode(text).ids), info.max_seq_length) for text in corpus]
    trials += _sweep(finalists, loaded, corpus, tried, reference, shape_multiples(lengths, spec.padding_floor))
    ok = [t for t in trials if t.meets_floor and t.tokens_per_s > 0]
    if not ok:
        raise BackendUnavailable("no candidate met its fidelity floor: " + "; ".join(f"{t.mode.label}: {t.note}" for t in trials))
    best = choose(ok)
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
    return winner.backend, calibration


def _screen(encoders: list[tuple[Trial, TextEncoder]], texts: list[str]) -> None:
    """Note as dropped each candidate whose tokens/s on one batch of texts is under 1/SCREEN of the fastest's.

    Its fidelity and timing passes over the corpus are skipped: on a CPU without VNNI or native bf16, torch
    int8 ran at 100 and emulated bf16 at 475 tokens/s against 4,000 for fp32, and their passes took 200 s.
    """
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


def _load_streams(
    finalists: list[Trial], loaded: dict[tuple[str, str, int], TextEncoder], threads: int, load: Callable[[Mode], TextEncoder]
) -> None:
    """Load each finalist of a multi-stream backend again with every stream count (its converted model is cached)."""
    for final in finalists:
        encoder = loaded.get(_key(final.mode))
        if encoder is None or not getattr(encoder.backend, "multi_stream", False):
            continue
        for streams in stream_counts(threads):
            mode = replace(final.mode, streams=streams)
            loaded[_key(mode)] = load(mode)


def _try_load(
    spec: EncoderSpec,
    info: ModelInfo,
    module: torch.nn.Module,
    tokenizer: Tokenizer,
    device: torch.device,
    threads: int,
    trial: Trial,
    reference: TextEncoder,
) -> TextEncoder | None:
    """Return the candidate's encoder (the reference itself for torch fp32), or None with the reason noted."""
    from models.encoder import TextEncoder, _request

    mode = trial.mode
    if (mode.backend, mode.precision) == ("torch", "fp32"):
        return reference
    reason = unavailable_reason(mode.backend, mode.precision, device)
    if reason:
        trial.note = f"skipped: {reason}"
        return None
    try:
        backend = load_backend(mode.backend, _request(spec, info, module, mode.precision, device, threads, tokenizer))
    except (BackendUnavailable, RuntimeError, ValueError) as exc:  # a runtime that cannot take this model
        trial.note = f"skipped: {type(exc).__name__}: {str(exc)[:160]}"
        return None
    return TextEncoder(info, tokenizer, backend, device, mode.token_budget)


def _vectors(encoder: TextEncoder, corpus: list[str]) -> np.ndarray:
    from models.engine import encode_texts

    return encode_texts(encoder, corpus, encoder.token_budget)[0]


def _combined_fidelity(reference: TextEncoder, encoder: TextEncoder, expected: np.ndarray, corpus: list[str]) -> Fidelity:
    """Return fidelity over the probe texts (one per batch) and the corpus (planned batches) together."""
    from models.encoder import probe_fidelity

    probes = probe_fidelity(reference, encoder)
    planned = fidelity(expected, _vectors(encoder, corpus))
    return Fidelity(min(probes.min, planned.min), min(probes.p1, planned.p1), (probes.mean + planned.mean) / 2)


def _throughput(encoder: TextEncoder, corpus: list[str], mode: Mode) -> tuple[float, float]:
    """Return (real tokens/s, padding efficiency) of one pass of the corpus through the engine in mode."""
    from models.engine import encode_texts

    encoder.backend.length_multiple = mode.length_multiple
    try:
        _, stats = encode_texts(encoder, corpus, mode.token_budget)
    finally:
        encoder.backend.length_multiple = 1
    return stats.real_tokens / max(stats.seconds, 1e-9), stats.padding_efficiency


def _time_trials(
    trials: list[Trial], loaded: dict[tuple[str, str, int], TextEncoder], corpus: list[str], reference: TextEncoder
) -> None:
    """Set each trial's best-of-REPEATS throughput, modes interleaved so that machine noise hits all alike."""
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
