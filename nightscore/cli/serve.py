"""`nightscore serve`: the online ranker under uvicorn."""

from __future__ import annotations

from pathlib import Path

import typer

from nightscore.cli.app import HomeOption, command_settings


def serve(
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    host: str = typer.Option("127.0.0.1", "--host"),
    workers: int = typer.Option(1, "--workers", min=1, help="Worker processes (each loads and warms up its own app)."),
    home: Path | None = HomeOption,
) -> None:
    """Serve GET /v1/users/{user_id}/recommendations and POST /v1/events from the cache with each run's ranker."""
    cfg = command_settings(home, "serve")
    from serving.app import run_server  # imported here for start-up speed: FastAPI and the ranker's models
    from serving.config import serving_config

    run_server(serving_config(cfg), host=host, port=port, workers=workers)
