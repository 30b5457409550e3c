"""Loading an encoder from its spec: a pinned mode checked against its floor, or auto's calibrated one; one per process.

The top of the engine: it builds the backend requests (`backend_request`) and hands the calibration a
``load(mode)`` callable, so the calibration never imports the loader back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer

from core.errors import UsageError
from models.encoder.backends.base import BackendRequest, BackendUnavailable
from models.encoder.backends.openvino_int8.search import QuantizationFailed
from models.encoder.backends.registry import load_backend
from models.encoder.calibration import calibration_texts, limit_repeats, run_calibration
from models.encoder.calibration_store import calibration_file, persist, read_persisted
from models.encoder.device import configure_threads, default_token_budget, resolve_device, tokenizer_threads
from models.encoder.engine import encode_texts, warm_up
from models.encoder.files import load_module, load_tokenizer, model_info
from models.encoder.precision import PROBE_TEXTS, FidelityRefused, floor_for, require_floor
from models.encoder.spec import Calibration, EncoderSpec, Mode
from models.encoder.st_layout import ModelInfo
from models.encoder.text_encoder import TextEncoder, probe_fidelity, vector_version

log = logging.getLogger(__name__)

# auto's int8 candidates must beat float by this much before a backend searches for its float layers: a
# faithful int8 keeps some layers float, so an all-int8 model only this fast cannot win the calibration
INT8_MIN_SPEEDUP = 1.05
LIMIT_REPEATS = 3  # texts of one word repeated past the length limit in each int8 corpus (statistics, verdict)

Loader = Callable[[Mode], TextEncoder]


def fixed_default(device: torch.device) -> tuple[str, str]:
    """Return (backend, precision) of auto when it does not calibrate: torch fp32 on CPU, bf16/fp16 on CUDA."""
    if device.type != "cuda":
        return "torch", "fp32"
    return "torch", "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def calibrates(spec: EncoderSpec) -> bool:
    """Return whether a spec's mode is chosen by measurement (auto somewhere, and a cache folder to keep the choice)."""
    return "auto" in (spec.backend, spec.precision) and spec.cache_dir is not None


def pinned_pair(spec: EncoderSpec, device: torch.device) -> tuple[str, str]:
    """Return the (backend, precision) of a spec that does not calibrate, autos replaced by the fixed default."""
    backend, precision = fixed_default(device)
    return (backend if spec.backend == "auto" else spec.backend), (precision if spec.precision == "auto" else spec.precision)


def backend_request(
    spec: EncoderSpec,
    info: ModelInfo,
    module: torch.nn.Module,
    precision: str,
    device: torch.device,
    threads: int,
    tokenizer: Tokenizer | None = None,
    streams: int = 1,
) -> BackendRequest:
    """Return what a backend needs to load the model in a precision (int8: the sample and validation batches too)."""
    int8 = precision == "int8" and tokenizer is not None
    return BackendRequest(
        info=info,
        module=module,
        precision=precision,
        device=device,
        threads=threads,
        cache_dir=Path(spec.cache_dir) if spec.cache_dir else None,
        sample_batches=sample_batches(tokenizer, info) if int8 and tokenizer else (),
        validation_batches=sample_batches(tokenizer, info, seed=1, tokens=3000) if int8 and tokenizer else (),
        int8_floor=spec.int8_floor,
        int8_min_speedup=INT8_MIN_SPEEDUP if int8 and spec.precision == "auto" else 0.0,
        refuse_slow_kernels=spec.precision == "auto",
        streams=streams,
        compile_mode=spec.compile_mode,
    )


def sample_batches(
    tokenizer: Tokenizer, info: ModelInfo, seed: int = 0, tokens: int = 6000
) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """Return one unpadded batch per text of a calibration corpus (seed), words repeated to the limit and the probes
    (int8 statistics, verdicts)."""
    limit = info.max_seq_length
    batches = []
    for text in [*calibration_texts(tokenizer, limit, tokens, seed), *limit_repeats(limit, LIMIT_REPEATS, seed), *PROBE_TEXTS]:
        ids = tokenizer.encode(text).ids
        ids = ids if len(ids) <= limit else ids[: limit - 1] + ids[-1:]
        batches.append((torch.tensor([ids], dtype=torch.long), torch.ones(1, len(ids), dtype=torch.long)))
    return tuple(batches)


def mode_loader(
    spec: EncoderSpec, info: ModelInfo, module: torch.nn.Module, tokenizer: Tokenizer, device: torch.device, threads: int
) -> Loader:
    """Return load(mode): the model's encoder in that mode (backend, precision, streams, budget, length multiple)."""

    def load(mode: Mode) -> TextEncoder:
        request = backend_request(spec, info, module, mode.precision, device, threads, tokenizer, mode.streams)
        backend = load_backend(mode.backend, request)
        backend.length_multiple = mode.length_multiple
        threads_here = tokenizer_threads(spec.tokenizer_threads, device)
        return TextEncoder(info, tokenizer, backend, device, mode.token_budget, tokenizer_threads=threads_here)

    return load


def load_encoder(spec: EncoderSpec) -> TextEncoder:
    """Return a loaded encoder: the calibrated mode under auto (when it can persist it), else the pinned one.

    A pinned mode other than torch fp32 is checked against torch fp32 on the probe texts and refused
    (FidelityRefused, naming floor and cosine) when under its floor.
    """
    started = time.perf_counter()
    threads = configure_threads(spec.num_threads)
    device = resolve_device(spec.device)
    info = model_info(spec)
    module = load_module(info).to(device)
    tokenizer = load_tokenizer(str(info.path))
    load = mode_loader(spec, info, module, tokenizer, device, threads)
    if calibrates(spec):
        encoder = calibrated(spec, info, tokenizer, device, threads, load)
    else:
        encoder = load_pinned(spec, device, load)
    encoder.load_seconds = time.perf_counter() - started
    log.info(
        "loaded %s on %s as %s in %.2fs (fidelity min %.5f)",
        encoder.version,
        device,
        encoder.backend.version,
        encoder.load_seconds,
        encoder.fidelity.min,
    )
    return encoder


def calibrated(
    spec: EncoderSpec, info: ModelInfo, tokenizer: Tokenizer, device: torch.device, threads: int, load: Loader
) -> TextEncoder:
    """Return the encoder in the mode auto chooses: the persisted one when valid, else measured now and persisted."""
    calibration = None if spec.recalibrate else read_persisted(spec, info, device, threads)
    if calibration is not None:
        encoder = load(calibration.mode)
        file = calibration_file(spec, info, device, threads)
        log.info("auto: %s from the persisted calibration (%s)", calibration.mode.label, file)
    else:
        encoder, calibration = run_calibration(spec, info, tokenizer, device, threads, load)
        persist(spec, info, device, threads, calibration)
    encoder.calibration, encoder.fidelity = calibration, calibration.fidelity
    encoder.token_budget = calibration.mode.token_budget
    return encoder


def load_pinned(spec: EncoderSpec, device: torch.device, load: Loader) -> TextEncoder:
    """Return the encoder in the spec's pinned mode, refused when under its fidelity floor against torch fp32."""
    backend_name, precision = pinned_pair(spec, device)
    budget = spec.token_budget or default_token_budget(device)
    try:
        encoder = load(Mode(backend_name, precision, budget, spec.length_multiple, spec.streams))
    except QuantizationFailed as exc:  # a backend that quantises against the floor itself (OpenVINO int8)
        raise FidelityRefused(f"mode {backend_name}/{precision} refused: {exc}") from exc
    except BackendUnavailable as exc:
        raise UsageError(f"backend {backend_name} precision {precision} cannot run here: {exc}") from exc
    if (backend_name, precision) != ("torch", "fp32"):
        encoder.fidelity = probe_fidelity(load(Mode("torch", "fp32", budget)), encoder)
        require_floor(f"{backend_name}/{precision}", encoder.fidelity, floor_for(precision, spec.float_floor, spec.int8_floor))
    return encoder


_CACHE: dict[EncoderSpec, TextEncoder] = {}
_CACHE_LOCK = threading.Lock()


def get_encoder(spec: EncoderSpec) -> TextEncoder:
    """Return this process's encoder for spec, loading it (and calibrating auto) on first use only."""
    with _CACHE_LOCK:
        if spec not in _CACHE:
            _CACHE[spec] = load_encoder(spec)
        return _CACHE[spec]


def spec_version(spec: EncoderSpec) -> str:
    """Return the version of the vectors a spec produces.

    Pinned modes and auto without a cache folder need no weights; a calibrating auto reads its persisted
    choice, and only when there is none calibrates (through get_encoder, so the encode step reuses it).
    """
    device = resolve_device(spec.device)
    info = model_info(spec)
    if not calibrates(spec):
        backend, precision = pinned_pair(spec, device)
        return vector_version(info, Mode(backend, precision, 0, 1))
    stored = None if spec.recalibrate else read_persisted(spec, info, device, configure_threads(spec.num_threads))
    if stored is not None and spec not in _CACHE:
        return vector_version(info, stored.mode)
    return get_encoder(spec).version


def calibration_summary(spec: EncoderSpec) -> dict[str, object] | None:
    """Return the calibration of an auto spec on this kind of machine (device kind, tokens/s, file), or None."""
    if not calibrates(spec):
        return None
    device, threads, info = resolve_device(spec.device), configure_threads(spec.num_threads), model_info(spec)
    loaded = _CACHE.get(spec)
    calibration: Calibration | None = loaded.calibration if loaded is not None else None
    calibration = calibration or read_persisted(spec, info, device, threads)  # measured here, or by an earlier process
    if calibration is None:
        return None
    return {**calibration.summary(), "calibration_file": str(calibration_file(spec, info, device, threads))}


@dataclass(frozen=True)
class ModeChoice:
    """The mode a run encodes in, and how it was chosen: pinned, calibrated now, persisted, or the default."""

    mode: Mode
    how: str  # pinned | calibrated | persisted | default
    note: str = ""


def choose_mode(spec: EncoderSpec, expected_tokens: int | None = None) -> ModeChoice:
    """Return the mode a spec runs in and how it was chosen, every field pinned.

    Under auto: the persisted calibration of this machine kind; else, when ``expected_tokens`` would encode in under
    ``spec.calibrate_when_encode_s`` seconds in the default mode (timed on one batch), the default mode, so that a
    short run never waits minutes for a calibration; else a calibration now (then persisted). Call it once where the
    run is planned and hand ``spec.pinned(choice.mode)`` to every shard worker: a worker then loads exactly the
    planned mode whatever its own cache folder holds, and never calibrates.
    """
    device = resolve_device(spec.device)
    if not calibrates(spec):
        backend, precision = pinned_pair(spec, device)
        budget = spec.token_budget or default_token_budget(device)
        return ModeChoice(Mode(backend, precision, budget, spec.length_multiple, spec.streams), "pinned")
    stored = None if spec.recalibrate else read_persisted(spec, model_info(spec), device, configure_threads(spec.num_threads))
    if spec in _CACHE:
        calibration = _CACHE[spec].calibration
        return ModeChoice(_CACHE[spec].mode, "persisted" if calibration and calibration.from_cache else "calibrated")
    if stored is not None:
        return ModeChoice(stored.mode, "persisted")
    seconds = None if expected_tokens is None else expected_encode_seconds(spec, device, expected_tokens)
    if seconds is not None and seconds < spec.calibrate_when_encode_s:
        note = f"not calibrated: ~{seconds:.0f} s of encoding does not pay for a calibration (`nightscore calibrate`)"
        log.info("auto: default mode, %s", note)
        return ModeChoice(default_mode(spec, device), "default", note)
    return ModeChoice(get_encoder(spec).mode, "calibrated")


def default_mode(spec: EncoderSpec, device: torch.device) -> Mode:
    """Return auto's mode where it does not calibrate: the fixed default backend and precision, the device's budget."""
    backend, precision = fixed_default(device)
    return Mode(backend, precision, spec.token_budget or default_token_budget(device))


def expected_encode_seconds(spec: EncoderSpec, device: torch.device, tokens: int) -> float:
    """Return how long tokens would take to encode in the default mode, timed on one batch of the calibration corpus."""
    if tokens <= 0:
        return 0.0
    encoder = get_encoder(spec.pinned(default_mode(spec, device)))  # the run reuses it when it encodes in this mode
    texts = calibration_texts(encoder.tokenizer, encoder.max_length, encoder.token_budget)
    warm_up(encoder, texts)  # every batch shape once: first-use costs are not the run's rate
    _, stats = encode_texts(encoder, texts)
    return tokens / max(stats.real_tokens / max(stats.seconds, 1e-9), 1e-9)


def resolve_mode(spec: EncoderSpec) -> Mode:
    """Return the mode a spec runs in: auto's choice (persisted, else measured now), or the pinned one, all pinned."""
    return choose_mode(spec).mode


def calibrate_machine(spec: EncoderSpec, again: bool = False) -> tuple[Calibration, Path]:
    """Return this machine kind's calibration of the spec's model and its file: the persisted one, else (or when
    ``again``) measured now and persisted. UsageError when the spec pins its mode (nothing to choose)."""
    if not calibrates(spec):
        raise UsageError("the encoder's mode is pinned (NIGHTSCORE_BACKEND / NIGHTSCORE_PRECISION): nothing to calibrate")
    encoder = get_encoder(replace(spec, recalibrate=again))
    assert encoder.calibration is not None  # a calibrating spec always carries its calibration
    device, threads = resolve_device(spec.device), configure_threads(spec.num_threads)
    return encoder.calibration, calibration_file(spec, model_info(spec), device, threads)
