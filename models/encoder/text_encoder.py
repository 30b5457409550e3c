"""The text encoder: a tokenizer and one loaded backend, embedding token-id batches into pooled float32 vectors."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext

import numpy as np
import torch
from tokenizers import Tokenizer

from models.encoder.backends.base import Backend
from models.encoder.files import pad_id
from models.encoder.pooling import pool
from models.encoder.precision import (
    PROBE_TEXTS,
    Fidelity,
    fidelity,
)
from models.encoder.spec import Calibration, Mode
from models.encoder.st_layout import ModelInfo


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


def probe_fidelity(reference: TextEncoder, candidate: TextEncoder) -> Fidelity:
    """Return the cosine statistics of candidate to reference over the probe texts, one text per batch.

    One text per batch: no padding, so a short text's vector is what it is in any batch plan.
    """
    ref = np.vstack([reference.embed_texts([t]) for t in PROBE_TEXTS])
    got = np.vstack([candidate.embed_texts([t]) for t in PROBE_TEXTS])
    return fidelity(ref, got)
