"""Loading an encoder from its spec: the pinned mode checked against its floor, or auto's calibrated one; one per process."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path

import torch
from tokenizers import Tokenizer

from core.errors import UsageError
from models.encoder.backends.base import BackendRequest, BackendUnavailable
from models.encoder.backends.openvino_int8.search import QuantizationFailed
from models.encoder.backends.registry import load_backend
from models.encoder.calibration import Calibration, run_calibration
from models.encoder.calibration_store import _persist, _read_persisted, calibration_file
from models.encoder.device import configure_threads, default_token_budget, resolve_device
from models.encoder.files import load_module, load_tokenizer, model_info
from models.encoder.precision import (
    PROBE_TEXTS,
    Fidelity,
    FidelityRefused,
    floor_for,
    require_floor,
)
from models.encoder.spec import EncoderSpec, Mode
from models.encoder.st_layout import ModelInfo
from models.encoder.text_encoder import TextEncoder, probe_fidelity, vector_version

log = logging.getLogger(__name__)


# auto's int8 candidates must beat float by this much before a backend searches for its float layers: a
# faithful int8 keeps some layers float, so an all-int8 model only this fast cannot win the calibration
INT8_MIN_SPEEDUP = 1.05


def _fixed_default(device: torch.device) -> tuple[str, str]:
    """Return (backend, precision) of auto when it does not calibrate: torch fp32 on CPU, bf16/fp16 on CUDA."""
    if device.type != "cuda":
        return "torch", "fp32"
    return "torch", "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def _calibrates(spec: EncoderSpec) -> bool:
    """Return whether a spec's mode is chosen by measurement (auto somewhere, a cache folder, not the tiny twin)."""
    return "auto" in (spec.backend, spec.precision) and spec.cache_dir is not None and spec.kind != "tiny"


def _pinned(spec: EncoderSpec, device: torch.device) -> tuple[str, str]:
    """Return the (backend, precision) of a spec that does not calibrate, autos replaced by the fixed default."""
    backend, precision = _fixed_default(device)
    return (backend if spec.backend == "auto" else spec.backend), (precision if spec.precision == "auto" else spec.precision)


def _request(
    spec: EncoderSpec,
    info: ModelInfo,
    module: torch.nn.Module,
    precision: str,
    device: torch.device,
    threads: int,
    tokenizer: Tokenizer | None = None,
    streams: int = 1,
) -> BackendRequest:
    int8 = precision == "int8" and tokenizer is not None
    return BackendRequest(
        info=info,
        module=module,
        precision=precision,
        device=device,
        threads=threads,
        cache_dir=Path(spec.cache_dir) if spec.cache_dir else None,
        sample_batches=_sample_batches(tokenizer, info) if int8 and tokenizer else (),
        validation_batches=_sample_batches(tokenizer, info, seed=1, tokens=3000) if int8 and tokenizer else (),
        int8_floor=spec.int8_floor,
        int8_min_speedup=INT8_MIN_SPEEDUP if int8 and spec.precision == "auto" else 0.0,
        refuse_slow_kernels=spec.precision == "auto",
        streams=streams,
    )


def _sample_batches(
    tokenizer: Tokenizer, info: ModelInfo, seed: int = 0, tokens: int = 6000
) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """Return one unpadded batch per text of a calibration corpus (seed) and the probes (int8 statistics, verdicts)."""
    from models.encoder.calibration import calibration_texts

    limit = info.max_seq_length
    batches = []
    for text in [*calibration_texts(tokenizer, limit, tokens, seed), *PROBE_TEXTS]:
        ids = tokenizer.encode(text).ids
        ids = ids if len(ids) <= limit else ids[: limit - 1] + ids[-1:]
        batches.append((torch.tensor([ids], dtype=torch.long), torch.ones(1, len(ids), dtype=torch.long)))
    return tuple(batches)


def load_encoder(spec: EncoderSpec) -> TextEncoder:
    """Return a loaded encoder: the calibrated mode under auto (when it can persist it), else the pinned one.

    A pinned mode other than torch fp32 is checked against torch fp32 on the probe texts and refused
    (FidelityRefused, naming floor and cosine) when under its floor.
    """
    started = time.perf_counter()
    threads = configure_threads(spec.num_threads)
    device = resolve_device(spec.device)
    info = model_info(spec)
    module = load_module(spec, info).to(device)
    tokenizer = load_tokenizer(info.max_seq_length, None if spec.kind == "tiny" else str(info.path))
    if _calibrates(spec):
        from models.encoder.loader import calibrate_or_load

        encoder = calibrate_or_load(spec, info, module, tokenizer, device, threads)
    else:
        encoder = _load_pinned(spec, info, module, tokenizer, device, threads)
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


def _load_pinned(
    spec: EncoderSpec, info: ModelInfo, module: torch.nn.Module, tokenizer: Tokenizer, device: torch.device, threads: int
) -> TextEncoder:
    backend_name, precision = _pinned(spec, device)
    budget = spec.token_budget or default_token_budget(device)
    try:
        backend = load_backend(backend_name, _request(spec, info, module, precision, device, threads, tokenizer, spec.streams))
    except QuantizationFailed as exc:  # a backend that quantises against the floor itself (OpenVINO int8)
        raise FidelityRefused(f"mode {backend_name}/{precision} refused: {exc}") from exc
    except BackendUnavailable as exc:
        raise UsageError(f"backend {backend_name} precision {precision} cannot run here: {exc}") from exc
    backend.length_multiple = spec.length_multiple
    encoder = TextEncoder(info, tokenizer, backend, device, budget)
    if (backend_name, precision) != ("torch", "fp32"):
        reference = TextEncoder(
            info, tokenizer, load_backend("torch", _request(spec, info, module, "fp32", device, threads)), device, budget
        )
        encoder.fidelity = probe_fidelity(reference, encoder)
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
    if not _calibrates(spec):
        backend, precision = _pinned(spec, device)
        return vector_version(info, Mode(backend, precision, 0, 1))
    from models.encoder.calibration_store import persisted_mode

    mode = None if spec.recalibrate else persisted_mode(spec, info, device, configure_threads(spec.num_threads))
    if mode is not None and spec not in _CACHE:
        return vector_version(info, mode)
    return get_encoder(spec).version


def calibration_summary(spec: EncoderSpec) -> dict[str, object] | None:
    """Return the persisted calibration of an auto spec on this kind of machine (device kind, tokens/s, file), or None."""
    if not _calibrates(spec):
        return None
    from models.encoder.calibration_store import calibration_file, persisted_summary

    device, threads, info = resolve_device(spec.device), configure_threads(spec.num_threads), model_info(spec)
    loaded = _CACHE.get(spec)
    summary = (
        loaded.calibration.summary()
        if loaded is not None and loaded.calibration is not None
        else persisted_summary(spec, info, device, threads)
    )  # measured in this process, or read from a previous one
    return None if summary is None else {**summary, "calibration_file": str(calibration_file(spec, info, device, threads))}


def resolve_spec(spec: EncoderSpec) -> EncoderSpec:
    """Return the spec with auto's choice pinned (backend, precision, token budget, length multiple).

    Call it once where the run is planned and hand the result to every shard worker: a worker then loads
    exactly the planned mode (same vector version) whatever its own cache folder holds, and never calibrates.
    A spec that does not calibrate comes back with its autos replaced by the fixed default.
    """
    device = resolve_device(spec.device)
    if not _calibrates(spec):
        backend, precision = _pinned(spec, device)
        return replace(spec, backend=backend, precision=precision)
    from models.encoder.calibration_store import persisted_mode

    mode = None if spec.recalibrate else persisted_mode(spec, model_info(spec), device, configure_threads(spec.num_threads))
    if mode is None or spec in _CACHE:
        mode = get_encoder(spec).mode
    return replace(
        spec,
        backend=mode.backend,
        precision=mode.precision,
        token_budget=mode.token_budget,
        length_multiple=mode.length_multiple,
        streams=mode.streams,
        recalibrate=False,
    )


def calibrate_or_load(
    spec: EncoderSpec, info: ModelInfo, module: torch.nn.Module, tokenizer: Tokenizer, device: torch.device, threads: int
) -> TextEncoder:
    """Return the encoder in the mode auto chooses: the persisted one when valid, else measured now and persisted."""
    from models.encoder.loader import _request
    from models.encoder.text_encoder import TextEncoder

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
