"""Unit tier: the cascade of topic decisions (models/cascade.py), its settings, and how score-items applies it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from pydantic import ValidationError

from core.errors import ModelLoadError, exit_code_for
from core.records import SCORED_BY
from core.settings import Settings, load_settings
from data_contracts.outputs import item_scores_schema
from models.cascade import Budget, Sample, cascade_curve, items_within, measure, route, route_order, worth_shipping
from models.topics import topic_decisions, topic_scores
from nightscore.output import summary_text
from tasks import report_plots as draw
from tasks.report_page import summary_markdown
from tasks.route import budget_of, check_large_model, large_spec
from tasks.score import ITEM_SCORES_ORDER, with_routed
from tests.helpers import published
from tests.tiny_model import tiny_folder, write_tiny_model

# five items: 0 and 3 are unsure (small margins), 1 and 4 sure; 2 is sure but its text was truncated
MARGIN = np.array([0.02, 0.9, 0.8, 0.05, 0.7])
TRUNCATED = np.array([False, False, True, False, False])


def test_an_uncertain_item_is_routed_and_a_certain_one_is_not() -> None:
    routing = route(MARGIN, np.zeros(5, dtype=bool), count=2)
    assert routing.routed.tolist() == [True, False, False, True, False]
    assert routing.threshold == pytest.approx(0.05)
    assert routing.by_reason == {"truncated": 0, "margin": 2}


def test_a_truncated_text_is_routed_before_the_uncertain_ones() -> None:
    routing = route(MARGIN, TRUNCATED, count=2)
    assert routing.routed.tolist() == [True, False, True, False, False]
    assert routing.by_reason == {"truncated": 1, "margin": 1}
    assert routing.threshold == pytest.approx(0.02)


def test_truncation_does_not_route_when_switched_off() -> None:
    routing = route(MARGIN, TRUNCATED, count=2, route_truncated=False)
    assert routing.routed.tolist() == [True, False, False, True, False]
    assert routing.by_reason["truncated"] == 0


@pytest.mark.parametrize("budget", [Budget(), Budget(share=0.0), Budget(seconds=0.0), Budget(share=0.5, seconds=0.0)])
def test_a_budget_of_zero_routes_nothing(budget: Budget) -> None:
    count = items_within(budget, np.full(5, 10), seconds_per_token=0.001)
    routing = route(MARGIN, TRUNCATED, count)
    assert count == 0 and not budget.routes
    assert routing.count == 0 and routing.threshold is None


@pytest.mark.parametrize(
    ("budget", "spent", "expected"),
    [
        (Budget(share=0.4), 0.0, 2),  # 40% of 5 items
        (Budget(share=1.0), 0.0, 5),
        (Budget(seconds=0.25), 0.0, 2),  # 0.1 s per item (10 tokens at 0.01 s)
        (Budget(seconds=0.25), 0.1, 1),  # the sample spent 0.1 s of it
        (Budget(seconds=0.05), 0.1, 0),  # the sample spent more than the budget
        (Budget(share=0.8, seconds=0.25), 0.0, 2),  # both: the smaller wins
    ],
)
def test_the_budget_decides_how_many_items_route(budget: Budget, spent: float, expected: int) -> None:
    assert items_within(budget, np.full(5, 10), seconds_per_token=0.01, spent_s=spent) == expected


def test_routing_order_is_truncated_first_then_least_sure_first() -> None:
    assert route_order(MARGIN, TRUNCATED).tolist() == [2, 0, 3, 4, 1]


def test_topic_decisions_agree_with_topic_scores_and_give_the_top2_margin() -> None:
    rng = np.random.default_rng(0)
    items, labels = rng.normal(size=(50, 16)), rng.normal(size=(4, 16))
    items /= np.linalg.norm(items, axis=1, keepdims=True)
    labels /= np.linalg.norm(labels, axis=1, keepdims=True)
    best, prob, margin = topic_decisions(items, labels, 0.1)
    ref_best, ref_prob = topic_scores(items, labels, 0.1)
    assert (best == ref_best).all() and np.allclose(prob, ref_prob)
    probs = np.exp(items @ labels.T / 0.1)
    probs /= probs.sum(axis=1, keepdims=True)
    top2 = np.sort(probs, axis=1)[:, -2:]
    assert np.allclose(margin, top2[:, 1] - top2[:, 0], atol=1e-6) and (margin >= 0).all()


def _sample() -> Sample:
    """Return a sample where the small model is wrong exactly on its two least sure items."""
    return Sample(
        small=np.array([1, 0, 0, 1, 2]),
        large=np.array([0, 0, 0, 2, 2]),
        margin=np.array([0.01, 0.9, 0.8, 0.05, 0.7]),
        truncated=np.zeros(5, dtype=bool),
        tokens=np.full(5, 10),
        small_s=1.0,
        large_s=10.0,
    )


def test_the_curve_climbs_to_full_agreement_as_the_uncertain_items_route() -> None:
    curve = cascade_curve(_sample(), shares=(0.0, 0.2, 0.4, 1.0), labels=np.array([0, 0, 0, 2, 2]))
    assert [p.agreement for p in curve] == pytest.approx([0.6, 0.8, 1.0, 1.0])
    assert [p.accuracy for p in curve] == pytest.approx([0.6, 0.8, 1.0, 1.0])
    assert [p.cost_ratio for p in curve] == pytest.approx([0.1, 0.3, 0.5, 1.1])
    assert worth_shipping(curve[1], 1.0, keep=0.8, max_cost=0.35) and not worth_shipping(curve[2], 1.0, max_cost=0.35)


def test_the_runs_own_point_is_measured_on_the_routed_sample_items() -> None:
    point = measure(_sample(), np.array([True, False, False, False, False]))
    assert point.agreement == pytest.approx(0.8) and point.cost_ratio == pytest.approx(0.3)


def _rows(ids: list[str]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "run_id": "r",
            "run_date": "2026-11-30",
            "item_id": ids,
            "model_version": "small@1",
            "topic": ["sports"] * len(ids),
            "topic_score": [0.5] * len(ids),
            "token_count": [7] * len(ids),
            "content_hash": ["0" * 64] * len(ids),
            "embedding": [[1.0, 0.0]] * len(ids),
        }
    )


def test_score_items_takes_the_routed_topics_and_says_who_scored() -> None:
    large = pl.DataFrame({"item_id": ["b"], "topic": ["music"], "topic_score": [0.9]})
    scored = with_routed(_rows(["a", "b", "c"]), large)
    assert scored.columns == list(ITEM_SCORES_ORDER)
    assert scored.get_column("scored_by").to_list() == ["small", "large", "small"]
    assert scored.get_column("topic").to_list() == ["sports", "music", "sports"]
    assert scored.get_column("topic_score").to_list() == [0.5, 0.9, 0.5]
    assert scored.get_column("model_version").unique().to_list() == ["small@1"]  # the vectors stay the small model's
    item_scores_schema(["sports", "music"]).validate(scored)


def test_nothing_routed_is_todays_behaviour_every_topic_from_the_small_model() -> None:
    scored = with_routed(
        _rows(["a", "b"]), pl.DataFrame(schema={"item_id": pl.String, "topic": pl.String, "topic_score": pl.Float64})
    )
    assert scored.get_column("scored_by").to_list() == ["small", "small"]
    assert scored.drop("scored_by").equals(_rows(["a", "b"]).select(c for c in ITEM_SCORES_ORDER if c != "scored_by"))


def test_the_contract_refuses_an_unknown_scorer() -> None:
    bad = with_routed(_rows(["a"]), pl.DataFrame(schema={"item_id": pl.String, "topic": pl.String, "topic_score": pl.Float64}))
    with pytest.raises(Exception, match="isin"):
        item_scores_schema(["sports"]).validate(bad.with_columns(pl.lit("medium").alias("scored_by")))
    assert SCORED_BY == ("small", "large")


def test_without_a_large_model_the_default_budget_routes_nothing() -> None:
    settings = Settings()
    assert settings.topics.large_model is None and large_spec(settings) is None
    assert not budget_of(settings).routes and budget_of(load_settings(cascade_budget_share=0.5)).share is None
    assert check_large_model(settings) is None


def test_the_large_model_and_budget_are_read_from_their_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    twin = write_tiny_model(tmp_path / "twin", layers=2, seed=1)
    monkeypatch.setenv("NIGHTSCORE_LARGE_MODEL", str(twin))
    monkeypatch.setenv("NIGHTSCORE_CASCADE_BUDGET_SHARE", "0.2")
    monkeypatch.setenv("NIGHTSCORE_CASCADE_BUDGET_S", "30")
    settings = Settings()
    spec = large_spec(settings)
    assert spec is not None and spec.model_path == str(twin) and spec.max_seq_length == 512
    assert budget_of(settings) == Budget(0.2, 30.0) and budget_of(settings).label() == "share 0.2, 30 s"
    assert str(check_large_model(settings)).startswith("twin@")
    assert check_large_model(settings) != check_large_model(load_settings(large_model=str(tiny_folder())))


@pytest.mark.parametrize(
    "options", [{"cascade_budget_share": 1.5}, {"cascade_budget_share": -0.1}, {"cascade_budget_s": -1}, {"cascade_sample": -1}]
)
def test_a_budget_out_of_range_is_a_settings_error(options: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        Settings(**options)  # type: ignore[arg-type]


def test_a_large_model_folder_that_does_not_exist_is_a_clear_error(tmp_path: Path) -> None:
    settings = load_settings(large_model=str(tmp_path / "no-such-model"))
    with pytest.raises(ModelLoadError, match="no-such-model") as failure:
        check_large_model(settings)
    assert exit_code_for(failure.value) == 1


CASCADE_RUN = {
    "cascade_model_version": "all-mpnet-base-v2@c4f49a0d4b0b",
    "cascade_budget": "share 0.15",
    "routed_items": 300,
    "routed_truncated": 85,
    "routed_margin": 215,
    "cascade_threshold": 0.8244,
    "cascade_agreement": 1.0,
    "cascade_cost_ratio": 0.31,
    "cascade_seconds": 155.6,
}


def test_the_run_summary_and_page_say_what_the_cascade_routed_and_why() -> None:
    run = published(**CASCADE_RUN)
    text = summary_text(run, 41.0)
    assert (
        "topic cascade (share 0.15): 300 item(s) re-scored by all-mpnet-base-v2@c4f49a0d4b0b (85 truncated, 215 by margin)"
        in text
    )
    markdown = summary_markdown(run, {"items_uri": "i", "interactions_uri": "x"}, Settings(), {})
    assert "| topic cascade | `all-mpnet-base-v2@c4f49a0d4b0b`, budget share 0.15: 300 item(s) routed" in markdown
    assert "margin <= 0.8244" in markdown and "100.0% agree with all-large at 0.31 of its cost" in markdown


def test_without_a_cascade_the_summary_says_nothing_of_it_and_the_page_says_off() -> None:
    run = published()
    assert "topic cascade" not in summary_text(run, 41.0)
    assert "| topic cascade | off (no large model" in summary_markdown(
        run, {"items_uri": "i", "interactions_uri": "x"}, Settings(), {}
    )


def test_the_curve_plot_is_a_png() -> None:
    png = draw.cascade_curve([0.0, 0.5, 1.0], [0.9, 0.99, 1.0], [0.1, 0.55, 1.1], (0.15, 0.97))
    assert png.startswith(b"\x89PNG")
