"""Flow tier, real processes: an S3 lake whose connections reset ends a command with exit 1 naming the cause, while a
corrupt file stays a contract failure with exit 3 (issue 18, item 9)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nightscore.demo import generate_demo_data
from storage.lake import Lake
from tests.flow.test_resilience import CLI
from tests.helpers import UNGATED
from tests.servers import ResettingProxy, proxy, s3_bucket, s3_endpoint  # noqa: F401 - fixtures
from tests.tiny_model import tiny_environment


@pytest.fixture
def inputs(s3_bucket: str) -> tuple[str, str]:
    """Write demo inputs and a corrupt items file into the bucket; return (items URI, interactions URI)."""
    lake = Lake(s3_bucket, {"use_listings_cache": False})
    items, interactions = generate_demo_data(80, 20, seed=1)
    lake.write_parquet(items, lake.uri("in", "items.parquet"))
    lake.write_parquet(interactions, lake.uri("in", "interactions.parquet"))
    lake.write_bytes(b"PAR1 truncated export", lake.uri("in", "corrupt.parquet"))
    return lake.uri("in", "items.parquet"), lake.uri("in", "interactions.parquet")


def command(*args: str, home: Path, bucket: str, endpoint: str, api: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI on an S3 lake at bucket through endpoint, with one quick lake retry; return the finished process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSCORE_")}
    env.update(
        NIGHTSCORE_LAKE_URL=bucket,
        NIGHTSCORE_S3_ENDPOINT_URL=endpoint,
        NIGHTSCORE_LAKE_RETRIES="1",
        NIGHTSCORE_LAKE_RETRY_BACKOFF_S="0.1",
        AWS_MAX_ATTEMPTS="1",
        **tiny_environment(),
        **UNGATED,
    )
    if api:
        env["PREFECT_API_URL"] = api
    return subprocess.run([CLI, *args, "--home", str(home)], env=env, capture_output=True, text=True, timeout=600)


def test_contracts_check_tells_a_reset_lake_from_a_corrupt_file(
    s3_bucket: str, proxy: ResettingProxy, inputs: tuple[str, str], tmp_path: Path
) -> None:
    items, interactions = inputs
    corrupt = items.replace("items.parquet", "corrupt.parquet")
    bad = command(
        "contracts",
        "check",
        "--items",
        corrupt,
        "--interactions",
        interactions,
        home=tmp_path,
        bucket=s3_bucket,
        endpoint=proxy.url,
    )
    assert bad.returncode == 3 and "not a readable Parquet file" in bad.stderr, bad.stderr
    proxy.cut()
    down = command(
        "contracts",
        "check",
        "--items",
        items,
        "--interactions",
        interactions,
        home=tmp_path,
        bucket=s3_bucket,
        endpoint=proxy.url,
    )
    errors = [line for line in down.stderr.splitlines() if line.startswith("nightscore: ")]
    assert down.returncode == 1 and len(errors) == 1, down.stderr
    assert errors[0].startswith("nightscore: error: lake unavailable: ") and "failed 2 time(s)" in errors[0]
    assert "retrying in" in down.stderr  # the retry is logged


def test_a_nightly_run_on_a_reset_lake_exits_1_naming_the_lake(
    s3_bucket: str, proxy: ResettingProxy, inputs: tuple[str, str], tmp_path: Path, prefect_server: str
) -> None:
    items, interactions = inputs
    proxy.cut()
    done = command(
        "run",
        "nightly",
        "--items",
        items,
        "--interactions",
        interactions,
        "--run-date",
        "2026-11-30",
        home=tmp_path / "home",
        bucket=s3_bucket,
        endpoint=proxy.url,
        api=prefect_server,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("nightscore: ")]
    assert len(errors) == 1 and errors[0].startswith("nightscore: error: lake unavailable: "), errors
    assert "unexpected" not in errors[0] and "Traceback" not in done.stderr
