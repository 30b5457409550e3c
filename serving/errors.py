"""Typed failures of the online ranker and the one function that maps any failure to an HTTP status."""

from __future__ import annotations

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


RETRY_AFTER_S = "1"


def status_for(exc: BaseException) -> int:
    """Return the HTTP status of a failure: the only place statuses are chosen for errors."""
    if isinstance(exc, (InvalidRequest, RequestValidationError)):
        return 422
    if isinstance(exc, (Overloaded, EventsFull)):
        return 429
    if isinstance(exc, PayloadTooLarge):
        return 413
    if isinstance(exc, (NotReady, CacheUnavailable, ModelLoadError)):
        return 503
    if isinstance(exc, HTTPException):
        return exc.status_code
    return 500


def error_response(exc: BaseException) -> JSONResponse:
    """Return the JSON error response of a failure: {"error": type, "detail": ...} with its status."""
    status = status_for(exc)
    if isinstance(exc, RequestValidationError):
        detail: object = jsonable_encoder(exc.errors(), custom_encoder={Exception: str})
    elif isinstance(exc, HTTPException):
        detail = exc.detail
    else:
        detail = "internal error" if status == 500 else str(exc)  # never leak a 500's internals
    headers = {"Retry-After": RETRY_AFTER_S} if status in (429, 503) else None
    return JSONResponse({"error": type(exc).__name__, "detail": detail}, status_code=status, headers=headers)
