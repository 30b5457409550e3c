"""Flow tier: the candidate stage inside a real nightly run: retrieval_metrics, the gate, the ranker the run serves with."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ContractViolation
from core.records import Published
from core.settings import load_settings
from flows.nightly import nightly
from flows.params import NightlyParams
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


def test_fused_candidates_below_popularity_fail_the_run_and_publish_nothing(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = demo_inputs(tmp_path / "in", items=300, users=80, seed=4)
    first = run(folder, "2026-11-29")
    monkeypatch.setenv("NIGHTSCORE_CANDIDATE_GATE_RECALL_MARGIN", "1.0")  # no fused list beats popularity by 1.0
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
    folder = demo_inputs(tmp_path / "in", items=300, users=80, seed=6)
    with pytest.raises(ContractViolation, match=r"cold-item recall@K 0\.0000 is below the minimum 1\.0000"):
        run(folder, "2026-11-30")
