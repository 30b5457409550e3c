"""Small randomly initialised sentence-transformers models of several architectures, saved to a folder."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from models.encoder.files import model_dir

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from models.encoder.backends.base import BackendRequest
    from models.encoder.backends.openvino_int8.search import Validation

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


@dataclass(frozen=True)
class Arch:
    """One test architecture: transformers config class, width, pooling mode, normalisation, max length."""

    name: str
    config: str
    width: int
    pooling: str
    normalize: bool
    max_seq_length: int = 128


ARCHS = [
    Arch("bert-mean", "BertConfig", 64, "mean", True),
    Arch("distilbert-cls", "DistilBertConfig", 48, "cls", False),
    Arch("mpnet-max", "MPNetConfig", 96, "max", True),
    Arch("roberta-mean", "RobertaConfig", 80, "mean", False, 96),
]


def _config(arch: Arch) -> PretrainedConfig:
    import transformers

    cls = getattr(transformers, arch.config)
    common = {"vocab_size": 30522, "pad_token_id": 0}
    if arch.config == "DistilBertConfig":
        return cls(dim=arch.width, n_layers=2, n_heads=4, hidden_dim=arch.width * 2, max_position_embeddings=512, **common)
    positions = 514 if arch.config in ("RobertaConfig", "MPNetConfig") else 512
    return cls(
        hidden_size=arch.width,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=arch.width * 2,
        max_position_embeddings=positions,
        **common,
    )


def save_random_model(arch: Arch, folder: Path, seed: int = 0) -> Path:
    """Write a random model of arch in sentence-transformers layout under folder/arch.name and return the path."""
    import transformers

    path = folder / arch.name
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = transformers.AutoModel.from_config(_config(arch))
    with torch.no_grad():  # widen the random weights a little so layers (not just embeddings) shape the output
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    model.save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(model_dir() / name, path / name)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if arch.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (path / "2_Normalize").mkdir(exist_ok=True)
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": arch.width,
                "pooling_mode_cls_token": arch.pooling == "cls",
                "pooling_mode_mean_tokens": arch.pooling == "mean",
                "pooling_mode_max_tokens": arch.pooling == "max",
                "pooling_mode_mean_sqrt_len_tokens": False,
            }
        )
    )
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": arch.max_seq_length, "do_lower_case": False}))
    return path


def int8_request(folder: Path, floor: float = 0.99) -> BackendRequest:
    """Return the int8 BackendRequest of the model in folder on 2 CPU threads (its calibration and validation batches)."""
    from models.encoder.files import load_module, load_tokenizer, model_info
    from models.encoder.loader import backend_request
    from models.encoder.spec import EncoderSpec

    spec = EncoderSpec(device="cpu", model_path=str(folder), int8_floor=floor)
    info = model_info(spec)
    return backend_request(spec, info, load_module(info), "int8", torch.device("cpu"), 2, load_tokenizer(str(info.path)))


SEARCH_CALIBRATION_TEXTS, SEARCH_VALIDATION_TEXTS = 40, 24  # the int8 search's logic tests take these many


def int8_search_inputs(
    folder: Path, calibration_texts: int = SEARCH_CALIBRATION_TEXTS, validation_texts: int = SEARCH_VALIDATION_TEXTS
) -> tuple[Any, list[dict[str, np.ndarray]], Validation, dict[str, object]]:
    """Return (float IR, calibration batches, validation, f32 config on 2 threads) of the int8 search on folder's model.

    The search's tests check its logic, not MiniLM's fidelity: they take evenly spaced subsets of the product's
    calibration and validation texts (164 and 100 on a random BERT), which cut a search's 22 s to about 14 s on 2 cores.
    """
    from models.encoder.backends.openvino_backend import _validation, convert
    from models.encoder.backends.openvino_int8.search import Validation

    request = int8_request(folder)
    full = _validation(request)
    rows = spaced(len(full.batches), validation_texts)
    validation = Validation([full.batches[i] for i in rows], full.expected[rows], full.pooling, full.normalize)
    config: dict[str, object] = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 2}
    return convert(request.module), search_calibration(request, calibration_texts), validation, config


def search_calibration(request: BackendRequest, count: int = SEARCH_CALIBRATION_TEXTS) -> list[dict[str, np.ndarray]]:
    """Return `count` evenly spaced batches of the request's int8 calibration corpus, as OpenVINO inputs."""
    batches = request.sample_batches
    return [{"input_ids": batches[i][0].numpy(), "attention_mask": batches[i][1].numpy()} for i in spaced(len(batches), count)]


def spaced(total: int, count: int) -> np.ndarray:
    """Return min(count, total) evenly spaced indices of range(total), first and last included."""
    return np.unique(np.linspace(0, total - 1, min(count, total)).round().astype(int))
