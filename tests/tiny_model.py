"""The tiny random encoder of the fast test tiers: a 1-layer BERT of MiniLM's width and tokenizer, written as a model folder.

Production knows one kind of model, a folder in sentence-transformers layout (NIGHTSCORE_MODEL); the tests give it
this one. Its weights come from a fixed seed, so every process that writes it writes the same bytes (and the
same vector version, ``tiny-bert-random@<digest>``). Runs on it pin torch fp32: nothing to calibrate.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock

if TYPE_CHECKING:
    from models.encoder.spec import EncoderSpec

NAME = "tiny-bert-random"
SEED = 0
FOLDER: list[Path] = []  # the session's folder, once tests/conftest.py's session fixture wrote it


def write_tiny_model(folder: Path, layers: int = 1, seed: int = SEED) -> Path:
    """Return folder after writing the tiny model into it (config, seeded weights, MiniLM's tokenizer) unless present.

    ``layers`` and ``seed`` make its larger twin (tests of the cascade): the same width and tokenizer, more layers.
    """
    with FileLock(str(folder.parent / f"{folder.name}.lock")):
        if (folder / "model.safetensors").is_file():
            return folder
        import torch
        import transformers

        from models.encoder.files import model_dir

        config = transformers.BertConfig(
            hidden_size=384,
            num_hidden_layers=layers,
            num_attention_heads=6,
            intermediate_size=384,
            vocab_size=30522,
            max_position_embeddings=512,
        )
        torch.manual_seed(seed)
        model = transformers.BertModel(config, add_pooling_layer=False).eval()
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(str(partial), safe_serialization=True)
        shutil.copy(model_dir() / "tokenizer.json", partial / "tokenizer.json")
        partial.rename(folder)
    return folder


def tiny_folder() -> Path:
    """Return the session's tiny model folder (written by the session fixture before any test runs)."""
    if not FOLDER:
        raise RuntimeError("the tiny model is written by the tiny_model session fixture (tests/conftest.py)")
    return FOLDER[0]


def tiny_environment() -> dict[str, str]:
    """Return the NIGHTSCORE_ variables of a run on the tiny model: its folder, torch fp32 pinned."""
    return {"NIGHTSCORE_MODEL": str(tiny_folder()), "NIGHTSCORE_BACKEND": "torch", "NIGHTSCORE_PRECISION": "fp32"}


def tiny_spec(**fields: object) -> EncoderSpec:
    """Return an EncoderSpec of the tiny model (torch fp32 unless fields say otherwise)."""
    from models.encoder.spec import EncoderSpec

    return EncoderSpec(**{"model_path": str(tiny_folder()), "backend": "torch", "precision": "fp32", **fields})  # type: ignore[arg-type]
