"""Flow tier: real catalogue defects through a whole nightly run — valid U+FFFD kept, invalid bytes quarantined per
row, one copy of a repeated id kept by policy, and the run's summary artifact saying what was quarantined and
truncated (issue 18, items 11, 12 and 13)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.client.schemas.sorting import ArtifactSort

from core.settings import load_settings
from flows.nightly import nightly
from flows.params import NightlyParams
from nightscore.demo import generate_demo_data
from storage.resources import warehouse_for


def catalogue(folder: Path) -> tuple[Path, pl.DataFrame]:
    """Write 200 demo items with a legit U+FFFD text, one row of invalid bytes and an id exported three times."""
    items, interactions = generate_demo_data(200, 40, seed=11)
    ids, bodies, stamps = items["item_id"].to_list(), items["body"].to_list(), items["created_at"].to_list()
    bodies[5] = "Caf\ufffd menu: the replacement character is part of this real description"
    ids[30] = ids[40] = ids[20]  # one item, three versions of it
    stamps[20], stamps[30], stamps[40] = (datetime(2026, 11, d, tzinfo=UTC) for d in (3, 9, 1))
    bodies[30] = "the version exported last, and the one to keep"
    items = items.with_columns(pl.Series("item_id", ids), pl.Series("body", bodies), pl.Series("created_at", stamps))
    raw = [b.encode() for b in bodies]
    raw[7] = b"caf\xe9 \xff bytes that are not UTF-8"
    binary = pa.array(raw, type=pa.binary())
    table = items.drop("body").to_arrow().append_column("body", pa.Array.from_buffers(pa.string(), len(binary), binary.buffers()))
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "items.parquet")
    interactions.write_parquet(folder / "interactions.parquet")
    return folder, items


def test_a_catalogue_with_replacement_characters_bad_bytes_and_repeated_ids(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NIGHTSCORE_DUPLICATE_ID_POLICY", "keep_latest")
    monkeypatch.setenv("NIGHTSCORE_MAX_SEQ_LENGTH", "16")  # most demo texts are longer: truncation to report
    folder, items = catalogue(tmp_path / "in")
    published = nightly(
        NightlyParams(
            items_uri=str(folder / "items.parquet"), interactions_uri=str(folder / "interactions.parquet"), run_date="2026-11-30"
        )
    )

    warehouse = warehouse_for(load_settings())
    rules = dict(warehouse.query("SELECT rule, count(*) FROM quarantine WHERE dataset = 'items' GROUP BY rule").rows)
    assert rules == {"text:valid_utf8": 1, "item_id:duplicate_not_kept": 2}
    assert published.record.rows_scored == 197
    scored = dict(
        warehouse.query(
            "SELECT item_id, content_hash FROM latest_item_scores WHERE item_id IN (?, ?)",
            [items["item_id"][5], items["item_id"][20]],
        ).rows
    )
    kept = f"{items['title'][30]}\n{items['body'][30]}"
    assert scored[items["item_id"][20]] == hashlib.sha256(kept.encode()).hexdigest()  # the latest version won
    assert items["item_id"][5] in scored  # a valid U+FFFD is scored, not quarantined

    with get_client(sync_client=True) as client:
        [summary] = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["nightly-summary"])),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )
    text = str(summary.data)
    assert "| items | `item_id:duplicate_not_kept` | 2 |" in text and "| items | `text:valid_utf8` | 1 |" in text
    truncated = published.record.truncated_texts
    assert truncated > 0 and f"**Warning:** {truncated} of the run's {published.record.rows_scored} texts" in text
