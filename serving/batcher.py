"""Scoring apart from ranking: per request, or dynamic batching of concurrent requests into one model call.

MicroBatcher (Triton's dynamic batcher, in one event loop): a request's feature rows wait in a queue; the queue
is scored in one Scorer.predict call (rows of every request stacked) once ``max_batch`` requests wait, when the
first of them has waited ``max_delay_s``, or as soon as no other request is on its way to the queue (so an idle
service adds no delay). Scoring runs on the loop itself: the forward pass of a batch takes about as long as a
thread hop would, and one loop never scores two batches at once.

The request that completes a batch (the last one on its way, or the max_batch-th) scores it in its own turn and
goes on without waiting: a batch costs no scheduling tick of its own, and a request alone costs none at all (no
future, no timer). Only the requests that wait for it are woken, once each.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from models.recommender.ranker_models import Scorer


class DirectScoring:
    """One model call per request (batching off: the comparison point)."""

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """Mark a request on its way to scoring (nothing to track here)."""
        yield

    async def score(self, scorer: Scorer, features: np.ndarray) -> np.ndarray:
        """Return the scorer's scores of one request's rows."""
        return scorer.predict(features)


@dataclass
class _Waiting:
    scorer: Scorer
    features: np.ndarray
    future: asyncio.Future[np.ndarray]


class MicroBatcher:
    """Scores the rows of concurrent requests in one model call per scorer; no request waits over max_delay_s."""

    def __init__(self, max_batch: int, max_delay_s: float, on_batch: Callable[[int, float], None] = lambda n, s: None) -> None:
        self.max_batch, self.max_delay_s, self._on_batch = max_batch, max_delay_s, on_batch
        self._queue: list[_Waiting] = []
        self._arriving = 0
        self._timer: asyncio.TimerHandle | None = None
        self._soon = False
        self._first_at = 0.0

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """Mark a request on its way to the queue (reading the cache): a batch may wait for it, up to the delay."""
        self._arriving += 1
        try:
            yield
        finally:
            self._arriving -= 1
            if self._queue and self._arriving == 0:
                self._flush_soon()

    async def score(self, scorer: Scorer, features: np.ndarray) -> np.ndarray:
        """Return the scorer's scores of one request's rows, computed with the rows of the requests batched with it."""
        if not self._queue and self._arriving == 0:
            self._on_batch(1, 0.0)
            return scorer.predict(features)  # alone, and nobody on the way: no queue, no future, no tick
        loop = asyncio.get_running_loop()
        waiting = _Waiting(scorer, features, loop.create_future())
        if not self._queue:
            self._first_at = time.perf_counter()
        self._queue.append(waiting)
        if len(self._queue) >= self.max_batch or self._arriving == 0:
            self._flush()  # full (max_batch is a hard cap), or nobody else on the way: scored now, in this turn
        elif self.max_delay_s <= 0:
            self._flush_soon()
        elif self._timer is None:
            self._timer = loop.call_later(self.max_delay_s, self._flush)
        return await waiting.future  # done already when this request scored the batch: no suspension

    def _flush_soon(self) -> None:
        """Score the queue at the next turn of the loop (requests ready in this turn still join)."""
        if not self._soon:
            self._soon = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Score every waiting request: one predict call per scorer, its scores split back per request."""
        if self._timer is not None:
            self._timer.cancel()
        batch, self._queue, self._timer, self._soon = self._queue, [], None, False
        if not batch:
            return
        self._on_batch(len(batch), time.perf_counter() - self._first_at)
        for scorer_id in dict.fromkeys(id(w.scorer) for w in batch):
            _score_group([w for w in batch if id(w.scorer) == scorer_id])


def _score_group(group: list[_Waiting]) -> None:
    """Score one scorer's waiting requests in one call and resolve their futures (the error to each on failure)."""
    try:
        scores = group[0].scorer.predict(np.concatenate([w.features for w in group]))
    except Exception as exc:  # noqa: BLE001 - handed to every request of the batch, each reports it
        for waiting in group:
            if not waiting.future.done():
                waiting.future.set_exception(exc)
        return
    offsets = np.cumsum([len(w.features) for w in group])[:-1]
    for waiting, part in zip(group, np.split(scores, offsets), strict=True):
        if not waiting.future.done():
            waiting.future.set_result(part)


Scoring = DirectScoring | MicroBatcher


def scoring_for(batching: bool, max_batch: int, max_delay_us: int, on_batch: Callable[[int, float], None]) -> Scoring:
    """Return the batcher, or per-request scoring when batching is off."""
    return MicroBatcher(max_batch, max_delay_us / 1e6, on_batch) if batching else DirectScoring()
