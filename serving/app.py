"""HTTP of the online ranker: create_app builds the FastAPI service, run_server runs it under uvicorn."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated

import torch
import uvicorn
from fastapi import FastAPI, Path, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nightscore.errors import NightscoreError
from serving.config import DEFAULT_N, MAX_N, USER_ID_PATTERN, ServingConfig
from serving.errors import NotReady, Overloaded, ServingError, error_response
from serving.metrics import CONTENT_TYPE, Metrics
from serving.ranking import Recommender, build_recommender
from storage.cache import CandidateCache, open_cache

log = logging.getLogger(__name__)

RECOMMEND_PREFIX = "/v1/users/"
PLAIN_ENDPOINTS = ("/healthz", "/readyz", "/metrics")


def endpoint_of(path: str) -> str:
    """Return the metrics label of a request path (bounded: never the user id)."""
    if path.startswith(RECOMMEND_PREFIX) and path.endswith("/recommendations"):
        return "recommendations"
    return path.lstrip("/") if path in PLAIN_ENDPOINTS else "other"


class InFlightLimit:
    """ASGI middleware refusing requests under a path prefix with 429 while `limit` of them are in flight."""

    def __init__(self, app: ASGIApp, limit: int, prefix: str) -> None:
        self.app, self.limit, self.prefix = app, limit, prefix
        self.in_flight = 0  # touched by the event loop only, so no lock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            await error_response(Overloaded(f"{self.in_flight} requests in flight (max {self.limit})"))(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


class RequestMetrics:
    """ASGI middleware counting every HTTP request by endpoint and status, with its latency."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), 500

        async def record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            self.metrics.observe(endpoint_of(scope["path"]), status, time.perf_counter() - started)


def _add_routes(app: FastAPI, recommender: Recommender, metrics: Metrics) -> None:
    """Attach the recommendation, health, readiness and metrics endpoints."""

    @app.get("/v1/users/{user_id}/recommendations")
    def recommendations(
        user_id: Annotated[str, Path(pattern=USER_ID_PATTERN)], n: Annotated[int, Query(ge=1, le=MAX_N)] = DEFAULT_N
    ) -> JSONResponse:
        """Return the user's top-n items by the ranker, or popular items marked as a fallback."""
        return JSONResponse(recommender.recommend(user_id, n).as_json())

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Return 200 while the process runs."""
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz() -> dict[str, str | None]:
        """Return 200 when the cache answers and the model is loaded, else 503."""
        if not recommender.ready():
            raise NotReady("candidate cache unreachable")
        return {"status": "ready", "model_version": recommender.model_version}

    @app.get("/metrics")
    async def metrics_text() -> Response:
        """Return the Prometheus text exposition."""
        return Response(metrics.render(), media_type=CONTENT_TYPE)


def _add_error_handlers(app: FastAPI) -> None:
    """Route every failure through serving.errors.error_response (the one status mapping)."""

    async def handle(_request: object, exc: Exception) -> Response:
        return error_response(exc)  # unexpected ones are also re-raised and logged by Starlette and uvicorn

    for kind in (ServingError, NightscoreError, RequestValidationError, HTTPException, Exception):
        app.add_exception_handler(kind, handle)


def _closing(cache: CandidateCache | None) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Return a lifespan that closes the cache at shutdown when the app opened it."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        if cache is not None:
            cache.close()

    return lifespan


def create_app(config: ServingConfig, *, cache: CandidateCache | None = None) -> FastAPI:
    """Return the service with its model and features loaded and warmed up; nothing is built at import.

    Args:
        config: the serving options.
        cache: a cache to use instead of opening config.cache_location (then the caller closes it).

    Raises:
        ModelLoadError: the model or a feature table cannot be loaded.
    """
    owned = None if cache is not None else open_cache(config.cache_location, config.cache_prefix)
    metrics = Metrics()
    try:
        recommender = build_recommender(config, cache or owned, metrics.fallback)  # type: ignore[arg-type]  # one is set
    except BaseException:
        if owned is not None:
            owned.close()
        raise
    app = FastAPI(title="nightscore ranker", lifespan=_closing(owned))
    app.state.recommender, app.state.metrics = recommender, metrics
    _add_routes(app, recommender, metrics)
    _add_error_handlers(app)
    app.add_middleware(InFlightLimit, limit=config.max_in_flight, prefix=RECOMMEND_PREFIX)
    app.add_middleware(RequestMetrics, metrics=metrics)  # added last = outermost: counts the 429s too
    return app


def run_server(config: ServingConfig, host: str = "127.0.0.1", port: int = 8000, *, log_level: str = "info") -> None:
    """Serve the app under uvicorn until stopped (SIGINT/SIGTERM)."""
    torch.set_num_threads(config.torch_threads)  # one tiny MLP per request: more intra-op threads only add overhead
    uvicorn.run(create_app(config), host=host, port=port, log_level=log_level, access_log=False)
