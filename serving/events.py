"""POST /v1/events: one validated interaction event appended to the event store (storage/events.py).

Refused with 422: an id that breaks the id rule (core/ids.py), an unknown kind or field, a ``ts`` without a time
zone, not finite, more than MAX_CLOCK_SKEW_S in the future or older than ``events_max_age_s``. Answered 202 but
dropped, never stored nor exported, with the reason in the body and in ``nightscore_events_dropped_total{reason}``:
an item the served run's catalogue does not hold (``unknown_item``: the next nightly would quarantine it) and an
exact duplicate of an event held (``duplicate``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import AwareDatetime, BaseModel, ConfigDict, field_validator

from serving.config import ServedId
from serving.ranking import Recommender
from storage.events import Event, EventStore

MAX_CLOCK_SKEW_S = 300.0  # an event may be stamped this far in the future (clients' clocks differ)
UNKNOWN_ITEM, DUPLICATE = "unknown_item", "duplicate"


class EventIn(BaseModel):
    """One interaction as a client posts it; unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    user_id: ServedId
    item_id: ServedId
    event: Literal["view", "click", "purchase"]
    ts: AwareDatetime

    @field_validator("ts")
    @classmethod
    def not_in_the_future(cls, value: datetime) -> datetime:
        """Return ts unless it is later than now plus the allowed clock skew."""
        if value.timestamp() > time.time() + MAX_CLOCK_SKEW_S:
            raise ValueError(f"ts is more than {MAX_CLOCK_SKEW_S:.0f} s in the future")
        return value


def too_old(body: EventIn, max_age_s: float) -> RequestValidationError | None:
    """Return the 422 of an event older than max_age_s (its day may be exported already), or None."""
    if body.ts.timestamp() >= time.time() - max_age_s:
        return None
    message = f"ts is more than {max_age_s:.0f} s in the past (NIGHTSCORE_SERVING_EVENTS_MAX_AGE_S)"
    return RequestValidationError([{"type": "value_error", "loc": ("body", "ts"), "msg": message}])


class EventIntake:
    """Decides an event's fate: stored, or dropped with a reason (counted); too old ones are refused."""

    def __init__(self, recommender: Recommender, max_age_s: float, on_drop: Callable[[str], None]) -> None:
        self.recommender, self.max_age_s, self.on_drop = recommender, max_age_s, on_drop

    async def take(self, body: EventIn, store: EventStore) -> dict[str, str]:
        """Return the answer's body after storing the event, or after dropping it with its reason.

        Raises:
            RequestValidationError: ts is older than max_age_s.
            EventsFull: the store holds its maximum.
        """
        refused = too_old(body, self.max_age_s)
        if refused is not None:
            raise refused
        run = await self.recommender.serving_run()
        if run.items is not None and body.item_id not in run.items:
            return self.dropped(UNKNOWN_ITEM)
        if not await store.append(Event(body.user_id, body.item_id, body.event, body.ts.timestamp())):
            return self.dropped(DUPLICATE)
        return {"status": "accepted"}

    def dropped(self, reason: str) -> dict[str, str]:
        """Count a dropped event and return the answer saying why."""
        self.on_drop(reason)
        return {"status": "dropped", "reason": reason}


def add_event_route(app: FastAPI, path: str, intake: EventIntake) -> None:
    """Attach POST path: 202 once the event is stored or dropped (429 when the store is full, 422 for a bad event)."""

    @app.post(path, status_code=202)
    async def post_event(body: EventIn, request: Request) -> dict[str, str]:
        """Store one interaction event (the user's next recommendations exclude its item), or drop it saying why."""
        store: EventStore = request.app.state.events
        return await intake.take(body, store)
