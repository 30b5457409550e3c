"""HTTP of the online ranker: create_app builds the FastAPI service, run_server runs it under uvicorn (N workers).

Async end to end: handlers await the cache reader (one round trip) and the batcher; nothing goes to a thread pool.
Each worker process builds its own app (app_from_environment) and is ready only after its warm-up. Every request but
the probes passes the guard first (serving/guard.py: API keys, per-client rate limits).

The hot path: a well-formed ``GET /v1/users/{user_id}/recommendations`` is answered by `FastRecommendations`, an
ASGI middleware below the guard, the metrics and the in-flight limit, without FastAPI's routing, dependency
injection and response classes (they were a third of a request's CPU). Anything it does not recognise as
well-formed goes on to the FastAPI route, whose answers (every 422 included) stay the reference.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated

import orjson
import uvicorn
from fastapi import FastAPI, Path, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.collector import freeze_startup_objects
from core.environment import export_metrics_folder, export_settings
from core.errors import NightscoreError
from core.ids import id_problem
from core.settings import load_settings
from serving.batcher import scoring_for
from serving.config import DEFAULT_N, MAX_N, ServedId, ServingConfig, serving_config
from serving.errors import NotReady, Overloaded, PayloadTooLarge, ServingError, error_response
from serving.events import EventIntake, add_event_route
from serving.guard import Guard, check_access
from serving.metrics import CONTENT_TYPE, Metrics
from serving.ranking import CACHE_OK, Recommendation, Recommender, build_recommender
from storage.cache_async import CacheReader
from storage.events import EventStore
from storage.resources import cache_for, stores_for

log = logging.getLogger(__name__)

RECOMMEND_PREFIX = "/v1/users/"
RECOMMEND_SUFFIX = "/recommendations"
JSON_HEADERS = (b"content-type", b"application/json")
EVENTS_PATH = "/v1/events"
PLAIN_ENDPOINTS = ("/healthz", "/readyz", "/metrics", EVENTS_PATH)
MAX_EVENT_BYTES = 4096

Stores = tuple[CacheReader, EventStore]


def endpoint_of(path: str) -> str:
    """Return the metrics label of a request path (bounded: never the user id)."""
    if path.startswith(RECOMMEND_PREFIX) and path.endswith(RECOMMEND_SUFFIX):
        return "recommendations"
    return path.lstrip("/") if path in PLAIN_ENDPOINTS else "other"


def recommendation_body(recommendation: Recommendation) -> bytes:
    """Return the JSON body of an answer (orjson: a tenth of json.dumps' time).

    Raises:
        ValueError: a score is not finite (json.dumps' allow_nan=False refused it too; orjson would write null).
    """
    if not all(map(math.isfinite, recommendation.scores)):
        raise ValueError(f"non-finite score in the answer for user {recommendation.user_id!r}")
    return orjson.dumps(recommendation.as_json())


def well_formed_request(scope: Scope) -> tuple[str, int] | None:
    """Return (user id, n) of a plain GET of recommendations with a valid id and n, else None (the route decides)."""
    path, query = scope["path"], scope["query_string"]
    if scope["method"] != "GET" or scope.get("root_path") or not path.startswith(RECOMMEND_PREFIX):
        return None
    if not path.endswith(RECOMMEND_SUFFIX) or len(path) <= len(RECOMMEND_PREFIX) + len(RECOMMEND_SUFFIX):
        return None
    user_id = path[len(RECOMMEND_PREFIX) : -len(RECOMMEND_SUFFIX)]  # as the route's greedy {user_id:path} takes it
    if id_problem(user_id) is not None:
        return None
    if not query:
        return user_id, DEFAULT_N
    digits = query[2:]
    if not query.startswith(b"n=") or not digits.isdigit() or len(digits) > 3 or not 1 <= int(digits) <= MAX_N:
        return None  # any other query (a second parameter, a sign, spaces) is the route's to parse
    return user_id, int(digits)


class FastRecommendations:
    """ASGI middleware answering well-formed recommendation requests itself; any other request goes on to the app."""

    def __init__(self, app: ASGIApp, recommender: Recommender) -> None:
        self.app, self.recommender = app, recommender

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        asked = well_formed_request(scope) if scope["type"] == "http" else None
        if asked is None:
            await self.app(scope, receive, send)
            return
        try:
            body = recommendation_body(await self.recommender.recommend(*asked))
        except (ServingError, NightscoreError) as exc:  # what the route's exception handlers answer
            await error_response(exc)(scope, receive, send)
            return
        headers = [(b"content-length", str(len(body)).encode()), JSON_HEADERS]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


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


class BodyLimit:
    """ASGI middleware refusing (413) a request body at one path larger than max_bytes, declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int, path: str) -> None:
        self.app, self.max_bytes, self.path = app, max_bytes, path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        too_large = PayloadTooLarge(f"request body over {self.max_bytes} bytes")
        if not declared.isdigit() or int(declared) > self.max_bytes:
            await error_response(too_large)(scope, receive, send)
            return
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise too_large
            return message

        await self.app(scope, bounded, send)


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

    @app.get("/v1/users/{user_id:path}/recommendations")  # :path: an id may hold a '/' (sent as %2F)
    async def recommendations(
        user_id: Annotated[ServedId, Path()], n: Annotated[int, Query(ge=1, le=MAX_N)] = DEFAULT_N
    ) -> Response:
        """Return the user's top-n items by the ranker, or popular items marked as a fallback."""
        return Response(recommendation_body(await recommender.recommend(user_id, n)), media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Return 200 while the process runs."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> dict[str, str | None]:
        """Return 200 when requests get answers (degraded: by the fallback, the cache down or empty), else 503."""
        cache = await recommender.cache_state()
        metrics.degraded(cache != CACHE_OK)
        if not recommender.can_answer(cache):
            raise NotReady(f"candidate cache {cache.replace('_', ' ')} and the fallback is off")
        status = "ready" if cache == CACHE_OK else "degraded"
        return {"status": status, "cache": cache, "model_version": recommender.model_version}

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


def _lifespan(
    config: ServingConfig, recommender: Recommender, stores: Callable[[], Stores] | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Return a lifespan opening the cache reader and event store in the worker's loop, warming up, closing them after."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        reader, events = stores() if stores else stores_for(config.settings)
        recommender.reader, app.state.events = reader, events
        await recommender.warm_up()
        yield
        await events.close()
        await reader.close()

    return lifespan


def create_app(config: ServingConfig, *, stores: Callable[[], Stores] | None = None) -> FastAPI:
    """Return the service with its model loaded; the cache reader opens (and the model warms up) at startup.

    Args:
        config: the serving options.
        stores: opens (reader, event store) instead of the settings' cache (tests: a reader that blocks).

    Raises:
        UsageError: the service has no API keys and allow_no_keys is off.
        ModelLoadError: no published run, or what it serves with cannot be loaded.
    """
    check_access(config.options)
    metrics = Metrics()
    options = config.options
    scoring = scoring_for(options.batching, options.max_batch, options.max_queue_delay_us, metrics.batch)
    with cache_for(config.settings, retries=0) as cache:  # the pointer names the first run
        recommender = build_recommender(config, cache, scoring, metrics.fallback)
    app = FastAPI(title="nightscore ranker", lifespan=_lifespan(config, recommender, stores))
    app.state.recommender, app.state.metrics = recommender, metrics
    _add_routes(app, recommender, metrics)
    add_event_route(app, EVENTS_PATH, EventIntake(recommender, options.events_max_age_s, metrics.dropped))
    _add_error_handlers(app)
    app.add_middleware(FastRecommendations, recommender=recommender)  # innermost: behind the limit, guard, metrics
    app.add_middleware(InFlightLimit, limit=options.max_in_flight, prefix=RECOMMEND_PREFIX)
    app.add_middleware(BodyLimit, max_bytes=MAX_EVENT_BYTES, path=EVENTS_PATH)
    app.add_middleware(Guard, options=options)  # before any work: keys and rate limits
    app.add_middleware(RequestMetrics, metrics=metrics)  # added last = outermost: counts the 401s and 429s too
    return app


def app_from_environment() -> FastAPI:
    """Return the app of one uvicorn worker, built from the options run_server exported (uvicorn's factory)."""
    from threadpoolctl import threadpool_limits

    config = serving_config(load_settings())  # the settings `nightscore serve` exported to its workers
    threadpool_limits(config.options.blas_threads)  # small matrices per call: more BLAS threads only add overhead
    app = create_app(config)
    freeze_startup_objects()
    return app


def run_server(
    config: ServingConfig, host: str = "127.0.0.1", port: int = 8000, *, workers: int = 1, log_level: str = "info"
) -> None:
    """Serve under uvicorn (uvloop/httptools when installed) with `workers` processes until stopped (SIGINT/SIGTERM).

    With more than one worker, their metrics go to a fresh folder (prometheus_client's multiprocess mode, removed
    after) and /metrics sums every worker's: a scrape answered by either one never sees a counter go back.

    Raises:
        UsageError: the service has no API keys and allow_no_keys is off (before any worker starts).
    """
    check_access(config.options)
    export_settings(config.settings)
    folder = tempfile.mkdtemp(prefix="nightscore-metrics-") if workers > 1 else None
    if folder is not None:
        export_metrics_folder(folder)  # read by prometheus_client when each worker imports it
    try:
        uvicorn.run(
            "serving.app:app_from_environment",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level=log_level,
            access_log=False,
            loop="auto",
            http="auto",
        )
    finally:
        if folder is not None:
            export_metrics_folder(None)
            shutil.rmtree(folder, ignore_errors=True)
