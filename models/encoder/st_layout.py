"""A sentence-transformers model folder read without loading weights: pooling, normalisation, length, width, digest."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from core.errors import ModelLoadError

POOLING_MODES = ("mean", "cls", "max")
# Files whose bytes decide the vectors: the content digest covers exactly these (those present).
DIGEST_FILES = ("config.json", "tokenizer.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# ST module types the engine reproduces; anything else (Dense, LayerNorm, ...) is refused, not silently skipped.
KNOWN_MODULES = {"Transformer", "Pooling", "Normalize"}


@dataclass(frozen=True)
class ModelInfo:
    """What the engine needs to know about a model folder before (and apart from) loading its weights."""

    path: Path
    name: str
    model_type: str
    dim: int
    pooling: str
    normalize: bool
    max_seq_length: int
    digest: str

    @property
    def version(self) -> str:
        """Return name@content-digest: the model part of every vector version."""
        return f"{self.name}@{self.digest}"


def read_model_info(path: Path, name: str | None = None, max_seq_length: int | None = None) -> ModelInfo:
    """Return the ModelInfo of an ST-layout folder (or a bare transformers folder: mean pooling, normalised).

    Args:
        path: the folder (config.json, tokenizer.json, weights; modules.json and 1_Pooling/ when ST layout).
        name: the model's name in versions (default: the folder name).
        max_seq_length: a cap on the model's own max_seq_length (the settings' value), never a raise above it.
    """
    config = _read_json(path / "config.json", required=True)
    if not (path / "tokenizer.json").is_file():
        raise ModelLoadError(f"{path} has no tokenizer.json (a fast tokenizer is required)")
    if not any((path / w).is_file() for w in WEIGHT_FILES):
        raise ModelLoadError(f"{path} has no weights ({' or '.join(WEIGHT_FILES)})")
    pooling, normalize = _pooling_and_norm(path)
    own = _own_max_length(path, config)
    return ModelInfo(
        path=path,
        name=name or path.name,
        model_type=str(config.get("model_type", "unknown")),
        dim=_width(config, path),
        pooling=pooling,
        normalize=normalize,
        max_seq_length=min(own, max_seq_length) if max_seq_length else own,
        digest=content_digest(path),
    )


def content_digest(path: Path) -> str:
    """Return the first 12 hex digits of sha256 over the weights and every config file that shapes the vectors."""
    digest = hashlib.sha256()
    for rel in (*DIGEST_FILES, *WEIGHT_FILES):
        file = path / rel
        if file.is_file():
            digest.update(rel.encode() + b"\0")
            with file.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:12]


def _read_json(file: Path, required: bool = False) -> dict:
    if not file.is_file():
        if required:
            raise ModelLoadError(f"no model files under {file.parent} ({file.name} missing)")
        return {}
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{file} is not valid JSON: {exc}") from exc


def _width(config: dict, path: Path) -> int:
    for key in ("hidden_size", "dim", "d_model"):
        if isinstance(config.get(key), int):
            return int(config[key])
    raise ModelLoadError(f"{path}/config.json names no hidden size (hidden_size, dim or d_model)")


def _pooling_and_norm(path: Path) -> tuple[str, bool]:
    """Return (pooling mode, normalise?) from modules.json and the Pooling module's config."""
    modules = _read_json(path / "modules.json")
    if not modules:
        return "mean", True  # a bare transformers folder: the engine's historical mean + L2
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules}
    unknown = set(kinds) - KNOWN_MODULES
    if unknown:
        raise ModelLoadError(f"{path}: sentence-transformers modules {sorted(unknown)} are not supported by the engine")
    if "Transformer" in kinds and kinds["Transformer"].get("path", "") not in ("", "."):
        raise ModelLoadError(f"{path}: the Transformer module must sit at the folder root")
    pooling_cfg = _read_json(path / kinds["Pooling"]["path"] / "config.json") if "Pooling" in kinds else {}
    return _pooling_mode(pooling_cfg, path), "Normalize" in kinds


def _pooling_mode(cfg: dict, path: Path) -> str:
    if not cfg:
        return "mean"
    if "pooling_mode" in cfg:
        mode = str(cfg["pooling_mode"]).replace("_tokens", "").replace("_token", "")
    else:
        chosen = [
            m
            for m, key in (
                ("mean", "pooling_mode_mean_tokens"),
                ("cls", "pooling_mode_cls_token"),
                ("max", "pooling_mode_max_tokens"),
            )
            if cfg.get(key)
        ]
        others = [
            k
            for k, v in cfg.items()
            if k.startswith("pooling_mode_")
            and v
            and k not in ("pooling_mode_mean_tokens", "pooling_mode_cls_token", "pooling_mode_max_tokens")
        ]
        if len(chosen) != 1 or others:
            raise ModelLoadError(f"{path}: pooling {chosen + others} is not supported (one of mean, cls, max)")
        mode = chosen[0]
    if mode not in POOLING_MODES:
        raise ModelLoadError(f"{path}: pooling mode {mode!r} is not supported (one of {', '.join(POOLING_MODES)})")
    return mode


def _own_max_length(path: Path, config: dict) -> int:
    """Return the model's max_seq_length: sentence_bert_config.json, else the tokenizer's, capped by positions."""
    st = _read_json(path / "sentence_bert_config.json")
    tok = _read_json(path / "tokenizer_config.json")
    positions = int(config.get("max_position_embeddings", 512))
    if config.get("model_type") in ("roberta", "xlm-roberta", "camembert", "mpnet"):
        positions -= 2  # their position ids start after the padding index
    own = st.get("max_seq_length") or tok.get("model_max_length") or positions
    return int(min(int(own), positions))
