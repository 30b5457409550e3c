"""The batch encoding engine: global length planning, token-budget batches, input order restored.

Shared by every backend: the backend only turns one padded batch into hidden states; planning,
collation (padding to the batch's longest row, rounded to the backend's length multiple), pooling,
normalisation and order restoration happen here and in TextEncoder.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np
import torch

from models.encoder.batching import plan_batches
from models.encoder.text_encoder import TextEncoder

log = logging.getLogger(__name__)


@dataclass
class EncodeStats:
    """What one encode call did: rows, real vs padded tokens, truncations, batches, time."""

    texts: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    truncated: int = 0
    batches: int = 0
    oom_splits: int = 0
    seconds: float = 0.0

    @property
    def padding_efficiency(self) -> float:
        """Return real tokens / computed token slots (1.0 means no padding at all)."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0

    def merge(self, other: EncodeStats) -> EncodeStats:
        """Return the sum of two stats (shards add up to a run)."""
        fields = {k: v + getattr(other, k) for k, v in asdict(self).items()}
        return EncodeStats(**fields)

    def as_dict(self) -> dict[str, float]:
        """Return the stats with the derived padding efficiency, for logs and tables."""
        return {**asdict(self), "padding_efficiency": round(self.padding_efficiency, 4)}


def encode_texts(
    encoder: TextEncoder, texts: list[str], token_budget: int | None = None, before_batch: Callable[[], None] | None = None
) -> tuple[np.ndarray, EncodeStats]:
    """Return (embeddings in input order, stats) for texts, batched by a token budget.

    ``token_budget`` None takes the encoder's (auto's calibrated budget, or the device default).
    ``before_batch`` runs before every batch (a graceful stop raises from it, so the current batch
    always finishes and nothing half-encoded is returned).
    """
    started = time.perf_counter()
    budget = token_budget or encoder.token_budget
    ids, full_lengths = encoder.tokenize(texts)
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    out, runner = run_batches(encoder, ids, plan_batches(lengths, budget), budget, before_batch)
    stats = EncodeStats(
        texts=len(texts),
        real_tokens=int(lengths.sum()),
        padded_tokens=runner.padded,
        truncated=int((full_lengths > encoder.max_length).sum()),
        batches=runner.batches,
        oom_splits=runner.oom_splits,
        seconds=time.perf_counter() - started,
    )
    return out, stats


def run_batches(
    encoder: TextEncoder,
    ids: list[list[int]],
    batches: list[np.ndarray],
    budget: int | None = None,
    before_batch: Callable[[], None] | None = None,
) -> tuple[np.ndarray, _BatchRunner | _StreamRunner]:
    """Return (vectors of ids in their order, the runner's counts) after running the given batches in the encoder's
    mode: one at a time with the next collated meanwhile, or as many at once as a multi-stream backend has streams."""
    out = np.empty((len(ids), encoder.dim), dtype=np.float32)
    if encoder.backend.streams > 1:
        streamed = _StreamRunner(encoder, ids, out, before_batch)
        streamed.run_all(batches)
        return out, streamed
    runner = _BatchRunner(encoder, ids, out, budget or encoder.token_budget)
    for rows, tensors in _prefetched(batches, ids, encoder):
        if before_batch is not None:
            before_batch()
        runner.run(rows, tensors)
    return out, runner


def _prefetched(
    batches: list[np.ndarray], ids: list[list[int]], encoder: TextEncoder
) -> Iterator[tuple[np.ndarray, tuple[torch.Tensor, torch.Tensor]]]:
    """Yield (rows, collated tensors), collating the next batch while the current one computes."""
    pin = encoder.device.type == "cuda"

    def collate(rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        input_ids, mask = encoder.collate([ids[i] for i in rows])
        return (input_ids.pin_memory(), mask.pin_memory()) if pin else (input_ids, mask)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="collate") as pool:
        pending = pool.submit(collate, batches[0]) if batches else None
        for i, rows in enumerate(batches):
            assert pending is not None  # submitted for every batch before it is reached
            tensors = pending.result()
            pending = pool.submit(collate, batches[i + 1]) if i + 1 < len(batches) else None
            yield rows, tensors


class _StreamRunner:
    """Runs planned batches on a multi-stream backend: as many at once as it has streams, each collated,
    run and pooled in its own worker thread (the runtime releases the GIL), rows written in place."""

    oom_splits = 0  # CPU streams: no device memory to run out of

    def __init__(
        self, encoder: TextEncoder, ids: list[list[int]], out: np.ndarray, before_batch: Callable[[], None] | None
    ) -> None:
        self.encoder, self.ids, self.out, self.before_batch = encoder, ids, out, before_batch
        self.padded = self.batches = 0

    def _one(self, rows: np.ndarray) -> int:
        input_ids, mask = self.encoder.collate([self.ids[i] for i in rows])
        self.out[rows] = self.encoder.embed(input_ids, mask)
        return int(input_ids.shape[0] * input_ids.shape[1])

    def run_all(self, batches: list[np.ndarray]) -> None:
        """Encode every batch, keeping one queued per stream beyond those running; a stop lets running ones finish."""
        streams = self.encoder.backend.streams
        pending: deque[Future[int]] = deque()
        with ThreadPoolExecutor(max_workers=streams, thread_name_prefix="stream") as pool:
            for rows in batches:
                if self.before_batch is not None:
                    self.before_batch()
                pending.append(pool.submit(self._one, rows))
                if len(pending) > 2 * streams:
                    self._collect(pending.popleft())
            while pending:
                self._collect(pending.popleft())

    def _collect(self, done: Future[int]) -> None:
        self.padded += done.result()
        self.batches += 1


class _BatchRunner:
    """Runs planned batches into the output matrix; on CUDA OOM splits the batch and lowers the budget."""

    def __init__(self, encoder: TextEncoder, ids: list[list[int]], out: np.ndarray, budget: int) -> None:
        self.encoder, self.ids, self.out, self.budget = encoder, ids, out, budget
        self.padded = self.batches = self.oom_splits = 0

    def run(self, rows: np.ndarray, tensors: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Encode rows (using pre-collated tensors when given) and store them in out."""
        longest = max(len(self.ids[i]) for i in rows)
        multiple = self.encoder.backend.length_multiple
        longest = -(-longest // multiple) * multiple  # the collated length (a backend may pad to a multiple)
        if len(rows) > 1 and len(rows) * longest > self.budget:
            return self._split(rows)
        if tensors is None:
            tensors = self.encoder.collate([self.ids[i] for i in rows])
        try:
            self.out[rows] = self.encoder.embed(*tensors)
        except torch.OutOfMemoryError:
            if len(rows) == 1:
                raise
            self._lower_budget(len(rows) * longest)
            return self._split(rows)
        self.padded += len(rows) * longest
        self.batches += 1

    def _split(self, rows: np.ndarray) -> None:
        half = len(rows) // 2
        self.run(rows[:half])
        self.run(rows[half:])

    def _lower_budget(self, failed_tokens: int) -> None:
        self.oom_splits += 1
        self.budget = max(failed_tokens // 2, 1)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        log.warning("CUDA out of memory at %d tokens: batch split, budget lowered to %d", failed_tokens, self.budget)
