"""Token ids on the host, token-major: every text's ids back to back (int32) with its offsets, and the batches cut
from them, padded (`pad_rows`) or packed (`pack_rows`); tokenizing with several tokenizer instances (`TokenizerPool`).

One shared `Tokenizer.encode_batch` scales poorly on many cores; each worker thread here owns its instance (the
Rust side releases the GIL while it encodes), and every chunk comes back as flat int32 arrays, not Python lists.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from tokenizers import Encoding, Tokenizer

CHUNK_TEXTS = 512  # texts per tokenizer call: small enough to spread over the workers, large enough for Rust's batching


@dataclass(frozen=True)
class TokenizedTexts:
    """Texts as token ids back to back: text i's (truncated) ids are ids[offsets[i]:offsets[i + 1]]."""

    ids: np.ndarray  # int32 [tokens]
    offsets: np.ndarray  # int64 [texts + 1]
    full_lengths: np.ndarray  # int64 [texts]: lengths before truncation

    @property
    def lengths(self) -> np.ndarray:
        """Return each text's length in tokens after truncation."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def row(self, index: int) -> list[int]:
        """Return one text's ids as a list."""
        return self.ids[self.offsets[index] : self.offsets[index + 1]].tolist()

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]], full_lengths: np.ndarray | None = None) -> TokenizedTexts:
        """Return the token-major form of id lists (already truncated)."""
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.fromiter((t for r in rows for t in r), dtype=np.int32, count=int(offsets[-1]))
        return cls(ids, offsets, lengths if full_lengths is None else np.asarray(full_lengths, dtype=np.int64))

    @classmethod
    def concat(cls, parts: Sequence[TokenizedTexts]) -> TokenizedTexts:
        """Return the parts one after the other."""
        if not parts:
            return cls(np.zeros(0, np.int32), np.zeros(1, np.int64), np.zeros(0, np.int64))
        lengths = np.concatenate([p.lengths for p in parts])
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(np.concatenate([p.ids for p in parts]), offsets, np.concatenate([p.full_lengths for p in parts]))


def from_encodings(encodings: Sequence[Encoding], max_length: int) -> TokenizedTexts:
    """Return the encodings' ids token-major, each cut to max_length keeping its final special token ([SEP])."""
    rows = [e.ids for e in encodings]
    full = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    cut = [r if len(r) <= max_length else r[: max_length - 1] + r[-1:] for r in rows]
    return TokenizedTexts.from_lists(cut, full)


class TokenizerPool:
    """Tokenizes texts with `threads` tokenizer instances, one per worker thread, chunk by chunk."""

    def __init__(self, tokenizer: Tokenizer, max_length: int, threads: int) -> None:
        self.max_length, self.threads = max_length, max(threads, 1)
        self._source = tokenizer.to_str()
        self._local = threading.local()
        self._first = tokenizer

    def _instance(self) -> Tokenizer:
        """Return this thread's own tokenizer (built once per thread from the same JSON)."""
        own = getattr(self._local, "tokenizer", None)
        if own is None:
            own = Tokenizer.from_str(self._source)
            self._local.tokenizer = own
        return own

    def _encode(self, texts: list[str], tokenizer: Tokenizer | None = None) -> TokenizedTexts:
        tokenizer = tokenizer or self._instance()
        encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # no offsets: ~15% faster
        return from_encodings(encode(texts, add_special_tokens=True), self.max_length)

    def encode(self, texts: list[str]) -> TokenizedTexts:
        """Return the texts tokenized (in order), over the worker threads when there are several chunks."""
        chunks = [texts[i : i + CHUNK_TEXTS] for i in range(0, len(texts), CHUNK_TEXTS)]
        if self.threads == 1 or len(chunks) <= 1:
            return TokenizedTexts.concat([self._encode(c, self._first) for c in chunks])
        with ThreadPoolExecutor(max_workers=min(self.threads, len(chunks)), thread_name_prefix="tokenize") as pool:
            return TokenizedTexts.concat(list(pool.map(self._encode, chunks)))

    def stream(self, texts: list[str], window: int) -> Iterator[tuple[int, TokenizedTexts]]:
        """Yield (first text's index, its window of `window` texts tokenized), in order, while the worker threads go on
        tokenizing the windows after it: the consumer computes on one window as the next ones are produced."""
        pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="tokenize")
        try:
            starts = range(0, len(texts), window)
            pending = [
                [
                    pool.submit(self._encode, texts[i : i + CHUNK_TEXTS])
                    for i in range(start, min(start + window, len(texts)), CHUNK_TEXTS)
                ]
                for start in starts
            ]
            for start, chunks in zip(starts, pending, strict=True):
                yield start, TokenizedTexts.concat([chunk.result() for chunk in chunks])
        finally:  # a consumer that stops early (a graceful stop) leaves no tokenizing behind
            pool.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class PackedBatch:
    """One padding-free batch, token-major: `data` holds ids, positions and row numbers ([3, tokens]) then the
    rows' offsets ([rows + 1], cu_seqlens), all int32 in one buffer (one host-to-device copy)."""

    data: torch.Tensor  # int32 [3 * tokens + rows + 1]
    tokens: int
    rows: int
    longest: int

    @property
    def ids(self) -> torch.Tensor:
        """Return the token ids [tokens]."""
        return self.data[: self.tokens]

    @property
    def positions(self) -> torch.Tensor:
        """Return each token's position inside its row [tokens]."""
        return self.data[self.tokens : 2 * self.tokens]

    @property
    def segments(self) -> torch.Tensor:
        """Return each token's row number [tokens]."""
        return self.data[2 * self.tokens : 3 * self.tokens]

    @property
    def offsets(self) -> torch.Tensor:
        """Return where each row starts, and the end ([rows + 1], int32: what varlen attention takes)."""
        return self.data[3 * self.tokens :]

    def to(self, device: torch.device) -> PackedBatch:
        """Return the batch on device (a non-blocking copy from pinned memory on CUDA)."""
        if self.data.device == device:
            return self
        data = self.data.to(device, non_blocking=self.data.is_pinned())
        return PackedBatch(data, self.tokens, self.rows, self.longest)


def pack_rows(tokens: TokenizedTexts, rows: np.ndarray, pin: bool = False) -> PackedBatch:
    """Return the rows' ids packed back to back with their positions, row numbers and offsets (no padding)."""
    starts, lengths = tokens.offsets[rows], tokens.lengths[rows]
    total, count = int(lengths.sum()), len(rows)
    buffer = torch.empty(3 * total + count + 1, dtype=torch.int32, pin_memory=pin)
    data = buffer.numpy()
    offsets = data[3 * total :]
    offsets[0] = 0
    np.cumsum(lengths, out=offsets[1:])
    # position of each token in its row: a running count that restarts at every row's start
    positions = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1].astype(np.int64), lengths)
    data[total : 2 * total] = positions
    data[:total] = tokens.ids[np.repeat(starts, lengths) + positions]
    data[2 * total : 3 * total] = np.repeat(np.arange(count, dtype=np.int32), lengths)
    return PackedBatch(buffer, total, count, int(lengths.max()) if count else 0)


def pad_rows(
    tokens: TokenizedTexts, rows: np.ndarray, pad_id: int, multiple: int = 1, pin: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (input_ids, attention_mask) int64 [rows, longest] of the rows, the longest rounded up to `multiple`."""
    starts, lengths = tokens.offsets[rows], tokens.lengths[rows]
    longest = int(lengths.max()) if len(rows) else 0
    longest = -(-longest // multiple) * multiple
    ids = torch.empty((len(rows), longest), dtype=torch.int64, pin_memory=pin)
    mask = torch.empty((len(rows), longest), dtype=torch.int64, pin_memory=pin)
    inside = np.arange(longest)[None, :] < lengths[:, None]
    mask.numpy()[:] = inside
    where = np.minimum(starts[:, None] + np.arange(longest)[None, :], max(len(tokens.ids) - 1, 0))
    ids.numpy()[:] = np.where(inside, tokens.ids[where] if len(tokens.ids) else 0, pad_id)
    return ids, mask
