"""The text encoder: a tokenizer and one loaded backend, embedding token-id batches into pooled float32 vectors.

A batch is padded (input_ids, attention_mask) for most backends, or packed (`PackedBatch`: tokens back to back,
no padding) for a backend that says `packed`; `collate_rows` builds the one its backend takes.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext

import numpy as np
import torch
from tokenizers import Tokenizer

from models.encoder.backends.base import Backend
from models.encoder.files import pad_id
from models.encoder.phases import NO_TIMER, PhaseTimer
from models.encoder.pooling import pool_numpy, pool_packed, pool_tensor
from models.encoder.precision import (
    PROBE_TEXTS,
    Fidelity,
    fidelity,
)
from models.encoder.spec import Calibration, Mode
from models.encoder.st_layout import ModelInfo
from models.encoder.tokens import PackedBatch, TokenizedTexts, TokenizerPool, pack_rows, pad_rows

Batch = tuple[torch.Tensor, torch.Tensor] | PackedBatch  # padded (input_ids, attention_mask), or packed


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
        tokenizer_threads: int = 1,
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
        self.tokenizers = TokenizerPool(tokenizer, self.max_length, tokenizer_threads)
        self.warmed: set[tuple[int, ...]] = set()  # batch shapes already run once (engine.warm_up skips them)
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
    def packed(self) -> bool:
        """Return whether the backend takes packed batches (tokens back to back, no padding)."""
        return bool(getattr(self.backend, "packed", False))

    @property
    def model(self) -> torch.nn.Module:
        """Return the torch module of a torch backend (benchmarks and tests use it)."""
        return self.backend.model  # type: ignore[attr-defined]

    def tokenize(self, texts: list[str]) -> tuple[list[list[int]], np.ndarray]:
        """Return (token ids truncated to max_length, untruncated lengths) for each text."""
        tokens = self.tokenize_packed(texts)
        return [tokens.row(i) for i in range(len(tokens))], tokens.full_lengths

    def tokenize_packed(self, texts: list[str]) -> TokenizedTexts:
        """Return the texts' ids token-major (int32, back to back, truncated to max_length) from the tokenizer pool."""
        return self.tokenizers.encode(texts)

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """Return embeddings of a few texts in one batch (for probes; runs use the engine)."""
        tokens = self.tokenize_packed(texts)
        return self.embed_batch(self.collate_rows(tokens, np.arange(len(texts))))

    def collate(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (input_ids, attention_mask) padded to the batch's longest row, rounded up to the backend's multiple."""
        tokens = TokenizedTexts.from_lists(batch)
        return pad_rows(tokens, np.arange(len(batch)), self.pad_id, self.backend.length_multiple)

    def collate_rows(self, tokens: TokenizedTexts, rows: np.ndarray, pin: bool = False) -> Batch:
        """Return the batch of these rows the backend takes: packed, or padded to the longest (rounded to its multiple);
        in pinned memory when asked (CUDA: the copy to the device is then asynchronous)."""
        if self.packed:
            return pack_rows(tokens, rows, pin)
        return pad_rows(tokens, rows, self.pad_id, self.backend.length_multiple, pin)

    def slots(self, tokens: TokenizedTexts, rows: np.ndarray) -> int:
        """Return the token slots the batch of these rows computes: its real tokens when packed, else rows x length."""
        lengths = tokens.lengths[rows]
        if self.packed:
            return int(lengths.sum())
        multiple = self.backend.length_multiple
        return len(rows) * -(-int(lengths.max()) // multiple) * multiple

    def embed(self, input_ids: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
        """Return float32 sentence vectors of one padded batch (pooling and normalisation in fp32)."""
        return self.embed_batch((input_ids, mask))

    def embed_batch(self, batch: Batch, timer: PhaseTimer = NO_TIMER) -> np.ndarray:
        """Return float32 sentence vectors of one collated batch, on the host."""
        vectors = self.vectors(batch, timer)
        with timer.phase("device_to_host"):
            return host_array(vectors)

    def vectors(self, batch: Batch, timer: PhaseTimer = NO_TIMER) -> torch.Tensor | np.ndarray:
        """Return float32 sentence vectors [rows, dim] of one collated batch: a tensor on the device for torch
        backends (nothing waits for it on CUDA), numpy for the others."""
        if isinstance(batch, PackedBatch):
            with timer.phase("host_to_device"):
                batch = batch.to(self.device)
            with self._lock:
                with timer.phase("forward"):
                    hidden = self.backend.packed_hidden_states(batch)  # type: ignore[attr-defined]
                with timer.phase("pooling"):
                    return pool_packed(hidden, batch.segments, batch.offsets, batch.rows, self.info.pooling, self.info.normalize)
        input_ids, mask = batch
        if self.device.type != "cpu":
            with timer.phase("host_to_device"):
                input_ids = input_ids.to(self.device, non_blocking=input_ids.is_pinned())
                mask = mask.to(self.device, non_blocking=mask.is_pinned())
        with self._lock:
            with timer.phase("forward"):
                hidden = self.backend.hidden_states(input_ids, mask)
            with timer.phase("pooling"):
                if isinstance(hidden, np.ndarray):
                    return pool_numpy(hidden, np.asarray(mask), self.info.pooling, self.info.normalize)
                return pool_tensor(hidden, mask, self.info.pooling, self.info.normalize)

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


def host_array(vectors: torch.Tensor | np.ndarray) -> np.ndarray:
    """Return vectors as a float32 numpy array on the host (a device tensor is copied back)."""
    if isinstance(vectors, torch.Tensor):
        vectors = vectors.cpu().numpy()
    return vectors.astype(np.float32, copy=False)


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
