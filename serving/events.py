"""POST /v1/events: one validated interaction event appended to the event store (storage/events.py)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Literal

from fastapi import FastAPI, Request
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from serving.config import USER_ID_PATTERN
from storage.events import Event, EventStore

MAX_CLOCK_SKEW_S = 300.0  # an event may be stamped this far in the future (clients' clocks differ)


class EventIn(BaseModel):
    """One interaction as a client posts it; unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    user_id: str = Field(pattern=USER_ID_PATTERN)
    item_id: str = Field(pattern=USER_ID_PATTERN)
    event: Literal["view", "click", "purchase"]
    ts: AwareDatetime

    @field_validator("ts")
    @classmethod
    def not_in_the_future(cls, value: datetime) -> datetime:
        """Return ts unless it is later than now plus the allowed clock skew."""
        if value.timestamp() > time.time() + MAX_CLOCK_SKEW_S:
            raise ValueError(f"ts is more than {MAX_CLOCK_SKEW_S:.0f} s in the future")
        return value


def add_event_route(app: FastAPI, path: str) -> None:
    """Attach POST path: 202 once the event is stored (429 when the store is full, 422 for a bad event)."""

    @app.post(path, status_code=202)
    async def post_event(body: EventIn, request: Request) -> dict[str, str]:
        """Store one interaction event; the user's next recommendations exclude its item."""
        store: EventStore = request.app.state.events
        await store.append(Event(body.user_id, body.item_id, body.event, body.ts.timestamp()))
        return {"status": "accepted"}
