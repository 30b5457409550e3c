"""Flow tier: the candidate stage inside a real nightly run: retrieval_metrics, the gate, the ranker the run serves with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from core.errors import ContractViolation
from core.records import Published
from core.settings import load_settings
from flows.nightly import nightly
from flows.params import NightlyParams, TrainRankerParams
from flows.train_ranker import train_ranker
from models.recommender import candidate_stage
from models.recommender.fusion import FusionParams, select_slots, source_only
from nightscore.output import summary_text
from storage.artifacts import read_neighbours, read_scorer_bytes, read_serving
from storage.candidate_payload import decode_entry
from storage.resources import cache_for, lake_for, warehouse_for
from tests.helpers import demo_inputs

SOURCE_LISTS = {"als", "content", "content_new", "cooccurrence", "topic_trending", "trending"}


def run(folder: Path, run_date: str) -> Published:
    """Run the nightly flow on a folder of demo inputs."""
    return nightly(
        NightlyParams(
            run_date=run_date, items_uri=str(folder / "items.parquet"), interactions_uri=str(folder / "interactions.parquet")
        )
    )


def test_a_run_records_every_method_on_held_out_interactions_and_serves_its_own_ranker(tiny: Path, tmp_path: Path) -> None:
    published = run(demo_inputs(tmp_path / "in", items=400, users=120, seed=2), "2026-11-30")
    warehouse = warehouse_for(load_settings())
    rows = warehouse.query("SELECT method, metric, value FROM retrieval_metrics WHERE run_id = ?", [published.run_id]).rows
    methods = {method for method, _, _ in rows}
    assert SOURCE_LISTS | {"popularity", "fused", "fused_rrf", "split"} <= methods, methods
    assert {metric for method, metric, _ in rows if method == "fused"} == {
        "recall_at_k",
        "ndcg_at_10",
        "cold_recall_at_k",
        "coverage_at_k",
    }
    fused = {metric: value for method, metric, value in rows if method == "fused"}
    assert published.record.recall_at_k == pytest.approx(fused["recall_at_k"])
    assert published.record.ranker_kind in ("lightgbm", "mlp")
    text = summary_text(published)
    assert "fused recall@K" in text and "    popularity" in text and "cold recall" in text

    # the per-source columns of user_candidates say where each candidate came from
    sources = warehouse.query("SELECT sources, rank_cooccurrence, score_als FROM latest_user_candidates LIMIT 200").rows
    assert all(row[0] and set(row[0].split(",")) <= SOURCE_LISTS for row in sources)
    # the served feature rows are the ranker's: same feature set, and the ranker can be loaded from the lake
    lake = lake_for(load_settings())
    serving = read_serving(lake, published.run_id)
    assert serving is not None and serving["ranker_version"] == published.record.ranker_version
    assert read_scorer_bytes(lake, serving["ranker_version"])
    # the co-visitation neighbours the service boosts with, capped per item and named in serving.json
    assert serving["neighbours"] == f"serving/{published.run_id}/neighbours.parquet"
    neighbours = read_neighbours(lake, serving["neighbours"])
    per_item = neighbours.group_by("item_id").len().get_column("len").to_list()
    assert neighbours.height > 0 and max(per_item) <= load_settings().candidates.cooc_serving_neighbours
    with cache_for(load_settings()) as cache:
        user = warehouse.query("SELECT user_id FROM latest_user_candidates LIMIT 1").rows[0][0]
        cached = cache.read(user)
        assert cached is not None
        entry = decode_entry(cached[1])
    assert entry.feature_set == serving["feature_set"] and entry.features.shape[1] == len(serving["feature_names"])
    ranked = warehouse.query("SELECT item_id FROM latest_user_candidates WHERE user_id = ? ORDER BY rank", [user]).rows
    assert entry.item_ids == [r[0] for r in ranked]


def reversed_order(fused_rows: np.ndarray, features: np.ndarray, scorer: object) -> np.ndarray:
    """Return each user's filled candidates in reverse fused order: a stage two broken on purpose."""
    out = fused_rows.copy()
    for row in out:
        filled = int((row >= 0).sum())
        row[:filled] = row[:filled][::-1]
    return out


def test_a_stage_two_that_ranks_held_out_users_worse_than_the_fused_order_is_not_served(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(candidate_stage, "rerank", reversed_order)  # both kinds, as measured on the held-out users
    published = run(demo_inputs(tmp_path / "in", items=400, users=120, seed=2), "2026-11-30")
    ndcg = {q.method: q.ndcg_at_10 for q in published.quality}
    assert ndcg["fused"] is not None and max(ndcg["ranked_lightgbm"] or 0, ndcg["ranked_mlp"] or 0) < ndcg["fused"]
    assert published.record.ranker_kind == "none" and published.record.ranker_version is None and "ranked" not in ndcg
    assert published.record.ndcg_at_10 == pytest.approx(ndcg["fused"])
    serving = read_serving(lake_for(load_settings()), published.run_id)
    assert serving is not None and serving["ranker_version"] is None
    assert "note: stage two ranked held-out users worse than the fused order" in summary_text(published)
    with pytest.raises(ContractViolation, match=r"ranks held-out users worse than the fused order \(NDCG@10 0\.\d+ against"):
        train_ranker(TrainRankerParams())  # retrained on the same run, it loses again: nothing served changes
    assert read_serving(lake_for(load_settings()), published.run_id) == serving


def test_fused_candidates_below_popularity_fail_the_run_and_publish_nothing(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = demo_inputs(tmp_path / "in", items=300, users=80, seed=4)
    first = run(folder, "2026-11-29")
    monkeypatch.setenv("NIGHTSCORE_CANDIDATE_GATE_RECALL_MARGIN", "1.0")  # no fused list beats popularity by 1.0
    monkeypatch.setenv("NIGHTSCORE_CANDIDATE_GATE_MIN_USERS", "20")  # this log's 31 held-out users are enough to gate
    with pytest.raises(ContractViolation, match=r"candidate gate: fused recall@K [0-9.]+ is below popularity's [0-9.]+"):
        run(folder, "2026-11-30")
    warehouse = warehouse_for(load_settings())
    latest = warehouse.latest_published()
    assert latest is not None and latest.run_id == first.run_id
    failed = warehouse.query("SELECT run_id, status FROM scoring_runs WHERE run_date = DATE '2026-11-30'").rows
    assert [status for _, status in failed] == ["failed"]
    # the failed run's figures stay queryable: they say why it failed
    assert warehouse.query("SELECT count(*) FROM retrieval_metrics WHERE run_id = ?", [failed[0][0]]).rows[0][0] > 0
    assert warehouse.query("SELECT count(*) FROM user_candidates WHERE run_id = ?", [failed[0][0]]).rows[0][0] == 0
    with cache_for(load_settings()) as cache:
        assert cache.current() == first.run_id


def test_cold_recall_under_its_floor_fails_the_run(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTSCORE_CANDIDATE_GATE_MIN_COLD_RECALL", "1.0")
    monkeypatch.setenv("NIGHTSCORE_CANDIDATE_SOURCES", '["cooccurrence", "trending"]')  # nothing reaches a new item
    monkeypatch.setenv("NIGHTSCORE_CANDIDATE_GATE_MIN_USERS", "1")  # gate this small log: the floor is what is tested
    monkeypatch.setenv("NIGHTSCORE_CANDIDATE_GATE_RECALL_MARGIN", "-1")  # and the floor alone
    monkeypatch.setenv("NIGHTSCORE_CANDIDATE_GATE_MIN_COLD_PAIRS", "1")
    folder = demo_inputs(tmp_path / "in", items=300, users=80, seed=6)
    with pytest.raises(ContractViolation, match=r"cold-item recall@K 0\.0000 is below the minimum 1\.0000"):
        run(folder, "2026-11-30")


def small_catalogue(folder: Path, n_items: int, seed: int = 5) -> Path:
    """Write demo inputs cut to the n_items most interacted items (and the interactions with them) into folder."""
    demo = demo_inputs(folder, items=300, users=60, seed=seed)
    interactions = pl.read_parquet(demo / "interactions.parquet")
    kept = interactions.group_by("item_id").len().sort(["len", "item_id"], descending=[True, False]).head(n_items)
    items = pl.read_parquet(demo / "items.parquet").join(kept.select("item_id"), on="item_id", how="semi")
    items.write_parquet(demo / "items.parquet")
    interactions.join(kept.select("item_id"), on="item_id", how="semi").write_parquet(demo / "interactions.parquet")
    return demo


def owed(folder: Path, k: int) -> dict[str, int]:
    """Return each user's min(K, catalogue items the user has not seen), from the input files."""
    n_items = pl.read_parquet(folder / "items.parquet").height
    seen = pl.read_parquet(folder / "interactions.parquet").group_by("user_id").agg(pl.col("item_id").n_unique())
    return {user: min(k, n_items - n) for user, n in seen.iter_rows()}


@pytest.mark.parametrize("n_items", [1, 20, 21])  # 1, K and K + 1 items (the tiny tier's K is 20)
def test_a_catalogue_of_about_k_items_publishes_min_k_unseen_candidates_per_user(
    tiny: Path, tmp_path: Path, n_items: int
) -> None:
    folder = small_catalogue(tmp_path / "in", n_items)
    published = run(folder, "2026-11-30")
    assert published.record.status == "published" and published.record.rows_scored == n_items
    got = warehouse_for(load_settings()).query(
        "SELECT user_id, count(*), count(DISTINCT item_id), max(rank) FROM latest_user_candidates GROUP BY user_id"
    )
    lists = {user: (n, distinct, top) for user, n, distinct, top in got.rows}
    want = {user: n for user, n in owed(folder, 20).items() if n}
    assert {user: n for user, (n, _, _) in lists.items()} == want
    assert all(n == distinct == top for n, distinct, top in lists.values())
    assert published.record.users_with_candidates == len(want)


def test_a_run_without_interactions_publishes_item_scores_and_no_candidates(tiny: Path, tmp_path: Path) -> None:
    folder = demo_inputs(tmp_path / "in", items=60, users=10, seed=1)
    pl.read_parquet(folder / "interactions.parquet").clear().write_parquet(folder / "interactions.parquet")
    published = run(folder, "2026-11-30")
    assert published.record.status == "published" and published.record.rows_scored == 60
    assert published.record.users_with_candidates == 0 and published.record.recall_at_k is None
    warehouse = warehouse_for(load_settings())
    assert warehouse.query("SELECT count(*) FROM latest_item_scores").rows[0][0] == 60
    assert warehouse.query("SELECT count(*) FROM latest_user_candidates").rows[0][0] == 0
    assert "not enough data to gate" in summary_text(published)


def test_a_log_whose_interactions_share_one_timestamp_publishes_min_k_unseen_candidates_per_user(
    tiny: Path, tmp_path: Path
) -> None:
    """A log exported by the day: the time split holds every interaction out, so the sources fit an empty history."""
    folder = demo_inputs(tmp_path / "in", items=60, users=12, seed=1)
    interactions = pl.read_parquet(folder / "interactions.parquet")
    interactions.with_columns(pl.col("ts").dt.truncate("1d").min()).write_parquet(folder / "interactions.parquet")
    published = run(folder, "2026-11-30")
    assert published.record.status == "published" and published.record.rows_scored == 60
    got = warehouse_for(load_settings()).query(
        "SELECT user_id, count(DISTINCT item_id) FROM latest_user_candidates GROUP BY user_id"
    )
    assert dict(got.rows) == {user: n for user, n in owed(folder, 20).items() if n}
    assert "not enough data to gate" in summary_text(published)


def worst_first(rows: np.ndarray, scores: np.ndarray, is_new: np.ndarray, k: int, quota: float) -> np.ndarray:
    """Return the slots of each user's k WORST union entries: a fusion broken on purpose."""
    return select_slots(rows, np.where(rows >= 0, -scores, 0.0), is_new, k, 0.0)


def test_a_broken_fusion_still_fails_the_default_gate(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(candidate_stage, "select_slots", worst_first)  # the fused and any fallback list alike
    folder = demo_inputs(tmp_path / "in", items=400, users=300, seed=2)  # ~130 held-out users, fused well above popularity
    with pytest.raises(
        ContractViolation, match=r"fused recall@K [0-9.]+ is below popularity's [0-9.]+ \+ margin 0\.0000 with confidence"
    ):
        run(folder, "2026-11-30")
    warehouse = warehouse_for(load_settings())
    assert warehouse.latest_published() is None
    assert warehouse.query("SELECT count(*) FROM user_candidates").rows[0][0] == 0


def test_a_small_catalogue_with_a_noisy_gap_publishes(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """300 items, 120 users: fused recall@K below popularity's on ~66 held-out users, well inside the noise."""
    published = run(demo_inputs(tmp_path / "in", items=300, users=120, seed=4), "2026-11-30")
    record = published.record
    assert record.status == "published" and record.recall_at_k is not None and record.popularity_recall_at_k is not None
    assert record.recall_at_k < record.popularity_recall_at_k  # what failed such runs before
    assert record.candidate_gate is not None and record.candidate_gate.startswith("passed: fused - popularity recall@K -")
    assert f"candidate gate {record.candidate_gate}" in summary_text(published)
    latest = warehouse_for(load_settings()).query("SELECT candidate_gate FROM scoring_runs WHERE run_id = ?", [published.run_id])
    assert latest.rows[0][0] == record.candidate_gate


def test_a_fusion_that_loses_to_a_source_on_validation_publishes_that_sources_list(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fusion broken on purpose: the content list alone (the tiny encoder's random vectors), no first stage."""
    tuned_fusion = candidate_stage.tune_fusion

    def content_only(*args: Any, **kwargs: Any) -> tuple[FusionParams, dict[str, float]]:
        params, metrics = tuned_fusion(*args, **kwargs)
        return source_only(params, "content"), metrics

    monkeypatch.setattr(candidate_stage, "tune_fusion", content_only)
    monkeypatch.setattr(candidate_stage, "_first_stage", lambda *args: None)
    published = run(demo_inputs(tmp_path / "in", items=400, users=300, seed=2), "2026-11-30")
    source = published.record.candidate_fallback
    assert source in SOURCE_LISTS - {"content", "content_new"}
    assert f"note: the fused list lost to {source} on the validation split" in summary_text(published)
    warehouse = warehouse_for(load_settings())
    ranks = warehouse.query(f"SELECT rank, rank_{source} FROM latest_user_candidates WHERE rank_{source} IS NOT NULL").rows
    assert len(ranks) > 1000 and all(rank == own for rank, own in ranks)  # that source's list first, in its order
    assert warehouse.query("SELECT candidate_fallback FROM latest_run").rows[0][0] == source
