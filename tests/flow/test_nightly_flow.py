"""Flow tier: the whole nightly flow on a few hundred demo rows with the tiny encoder, real Prefect."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from core.errors import ContractViolation, InputUnreadable
from core.settings import load_settings
from nightscore.check import check_inputs, check_report
from nightscore.demo import generate_demo_data
from storage.candidate_payload import decode_entry
from storage.resources import cache_for, lake_for, warehouse_for

RUN_DATE = "2026-11-30"


def write_inputs(folder: Path, items: pl.DataFrame, interactions: pl.DataFrame) -> tuple[str, str]:
    """Write inputs as Parquet and return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    items.write_parquet(folder / "items.parquet")
    interactions.write_parquet(folder / "interactions.parquet")
    return str(folder / "items.parquet"), str(folder / "interactions.parquet")


def scalar(sql: str) -> object:
    """Return the single value of a query on the test's warehouse."""
    return warehouse_for(load_settings()).query(sql).rows[0][0]


from core.records import Published  # noqa: E402
from flows.nightly import nightly as nightly_flow  # noqa: E402
from flows.params import NightlyParams, TrainRankerParams  # noqa: E402


def nightly(**params: object) -> Published:
    """Run the nightly flow with NightlyParams built from keyword arguments."""
    return nightly_flow(NightlyParams(**params))


def test_nightly_publishes_scores_candidates_and_cache(tiny: Path, tmp_path: Path) -> None:
    items, interactions = generate_demo_data(300, 60, seed=3)
    items_uri, inter_uri = write_inputs(tmp_path / "in", items, interactions)
    summary = nightly(run_date=RUN_DATE, items_uri=items_uri, interactions_uri=inter_uri)

    assert summary.record.status == "published"
    assert summary.record.rows_in == summary.record.rows_scored + summary.record.rows_quarantined == 300
    assert scalar("select count(*) from latest_item_scores") == 300
    assert scalar("select count(distinct user_id) from latest_user_candidates") == interactions["user_id"].n_unique()
    assert scalar("select max(c) from (select count(*) c from latest_user_candidates group by user_id)") == 20
    assert scalar("select count(*) from scoring_runs where status = 'published'") == 1
    record = summary.record
    assert record.padding_efficiency is not None and 0 < record.padding_efficiency <= 1
    assert record.real_tokens > 0
    assert record.recall_at_k is not None and record.popularity_ndcg_at_10 is not None
    assert 0 <= record.recall_at_k <= 1 and 0 <= record.popularity_ndcg_at_10 <= 1
    assert scalar("select recall_at_k from latest_run") == pytest.approx(summary.record.recall_at_k)

    cache = cache_for(load_settings())
    cached = cache.read(interactions["user_id"][0])
    assert cached is not None
    run_id, blob = cached
    entry = decode_entry(blob)
    item_ids = entry.item_ids
    assert run_id == summary.run_id and len(item_ids) == 20 and entry.features.shape[0] == 20
    published = warehouse_for(load_settings()).query(
        "select item_id from latest_user_candidates where user_id = ? order by rank", [interactions["user_id"][0]]
    )
    assert [r[0] for r in published.rows] == item_ids


def test_bad_rows_are_quarantined_and_the_rest_scored(tiny: Path, tmp_path: Path) -> None:
    items, interactions = generate_demo_data(300, 60, seed=4)
    items = items.with_columns(
        pl.when(pl.int_range(pl.len()) == 5).then(pl.lit("   ")).otherwise(pl.col("body")).alias("body"),
        pl.when(pl.int_range(pl.len()) == 5).then(None).otherwise(pl.col("title")).alias("title"),
    )
    items_uri, inter_uri = write_inputs(tmp_path / "in", items, interactions)
    summary = nightly(run_date=RUN_DATE, items_uri=items_uri, interactions_uri=inter_uri)

    assert summary.record.rows_quarantined == 1 and summary.record.rows_scored == 299
    reasons = warehouse_for(load_settings()).query("select dataset, row_key, rule from quarantine").rows
    assert ("items", items["item_id"][5], "text:not_blank") in reasons
    # interactions of the quarantined item are quarantined with their own reason, not dropped silently
    bad_item_events = interactions.filter(pl.col("item_id") == items["item_id"][5]).height
    assert summary.record.interactions_quarantined == bad_item_events


def test_failed_contract_publishes_nothing_and_keeps_previous(tiny: Path, tmp_path: Path) -> None:
    items, interactions = generate_demo_data(200, 40, seed=5)
    good = nightly(
        run_date=RUN_DATE,
        items_uri=write_inputs(tmp_path / "good", items, interactions)[0],
        interactions_uri=str(tmp_path / "good" / "interactions.parquet"),
    )
    cache = cache_for(load_settings())
    user = interactions["user_id"][0]
    before = cache.read(user)

    broken = items.with_columns(
        pl.when(pl.int_range(pl.len()) % 5 == 0).then(pl.lit("")).otherwise(pl.col("body")).alias("body"),
        pl.lit(None, dtype=pl.String).alias("title"),
    )
    bad_items, bad_inter = write_inputs(tmp_path / "bad", broken, interactions)
    with pytest.raises(ContractViolation, match="items: 40 of 200 rows quarantined"):
        nightly(run_date="2026-12-01", items_uri=bad_items, interactions_uri=bad_inter)

    assert scalar("select run_id from latest_run") == good.run_id
    assert scalar("select count(*) from item_scores") == 200
    assert scalar("select status from scoring_runs where run_date = date '2026-12-01'") == "failed"
    assert (
        scalar(
            "select count(*) from quarantine q join scoring_runs r using (run_id) "
            "where r.status = 'failed' and q.dataset = 'items'"
        )
        == 40
    )
    assert cache.read(user) == before and cache.current() == good.run_id


def test_contracts_check_compares_with_the_published_run_as_a_run_does(tiny: Path, tmp_path: Path) -> None:
    """A catalogue grown past the row-count band: `contracts check` refuses it as the next run does, and says why."""
    items, interactions = generate_demo_data(120, 30, seed=3)
    first = nightly(run_date=RUN_DATE, **inputs(write_inputs(tmp_path / "first", items, interactions)))
    cfg = load_settings()
    grown = write_inputs(tmp_path / "grown", *generate_demo_data(300, 30, seed=3))
    check = check_inputs(lake_for(cfg), cfg, *grown, warehouse=warehouse_for(cfg))
    report = check_report(check, cfg.contracts.quarantine_max_share)
    assert not check.passed(cfg.contracts.quarantine_max_share), report
    assert f"compared with the published run {first.run_id} (2026-11-30)" in report
    assert "the previous published run had 120 rows; NIGHTSCORE_ROW_COUNT_BAND=0.5" in report
    with pytest.raises(ContractViolation, match="previous published run had 120 rows"):
        nightly(run_date="2026-12-01", **inputs(grown))
    same = check_inputs(lake_for(cfg), cfg, *write_inputs(tmp_path / "same", items, interactions), warehouse=warehouse_for(cfg))
    assert same.passed(cfg.contracts.quarantine_max_share), check_report(same, cfg.contracts.quarantine_max_share)


def inputs(paths: tuple[str, str]) -> dict[str, str]:
    """Return the nightly flow's input parameters of (items, interactions) paths."""
    return {"items_uri": paths[0], "interactions_uri": paths[1]}


def test_unreadable_input_fails_with_the_file_named(tiny: Path, tmp_path: Path) -> None:
    items, interactions = generate_demo_data(50, 10, seed=6)
    items_uri, inter_uri = write_inputs(tmp_path / "in", items.drop("body"), interactions)
    with pytest.raises(InputUnreadable, match=r"items file .*items.parquet: missing required column\(s\) body"):
        nightly(run_date=RUN_DATE, items_uri=items_uri, interactions_uri=inter_uri)
    Path(inter_uri).write_bytes(Path(inter_uri).read_bytes()[:100])
    items_uri, _ = write_inputs(tmp_path / "in2", items, interactions)
    with pytest.raises(InputUnreadable, match=r"interactions file .*: not a readable Parquet file"):
        nightly(run_date=RUN_DATE, items_uri=items_uri, interactions_uri=inter_uri)


def test_republishing_a_run_date_replaces_its_rows(tiny: Path, tmp_path: Path) -> None:
    items, interactions = generate_demo_data(120, 30, seed=7)
    items_uri, inter_uri = write_inputs(tmp_path / "in", items, interactions)
    first = nightly(run_date=RUN_DATE, items_uri=items_uri, interactions_uri=inter_uri)
    second = nightly(run_date=RUN_DATE, items_uri=items_uri, interactions_uri=inter_uri)

    assert first.run_id != second.run_id
    assert scalar("select count(*) from item_scores") == 120
    assert scalar("select run_id from latest_run") == second.run_id
    assert scalar(f"select status from scoring_runs where run_id = '{first.run_id}'") == "replaced"


def test_lake_partitions_rollback_and_drifted_outputs(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hive partitions mirror the warehouse; rollback moves views and cache together; drift fails the output suite."""
    import duckdb

    from storage.publication import rollback

    items, interactions = generate_demo_data(200, 40, seed=8)
    items_uri, inter_uri = write_inputs(tmp_path / "in", items, interactions)
    first = nightly(run_date="2026-11-29", items_uri=items_uri, interactions_uri=inter_uri)
    second = nightly(run_date=RUN_DATE, items_uri=items_uri, interactions_uri=inter_uri)
    lake = Path(load_settings().lake_root)
    relation = duckdb.sql(
        f"select run_date, count(*) from read_parquet('{lake}/outputs/item_scores/*/*.parquet', "
        "hive_partitioning = true) group by all order by 1"
    )
    assert relation is not None
    hive = relation.fetchall()
    assert [(str(d), n) for d, n in hive] == [("2026-11-29", 200), (RUN_DATE, 200)]

    cache = cache_for(load_settings())
    assert rollback(warehouse_for(load_settings()), cache) == (second.run_id, first.run_id)
    assert scalar("select run_id from latest_run") == first.run_id and cache.current() == first.run_id

    drifted = items.with_columns(
        pl.lit("football match").alias("title"),
        pl.lit("the striker scored a goal in the league match at the stadium").alias("body"),
    )
    drift_items, _ = write_inputs(tmp_path / "drift", drifted, interactions)
    # the tiny random encoder puts ~92% of these texts in one topic already: every item there moves its share by 0.08
    monkeypatch.setenv("NIGHTSCORE_TOPIC_SHARE_TOLERANCE", "0.05")
    with pytest.raises(ContractViolation, match="dataset suite failed: item_scores"):
        nightly(run_date="2026-12-02", items_uri=drift_items, interactions_uri=inter_uri)
    assert scalar("select run_id from latest_run") == first.run_id and cache.current() == first.run_id


def test_published_candidates_are_served_by_the_trained_ranker(tiny: Path, tmp_path: Path) -> None:
    """The nightly run feeds the service: train the ranker on it, then ask for a user's recommendations."""
    from fastapi.testclient import TestClient

    from flows.train_ranker import train_ranker
    from serving.app import create_app
    from serving.config import serving_config

    items, interactions = generate_demo_data(300, 60, seed=9)
    published = nightly(
        run_date=RUN_DATE,
        items_uri=write_inputs(tmp_path / "in", items, interactions)[0],
        interactions_uri=str(tmp_path / "in" / "interactions.parquet"),
    )
    trained = train_ranker(TrainRankerParams())
    assert 0.0 <= trained.metrics["ranked.ndcg_at_10"] <= 1.0 and trained.trained_on == published.run_id
    cfg = load_settings()
    with TestClient(create_app(serving_config(cfg, open_reads=True, api_keys=["flow-test-key-0123456789"]))) as client:
        user = interactions["user_id"][0]
        body = client.get(f"/v1/users/{user}/recommendations", params={"n": 5}).json()
        assert body["run_id"] == published.run_id and body["model_version"] == trained.version
        assert not body["fallback"] and len(body["items"]) == 5
        candidates = {
            r[0] for r in warehouse_for(cfg).query("select item_id from latest_user_candidates where user_id = ?", [user]).rows
        }
        assert {item["item_id"] for item in body["items"]} <= candidates
        assert client.get("/v1/users/nobody/recommendations").json()["fallback"] == "popular"
