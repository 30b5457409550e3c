"""Typed failures of the online ranker and the one function that maps any failure to an HTTP status."""

from __future__ import annotations

import math

from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from core.errors import CacheUnavailable, ModelLoadError
from storage.events import EventsFull


class ServingError(Exception):
    """Base of the failures the online ranker reports to a client."""


class InvalidRequest(ServingError):
    """The request is malformed (HTTP 422)."""


class Overloaded(ServingError):
    """Too many requests are in flight (HTTP 429)."""


class PayloadTooLarge(ServingError):
    """The request body exceeds its bound (HTTP 413)."""


class NotReady(ServingError):
    """The service cannot answer yet: model, features or cache missing (HTTP 503)."""


class Unauthenticated(ServingError):
    """The endpoint needs a key and the request carries none (HTTP 401)."""


class Forbidden(ServingError):
    """The request carries a key that is not one of the service's (HTTP 403)."""


class RateLimited(ServingError):
    """The client made more requests than its rate allows (HTTP 429, Retry-After: when a token is back)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


RETRY_AFTER_S = "1"
SHOWN_INPUT_CHARS = 32  # a validation error shows this much of a bad string (a 10 KB id is never echoed back)


def status_for(exc: BaseException) -> int:
    """Return the HTTP status of a failure: the only place statuses are chosen for errors."""
    if isinstance(exc, (InvalidRequest, RequestValidationError)):
        return 422
    if isinstance(exc, Unauthenticated):
        return 401
    if isinstance(exc, Forbidden):
        return 403
    if isinstance(exc, (Overloaded, EventsFull, RateLimited)):
        return 429
    if isinstance(exc, PayloadTooLarge):
        return 413
    if isinstance(exc, (NotReady, CacheUnavailable, ModelLoadError)):
        return 503
    if isinstance(exc, HTTPException):
        return exc.status_code
    return 500


def shown_input(value: object) -> object:
    """Return what a validation error may show of its input: a short string prefix, a finite number, else nothing."""
    if isinstance(value, str):
        return value if len(value) <= SHOWN_INPUT_CHARS else value[:SHOWN_INPUT_CHARS] + "…"
    if isinstance(value, bool | int) or (isinstance(value, float) and math.isfinite(value)):
        return value
    return None  # NaN would make the body invalid JSON; a whole body or list says nothing the loc does not


def validation_detail(exc: RequestValidationError) -> list[dict[str, object]]:
    """Return pydantic's errors as the response shows them: loc, msg, type, ctx, and a bounded input."""
    errors = []
    for error in exc.errors():
        shown = {k: v for k, v in error.items() if k not in ("input", "url")}
        value = shown_input(error.get("input"))
        errors.append(shown if value is None else {**shown, "input": value})
    return list(jsonable_encoder(errors, custom_encoder={Exception: str}))


def headers_for(exc: BaseException, status: int) -> dict[str, str] | None:
    """Return the headers of an error response: Retry-After on 429 and 503, WWW-Authenticate on 401."""
    if isinstance(exc, RateLimited):
        return {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    if status in (429, 503):
        return {"Retry-After": RETRY_AFTER_S}
    return {"WWW-Authenticate": "Bearer"} if status == 401 else None


def error_response(exc: BaseException) -> JSONResponse:
    """Return the JSON error response of a failure: {"error": type, "detail": ...} with its status."""
    status = status_for(exc)
    if isinstance(exc, RequestValidationError):
        detail: object = validation_detail(exc)
    elif isinstance(exc, HTTPException):
        detail = exc.detail
    else:
        detail = "internal error" if status == 500 else str(exc)  # never leak a 500's internals
    return JSONResponse({"error": type(exc).__name__, "detail": detail}, status_code=status, headers=headers_for(exc, status))
