"""The batch encoding engine: global length planning, token-budget batches, input order restored.

Shared by every backend: the backend only turns one batch into hidden states; planning, collation (padding to the
batch's longest row, rounded to the backend's length multiple, or packing rows back to back for a packed backend),
pooling, normalisation and order restoration happen here and in TextEncoder. On CUDA the vectors stay on the device
until the call's end (one copy back), and batches are collated into pinned memory ahead of the one computing.
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

from models.encoder.batching import plan_batches, plan_packed
from models.encoder.phases import NO_TIMER, PhaseTimer
from models.encoder.text_encoder import Batch, TextEncoder, host_array
from models.encoder.tokens import TokenizedTexts

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
    encoder: TextEncoder,
    texts: list[str],
    token_budget: int | None = None,
    before_batch: Callable[[], None] | None = None,
    timer: PhaseTimer = NO_TIMER,
) -> tuple[np.ndarray, EncodeStats]:
    """Return (embeddings in input order, stats) for texts, batched by a token budget.

    ``token_budget`` None takes the encoder's (auto's calibrated budget, or the device default).
    ``before_batch`` runs before every batch (a graceful stop raises from it, so the current batch
    always finishes and nothing half-encoded is returned). ``timer`` (a profiled pass) records where the time goes.
    """
    started = time.perf_counter()
    budget = token_budget or encoder.token_budget
    if streamed(encoder, len(texts), budget):
        out, stats = _encode_streamed(encoder, texts, budget, before_batch, timer)
    else:
        with timer.phase("tokenize"):
            tokens = encoder.tokenize_packed(texts)
        out, stats = encode_tokens(encoder, tokens, budget, before_batch, timer)
    stats.seconds = time.perf_counter() - started
    return out, stats


def streamed(encoder: TextEncoder, texts: int, budget: int) -> bool:
    """Return whether texts are tokenized while earlier ones compute: a packed backend (whose batches need no global
    length order: nothing is padded), several tokenizer threads, and more than one window of texts."""
    return encoder.packed and encoder.tokenizers.threads > 1 and texts > stream_window(budget)


def stream_window(budget: int) -> int:
    """Return how many texts are planned together when tokenizing overlaps compute: about eight budgets' worth."""
    return max(8 * budget // 64, 2048)  # texts of ~64 tokens; long-tail corpora average fewer


def encode_tokens(
    encoder: TextEncoder,
    tokens: TokenizedTexts,
    budget: int | None = None,
    before_batch: Callable[[], None] | None = None,
    timer: PhaseTimer = NO_TIMER,
) -> tuple[np.ndarray, EncodeStats]:
    """Return (vectors, stats) of texts tokenized already, planned together (the seconds: planning and batches)."""
    started = time.perf_counter()
    budget = budget or encoder.token_budget
    with timer.phase("plan"):
        batches = plan(encoder, tokens.lengths, budget)
    out, runner = run_batches(encoder, tokens, batches, budget, before_batch, timer)
    stats = EncodeStats(
        texts=len(tokens),
        real_tokens=int(tokens.lengths.sum()),
        padded_tokens=runner.padded,
        truncated=int((tokens.full_lengths > encoder.max_length).sum()),
        batches=runner.batches,
        oom_splits=runner.oom_splits,
        seconds=time.perf_counter() - started,
    )
    return out, stats


def _encode_streamed(
    encoder: TextEncoder, texts: list[str], budget: int, before_batch: Callable[[], None] | None, timer: PhaseTimer
) -> tuple[np.ndarray, EncodeStats]:
    """Return (vectors, stats without seconds), window by window, the tokenizer threads producing the next windows
    while the current one computes (the GPU's host side: tokenizing is most of what it does)."""
    out = np.empty((len(texts), encoder.dim), dtype=np.float32)
    stats = EncodeStats()
    windows = encoder.tokenizers.stream(texts, stream_window(budget))
    while True:
        with timer.phase("tokenize"):  # only the wait: the threads tokenize ahead while batches compute
            window = next(windows, None)
        if window is None:
            return out, stats
        start, tokens = window
        out[start : start + len(tokens)], part = encode_tokens(encoder, tokens, budget, before_batch, timer)
        stats = stats.merge(part)


def plan(encoder: TextEncoder, lengths: np.ndarray, budget: int) -> list[np.ndarray]:
    """Return the batches of row indices the encoder runs: padding-free by real tokens when its backend packs, else
    by rows x longest length."""
    return plan_packed(lengths, budget) if encoder.packed else plan_batches(lengths, budget)


def shape_class(encoder: TextEncoder, tokens: TokenizedTexts, rows: np.ndarray) -> tuple[int, int]:
    """Return the shape a batch runs at: (rows, padded length) padded; packed, its token count and longest row,
    coarsened (every 256 tokens, every 32 positions), as the kernels of a padding-free batch see them."""
    lengths = tokens.lengths[rows]
    if encoder.packed:
        return -(-int(lengths.sum()) // 256), -(-int(lengths.max()) // 32)
    return len(rows), encoder.slots(tokens, rows) // len(rows)


def warm_up(encoder: TextEncoder, texts: list[str] | TokenizedTexts, token_budget: int | None = None) -> int:
    """Run one batch of every shape the engine will meet encoding these texts and has not run warm yet, untimed;
    return how many ran.

    First use of a shape costs compilation, kernel selection and allocation (on an H200, bf16 ran a cold batch at
    a tenth of its warm rate): a timed pass or a calibration that met shapes cold would time that instead.
    """
    tokens = texts if isinstance(texts, TokenizedTexts) else encoder.tokenize_packed(texts)
    budget = token_budget or encoder.token_budget
    first: dict[tuple[int, ...], np.ndarray] = {}
    for rows in plan(encoder, tokens.lengths, budget):
        shape = (*shape_class(encoder, tokens, rows), encoder.backend.length_multiple)
        if shape not in encoder.warmed:
            first.setdefault(shape, rows)
    run_batches(encoder, tokens, list(first.values()), budget)
    encoder.warmed.update(first)
    return len(first)


def run_batches(
    encoder: TextEncoder,
    ids: list[list[int]] | TokenizedTexts,
    batches: list[np.ndarray],
    budget: int | None = None,
    before_batch: Callable[[], None] | None = None,
    timer: PhaseTimer = NO_TIMER,
) -> tuple[np.ndarray, _BatchRunner | _StreamRunner]:
    """Return (vectors of ids in their order, the runner's counts) after running the given batches in the encoder's
    mode: one at a time with the next collated meanwhile, or as many at once as a multi-stream backend has streams."""
    tokens = ids if isinstance(ids, TokenizedTexts) else TokenizedTexts.from_lists(ids)
    out = np.empty((len(tokens), encoder.dim), dtype=np.float32)
    if encoder.backend.streams > 1:
        streamed = _StreamRunner(encoder, tokens, out, before_batch, timer)
        streamed.run_all(batches)
        return out, streamed
    runner = _BatchRunner(encoder, tokens, _Sink(out, encoder.device), budget or encoder.token_budget, timer)
    for rows, batch in _prefetched(batches, tokens, encoder, timer):
        if before_batch is not None:
            before_batch()
        runner.run(rows, batch)
    runner.sink.finish(timer)
    return out, runner


def _prefetched(
    batches: list[np.ndarray], tokens: TokenizedTexts, encoder: TextEncoder, timer: PhaseTimer
) -> Iterator[tuple[np.ndarray, Batch]]:
    """Yield (rows, collated batch), collating the next batch while the current one computes (pinned on CUDA)."""
    pin = encoder.device.type == "cuda"

    def collate(rows: np.ndarray) -> Batch:
        started = time.perf_counter()
        batch = encoder.collate_rows(tokens, rows, pin)
        timer.add("collate", time.perf_counter() - started)
        return batch

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="collate") as pool:
        pending = pool.submit(collate, batches[0]) if batches else None
        for i, rows in enumerate(batches):
            assert pending is not None  # submitted for every batch before it is reached
            with timer.phase("idle"):
                batch = pending.result()
            pending = pool.submit(collate, batches[i + 1]) if i + 1 < len(batches) else None
            yield rows, batch


class _Sink:
    """Where a runner's vectors go: into the output matrix batch by batch, or on CUDA kept on the device and copied
    back once at the end (no per-batch wait for the device; rows placed in input order then)."""

    def __init__(self, out: np.ndarray, device: torch.device) -> None:
        self.out, self.on_device = out, device.type == "cuda"
        self._vectors: list[torch.Tensor] = []
        self._rows: list[np.ndarray] = []

    def write(self, rows: np.ndarray, vectors: torch.Tensor | np.ndarray, timer: PhaseTimer) -> None:
        """Place one batch's vectors (or keep them on the device until `finish`)."""
        if self.on_device and isinstance(vectors, torch.Tensor):
            self._vectors.append(vectors)
            self._rows.append(rows)
            return
        with timer.phase("device_to_host"):
            self.out[rows] = host_array(vectors)

    def finish(self, timer: PhaseTimer) -> None:
        """Copy the vectors kept on the device back in one transfer and put them in input order."""
        if self._vectors:
            with timer.phase("device_to_host"):
                self.out[np.concatenate(self._rows)] = host_array(torch.cat(self._vectors))
            self._vectors, self._rows = [], []


class _StreamRunner:
    """Runs planned batches on a multi-stream backend: as many at once as it has streams, each collated,
    run and pooled in its own worker thread (the runtime releases the GIL), rows written in place."""

    oom_splits = 0  # CPU streams: no device memory to run out of

    def __init__(
        self,
        encoder: TextEncoder,
        tokens: TokenizedTexts,
        out: np.ndarray,
        before_batch: Callable[[], None] | None,
        timer: PhaseTimer = NO_TIMER,
    ) -> None:
        self.encoder, self.tokens, self.out, self.before_batch, self.timer = encoder, tokens, out, before_batch, timer
        self.padded = self.batches = 0

    def _one(self, rows: np.ndarray) -> int:
        started = time.perf_counter()
        batch = self.encoder.collate_rows(self.tokens, rows)
        self.timer.add("collate", time.perf_counter() - started)
        self.out[rows] = self.encoder.embed_batch(batch, self.timer)
        return self.encoder.slots(self.tokens, rows)

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
        with self.timer.phase("idle"):
            self.padded += done.result()
        self.batches += 1


class _BatchRunner:
    """Runs planned batches into the sink; on CUDA OOM splits the batch and lowers the budget."""

    def __init__(self, encoder: TextEncoder, tokens: TokenizedTexts, sink: _Sink, budget: int, timer: PhaseTimer) -> None:
        self.encoder, self.tokens, self.sink, self.budget, self.timer = encoder, tokens, sink, budget, timer
        self.padded = self.batches = self.oom_splits = 0

    def run(self, rows: np.ndarray, batch: Batch | None = None) -> None:
        """Encode rows (using a pre-collated batch when given) and hand their vectors to the sink."""
        slots = self.encoder.slots(self.tokens, rows)  # what the batch computes, padding included
        if len(rows) > 1 and slots > self.budget:
            return self._split(rows)
        if batch is None:
            batch = self.encoder.collate_rows(self.tokens, rows)
        try:
            self.sink.write(rows, self.encoder.vectors(batch, self.timer), self.timer)
        except torch.OutOfMemoryError:
            if len(rows) == 1:
                raise
            self._lower_budget(slots)
            return self._split(rows)
        self.padded += slots
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
