"""Flow tier: the lake stops growing without bound — Data Docs assets kept once, `nightscore prune` removing the
folders of pruned and superseded runs — and the run summary's Data Docs links work from another machine
(issue 18, item 14)."""

from __future__ import annotations

import functools
import re
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import polars as pl
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.client.schemas.sorting import ArtifactSort

from core.errors import ContractViolation
from core.settings import load_settings
from flows.nightly import nightly
from flows.params import NightlyParams
from nightscore import cli
from storage.resources import warehouse_for
from tests.helpers import demo_inputs


def run(folder: Path, run_date: str) -> str:
    """Run the nightly flow on the inputs in folder; return the run id."""
    return nightly(
        NightlyParams(
            items_uri=str(folder / "items.parquet"), interactions_uri=str(folder / "interactions.parquet"), run_date=run_date
        )
    ).run_id


def folder_bytes(path: Path) -> int:
    """Return the bytes of every file under path."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def latest_artifact(key: str) -> str:
    """Return the data of the newest artifact with this key."""
    with get_client(sync_client=True) as client:
        [artifact] = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC, limit=1
        )
    return str(artifact.data)


class QuietHandler(SimpleHTTPRequestHandler):
    """A static-file handler that does not log each request to stderr."""

    def log_message(self, format: str, *args: object) -> None:
        """Drop the request line."""


@pytest.fixture
def lake_over_http(tiny: Path) -> Iterator[str]:
    """Serve the test's lake root over HTTP on loopback, as a static site or an S3 website would; return its URL."""
    root = Path(load_settings().lake_root)
    root.mkdir(parents=True, exist_ok=True)
    handler = functools.partial(QuietHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_data_docs_assets_are_kept_once_and_the_summary_links_work_over_http(
    tiny: Path, tmp_path: Path, lake_over_http: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = demo_inputs(tmp_path / "in", items=120, users=30, seed=2)
    first = run(folder, "2026-11-29")
    monkeypatch.setenv("NIGHTSCORE_DATA_DOCS_BASE_URL", lake_over_http)
    second = run(folder, "2026-11-30")

    lake = Path(load_settings().lake_root)
    assert [p.name for p in (lake / "contracts" / "docs-static").iterdir()]  # one shared copy per GX version
    for run_date, run_id in (("2026-11-29", first), ("2026-11-30", second)):
        docs = lake / "runs" / run_date / run_id / "contracts" / "docs"
        assert sorted(p.name for p in docs.iterdir()) == ["interactions", "item_scores", "items", "user_candidates"]
        assert not list(docs.rglob("static")) and folder_bytes(docs) < 1_000_000  # pages only (~16 MB of copies before)

    summary = latest_artifact("nightly-summary")
    assert "file://" not in summary
    contracts = re.search(r"\[results of every expectation\]\(/artifacts/artifact/([0-9a-f-]{36})\)", summary)
    assert contracts, summary  # a page of the Prefect UI itself: reachable wherever the UI is
    table = latest_artifact("nightly-contracts")
    assert "## item_scores (suite v" in table and "`expect_table_row_count_to_be_between`" in table and "| ok |" in table
    pages = re.findall(r"\[(\w+)\]\((http://127\.0\.0\.1:\d+/[^)]+/index\.html)\)", summary)
    assert {name for name, _ in pages} == {"items", "interactions", "item_scores", "user_candidates"}
    for _, url in pages:
        html = urllib.request.urlopen(url, timeout=10).read().decode()
        favicon = re.search(r'href="([^"]*favicon\.ico)"', html)
        assert favicon and "docs-static" in favicon.group(1)
        assert urllib.request.urlopen(urllib.parse.urljoin(url, favicon.group(1)), timeout=10).status == 200


def test_prune_removes_the_lake_folders_of_pruned_and_superseded_runs(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = demo_inputs(tmp_path / "in", items=120, users=30, seed=3)
    old = [run(good, day) for day in ("2026-11-27", "2026-11-28")]
    bad = tmp_path / "bad"
    bad.mkdir()
    items = pl.read_parquet(good / "items.parquet")
    blank = items.with_columns(pl.lit("").alias("body"), pl.lit(None, dtype=pl.String).alias("title"))
    blank.write_parquet(bad / "items.parquet")
    (bad / "interactions.parquet").write_bytes((good / "interactions.parquet").read_bytes())
    with pytest.raises(ContractViolation):
        run(bad, "2026-11-30")  # a failed attempt of the date...
    replaced = run(good, "2026-11-30")  # ...superseded by its publication, which the date's next run replaces
    latest = run(good, "2026-11-30")
    runs = dict(warehouse_for(load_settings()).query("SELECT run_id, status FROM scoring_runs").rows)
    [failed] = [run_id for run_id, status in runs.items() if status == "failed"]
    assert runs[replaced] == "replaced"
    lake = Path(load_settings().lake_root)
    dated = ((old[0], "2026-11-27"), (old[1], "2026-11-28"), (failed, "2026-11-30"), (replaced, "2026-11-30"))
    folders = {run_id: lake / "runs" / day / run_id for run_id, day in (*dated, (latest, "2026-11-30"))}
    assert all(path.is_dir() for path in folders.values())
    capsys.readouterr()

    # all three published runs are kept: only the failed attempt and the replaced run (and its serving folder) go
    assert cli.main(["prune", "--keep-runs", "3", "--home", str(tiny)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"pruned 0 run\(s\); removed 3 lake folder\(s\), [0-9.]+ MB", out), out
    assert [run_id for run_id, path in folders.items() if path.exists()] == [*old, latest]
    assert not (lake / "serving" / replaced).exists()

    assert cli.main(["prune", "--keep-runs", "1", "--home", str(tiny)]) == 0
    out = capsys.readouterr().out
    # the old runs' rows go, and the quarantine and metrics rows of the attempt and the replaced run; 2 runs + 2 features
    assert re.search(r"pruned 4 run\(s\); removed 4 lake folder\(s\), [0-9.]+ MB", out), out
    assert [run_id for run_id, path in folders.items() if path.exists()] == [latest]
    assert not (lake / "serving" / old[0]).exists() and not (lake / "serving" / replaced).exists()
    assert (lake / "serving" / latest).is_dir()
    partitions = sorted(p.name for p in (lake / "outputs" / "item_scores").iterdir() if not p.name.startswith("_"))
    assert partitions == ["run_date=2026-11-30"]
    assert warehouse_for(load_settings()).query("SELECT run_id FROM latest_run").rows == [(latest,)]
