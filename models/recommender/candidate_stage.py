"""The candidate stage end to end, as pure functions: tune on validation, evaluate on held-out, fit on all.

Order (what the candidates task calls; see /work/notes/candidates-integration.md):
1. encode_run(items, interactions) -> catalogue, log                      (models.recommender.sources.base)
2. evaluation = time_split(log, holdout_share)                            (models.recommender.evaluation)
3. tuned = tune(catalogue, log, items, config, evaluation)
       sources fitted on the validation training part (inside evaluation.train); RRF weights and the
       new-item quota tuned on the validation held-out part; the first stage (LightGBM LambdaRank over
       every union entry's candidate_features) trained on it; both stage-two kinds trained on the K
       candidates the first stage keeps
       when a source's list beats the fused one on validation with confidence (fallback_source), that
       source's list is what the stage selects from then on (tuned.fallback names it)
4. report = evaluate(catalogue, log, items, config, evaluation, tuned)
       sources fitted on evaluation.train; retrieval_metrics rows for every list, popularity, fused_rrf,
       fused (the first stage's K: what is published) and the ranked lists, and every list's per-user
       recall@K; the better stage-two kind on NDCG@10, refitted on this split's rows
5. check_gate(report.metrics, report.recall, config.gate)                (models.recommender.evaluation)
6. final = fit_final(catalogue, log, items, config, now, tuned, report.scorer)
   for chunk in candidate_chunks(final): write chunk.frame, publish chunk.payloads(...)
The candidates and their feature rows come from one function, first_stage_candidates (whole union ->
candidate_features -> first-stage score -> top K with the new-item quota -> topped up to K from the fill
order when the lists run short), in tuning, evaluation and publishing alike.
Users are processed in chunks of ``user_chunk`` everywhere; evaluation and tuning use at most
``max_eval_users`` / ``max_tune_users`` users (a seeded sample) so their cost does not grow with the users.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import numpy as np
import polars as pl
import torch

from core.settings import SOURCE_NAMES, CandidateSettings
from models.recommender.evaluation import (
    GateRule,
    Split,
    fallback_source,
    metric_rows,
    metrics_of,
    time_split,
    user_recall,
)
from models.recommender.fusion import (
    Fused,
    FusionParams,
    TuningGrid,
    select_slots,
    source_only,
    top_up,
    tune_fusion,
    whole_union,
)
from models.recommender.ranker_features import FeatureContext, candidate_features, feature_context, feature_names
from models.recommender.ranker_models import Scorer
from models.recommender.ranker_training import RankerParams, choose_scorer, labelled_rows, rerank, train_lambdarank, train_mlp
from models.recommender.retrieval import ItemChunks
from models.recommender.sources.als import AlsParams, fit_als
from models.recommender.sources.base import Catalogue, EncodedLog, History, Lists, Source, history_of, item_counts
from models.recommender.sources.content import fit_content
from models.recommender.sources.cooccurrence import CooccurrenceParams, fit_cooccurrence
from models.recommender.sources.popularity import (
    FILL,
    PopularityParams,
    fit_fill,
    fit_most_popular,
    fit_topic_trending,
    fit_trending,
)

log = logging.getLogger(__name__)

_DEFAULTS = CandidateSettings()
SOURCES: tuple[str, ...] = SOURCE_NAMES


@dataclass(frozen=True)
class CandidateConfig:
    """Every parameter of the candidate stage; each one a setting (core.settings.CandidateSettings, its defaults)."""

    k: int = _DEFAULTS.top_k
    per_source: int = _DEFAULTS.per_source
    holdout_share: float = _DEFAULTS.holdout_share
    event_weights: Mapping[str, float] = field(default_factory=lambda: dict(_DEFAULTS.event_weights))
    half_life_days: float = _DEFAULTS.recency_half_life_days
    sources: tuple[str, ...] = SOURCES
    cooccurrence: CooccurrenceParams = CooccurrenceParams()
    als: AlsParams = AlsParams()
    popularity: PopularityParams = PopularityParams()
    grid: TuningGrid = TuningGrid()
    ranker: RankerParams = RankerParams()
    max_new_items: int = _DEFAULTS.max_new_items
    user_chunk: int = _DEFAULTS.user_chunk
    content_chunk: int = 2048
    max_tune_users: int = _DEFAULTS.max_tune_users
    first_stage_check_share: float = 0.3
    max_eval_users: int = _DEFAULTS.max_eval_users
    gate: GateRule = GateRule()
    device: str = "cpu"
    seed: int = _DEFAULTS.seed

    @classmethod
    def from_settings(cls, options: CandidateSettings, device: str = "cpu") -> CandidateConfig:
        """Return the candidate stage's parameters from its settings (device: cpu, or auto for a GPU when there is one)."""
        return cls(
            k=options.top_k,
            per_source=options.per_source,
            holdout_share=options.holdout_share,
            event_weights=dict(options.event_weights),
            half_life_days=options.recency_half_life_days,
            sources=tuple(options.sources),
            cooccurrence=CooccurrenceParams(
                options.cooc_max_history,
                options.cooc_window,
                options.cooc_neighbours,
                options.cooc_alpha,
                options.cooc_pairs_per_pass,
            ),
            als=AlsParams(
                options.als_factors,
                options.als_regularization,
                options.als_alpha,
                options.als_confidence,
                iterations=options.als_iterations,
                seed=options.seed,
            ),
            popularity=PopularityParams(
                options.trend_half_life_days,
                options.topic_smoothing,
                options.trend_min_users,
                options.trend_user_cap,
                options.trend_new_user_days,
            ),
            grid=TuningGrid(new_quota=tuple(options.fusion_quota_grid), cold_target=options.fusion_cold_target),
            ranker=RankerParams(
                rounds=options.ranker_rounds,
                learning_rate=options.ranker_learning_rate,
                leaves=options.ranker_leaves,
                seed=options.seed,
            ),
            user_chunk=options.user_chunk,
            max_tune_users=options.max_tune_users,
            max_eval_users=options.max_eval_users,
            max_new_items=options.max_new_items,
            gate=GateRule.from_settings(options),
            device=device,
            seed=options.seed,
        )


@dataclass
class Timings:
    """Seconds spent per (list or stage) name, accumulated."""

    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, started: float) -> None:
        """Add the time since started (perf_counter) to name."""
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started


def as_datetime(epoch_us: int) -> datetime:
    """Return epoch microseconds as an aware UTC datetime."""
    return datetime.fromtimestamp(epoch_us / 1e6, tz=UTC)


def _device(config: CandidateConfig) -> torch.device:
    return torch.device("cuda" if config.device != "cpu" and torch.cuda.is_available() else "cpu")


def fit_sources(
    history: History, catalogue: Catalogue, items: ItemChunks | None, config: CandidateConfig, timings: Timings | None = None
) -> list[Source]:
    """Return the configured sources fitted on a History (content only when embeddings are given)."""
    timings = timings or Timings()
    fits: dict[str, Callable[[], Source | None]] = {
        "cooccurrence": lambda: fit_cooccurrence(history, config.cooccurrence),
        "als": lambda: fit_als(history, replace(config.als, seed=config.seed, use_gpu=config.device != "cpu")),
        "content": lambda: (
            fit_content(items, history, catalogue.created_us, config.max_new_items, _device(config), config.content_chunk)
            if items
            else None
        ),
        "trending": lambda: fit_trending(history, config.popularity),
        "topic_trending": lambda: fit_topic_trending(history, catalogue, config.popularity),
    }
    sources: list[Source] = []
    for name in config.sources:
        started = time.perf_counter()
        source = fits[name]()
        timings.add(f"{name}.fit", started)
        if source is not None:
            sources.append(source)
    return sources


def source_lists(sources: list[Source], users: np.ndarray, n: int, timings: Timings | None = None) -> dict[str, Lists]:
    """Return every source's lists of the given user rows (one call per source)."""
    timings = timings or Timings()
    out: dict[str, Lists] = {}
    for source in sources:
        started = time.perf_counter()
        out.update(source.recommend(users, n))
        timings.add(f"{source.name}.recommend", started)
    return out


def sample_split(split: Split, max_users: int, seed: int) -> Split:
    """Return the split restricted to a seeded sample of at most max_users of its users."""
    if len(split.users) <= max_users:
        return split
    return _restricted(split, np.sort(np.random.default_rng(seed).choice(split.users, size=max_users, replace=False)))


def _history(log_: EncodedLog, catalogue: Catalogue, mask: np.ndarray | None, now: datetime, config: CandidateConfig) -> History:
    return history_of(log_, catalogue, mask, now, config.event_weights, config.half_life_days)


@dataclass(frozen=True)
class Tuned:
    """What validation decided: fusion parameters, the first-stage model, both stage-two rankers."""

    fusion: FusionParams
    validation_metrics: dict[str, float]
    first_stage: Scorer | None
    scorers: dict[str, Scorer]
    validation_users: int
    fallback: str | None = None  # the source whose list is published instead of the fused one


def union_features(
    lists: Mapping[str, Lists], fusion: FusionParams, context: FeatureContext, users: np.ndarray
) -> tuple[Fused, np.ndarray]:
    """Return every user's whole union (RRF order) and its candidate_features rows."""
    union = whole_union(lists, fusion)
    return union, candidate_features(union, users, context)


def choose_candidates(
    union: Fused, features: np.ndarray, first_stage: Scorer | None, is_new: np.ndarray, fusion: FusionParams
) -> tuple[Fused, np.ndarray]:
    """Return the K candidates per user (by the first-stage score, or RRF without one) and their feature rows."""
    scores = union.rrf.astype(np.float32)
    if first_stage is not None:
        scores = np.full(union.rows.shape, -np.inf, dtype=np.float32)
        filled = union.rows >= 0
        scores[filled] = first_stage.predict(features[filled])
    slots = select_slots(union.rows, scores, is_new, fusion.k, fusion.new_quota)
    rows = np.take_along_axis(features, np.maximum(slots, 0)[..., None], axis=1)
    rows[slots < 0] = 0.0
    return union.take(slots, scores), rows


def topped_up(
    fused: Fused, features: np.ndarray, fill: Lists, users: np.ndarray, context: FeatureContext
) -> tuple[Fused, np.ndarray]:
    """Return the candidates with short lists filled to K from the fill list, and their feature rows."""
    full = top_up(fused, fill)
    return (fused, features) if full is fused else (full, candidate_features(full, users, context))


def first_stage_candidates(
    lists: Mapping[str, Lists],
    fusion: FusionParams,
    first_stage: Scorer | None,
    context: FeatureContext,
    users: np.ndarray,
    is_new: np.ndarray,
    fill: Lists,
) -> tuple[Fused, np.ndarray]:
    """Return the published candidates of the users and their feature rows: ONE path for training and serving."""
    union, features = union_features(lists, fusion, context, users)
    return topped_up(*choose_candidates(union, features, first_stage, is_new, fusion), fill, users, context)


def _context(history: History, catalogue: Catalogue, config: CandidateConfig) -> FeatureContext:
    return feature_context(history, catalogue, config.popularity.trend_half_life_days)


def subset_split(split: Split, positions: np.ndarray) -> Split:
    """Return the split restricted to the users at the given ascending positions of split.users."""
    return _restricted(split, split.users[positions])


def _restricted(split: Split, users: np.ndarray) -> Split:
    """Return the split with only these users and their held-out pairs."""
    keep = np.isin(split.relevant_users, users)
    return replace(
        split,
        users=users,
        relevant_users=split.relevant_users[keep],
        relevant_items=split.relevant_items[keep],
        cold=split.cold[keep],
    )


def _first_stage(
    union: Fused, features: np.ndarray, validation: Split, is_new: np.ndarray, fusion: FusionParams, config: CandidateConfig
) -> Scorer | None:
    """Return the first-stage model, or None when it does not beat RRF selection on held-aside validation users.

    The model trains on a seeded (1 - check_share) of the validation users; both selections are compared
    on recall@K over the others, which the model never saw.
    """
    n = len(validation.users)
    check = np.sort(np.random.default_rng(config.seed).permutation(n)[: round(n * config.first_stage_check_share)])
    train = np.setdiff1d(np.arange(n), check)
    rows = labelled_rows(union.rows[train], validation.users[train], features[train], validation)
    if len(check) == 0 or not rows.y.any():
        return None
    model = train_lambdarank(rows, feature_names(union.names), config.ranker)
    held = subset_split(validation, check)
    part = union.users_at(check)
    recall = {
        name: metrics_of(choose_candidates(part, features[check], scorer, is_new, fusion)[0].rows, held, len(is_new), fusion.k)[
            "recall_at_k"
        ]
        for name, scorer in (("rrf", None), ("model", model))
    }
    log.info(
        "first stage on %d held-aside validation users: recall@K %.4f vs RRF %.4f", len(check), recall["model"], recall["rrf"]
    )
    return model if recall["model"] > recall["rrf"] else None


def tune(
    catalogue: Catalogue,
    log_: EncodedLog,
    items: ItemChunks | None,
    config: CandidateConfig,
    evaluation: Split,
    timings: Timings | None = None,
) -> Tuned:
    """Return the fusion tuned and the models trained on a validation split inside evaluation.train."""
    validation = sample_split(time_split(log_, config.holdout_share, within=evaluation.train), config.max_tune_users, config.seed)
    history = _history(log_, catalogue, validation.train, as_datetime(validation.cutoff_us), config)
    lists = source_lists(fit_sources(history, catalogue, items, config, timings), validation.users, config.per_source, timings)
    started, is_new, context = time.perf_counter(), item_counts(history) == 0, _context(history, catalogue, config)
    fill = fit_fill(history, config.popularity).recommend(validation.users, config.k)[FILL]
    fusion, metrics = tune_fusion(lists, validation, is_new, catalogue.n_items, config.k, config.grid)
    union, features = union_features(lists, fusion, context, validation.users)
    first = _first_stage(union, features, validation, is_new, fusion, config)
    fused, fused_features = topped_up(*choose_candidates(union, features, first, is_new, fusion), fill, validation.users, context)
    fallback = _fallback(lists, fused, validation, catalogue.n_items, config)
    if fallback is not None:
        fusion, first = source_only(fusion, fallback), None
        fused, fused_features = first_stage_candidates(lists, fusion, None, context, validation.users, is_new, fill)
    rows = labelled_rows(fused.rows, validation.users, fused_features, validation)
    names = feature_names(fused.names)
    scorers: dict[str, Scorer] = (
        {"lightgbm": train_lambdarank(rows, names, config.ranker), "mlp": train_mlp(rows, names, config.ranker)}
        if rows.y.any()
        else {}
    )
    if timings:
        timings.add("tuning", started)
    return Tuned(fusion, metrics, first, scorers, len(validation.users), fallback)


def _fallback(lists: Mapping[str, Lists], fused: Fused, validation: Split, n_items: int, config: CandidateConfig) -> str | None:
    """Return the source whose validation recall@K beats the fused list's with confidence (None: ship the fusion)."""
    recall = {name: user_recall(got.rows, validation, n_items, config.k) for name, got in lists.items()}
    name, gap = fallback_source(user_recall(fused.rows, validation, n_items, config.k), recall, config.gate)
    if name is not None and gap is not None:
        log.warning(
            "the fused list loses to %s on validation (fused - %s recall@K %s): publishing %s's list instead",
            name,
            name,
            gap.text(config.gate.confidence),
            name,
        )
    return name


@dataclass(frozen=True)
class Report:
    """The held-out evaluation: retrieval_metrics rows, the chosen ranker kind, the scorer to publish, per-user recall."""

    metrics: pl.DataFrame
    chosen: str
    scorer: Scorer | None
    recall: dict[str, np.ndarray] = field(default_factory=dict)  # method -> recall@K of each held-out user


def _split_rows(split: Split) -> pl.DataFrame:
    """Return the split's own figures as retrieval_metrics rows of method 'split'."""
    return metric_rows(
        "split",
        {
            "users_evaluated": len(split.users),
            "users_without_history": split.users_without_history,
            "relevant_pairs": len(split.relevant_users),
            "cold_pairs": int(split.cold.sum()),
        },
    )


def evaluate(
    catalogue: Catalogue,
    log_: EncodedLog,
    items: ItemChunks | None,
    config: CandidateConfig,
    evaluation: Split,
    tuned: Tuned,
    timings: Timings | None = None,
) -> Report:
    """Return every list's held-out metrics, the fused (RRF and first-stage) and ranked ones, and the scorer to publish.

    Methods: each source list, popularity (the baseline), fused_rrf (RRF selection), fused (the first
    stage's selection: what is published), ranked_<kind> for both stage-two kinds and ranked (the kind kept).
    """
    split = sample_split(evaluation, config.max_eval_users, config.seed)
    history = _history(log_, catalogue, split.train, as_datetime(split.cutoff_us), config)
    lists = source_lists(fit_sources(history, catalogue, items, config, timings), split.users, config.per_source, timings)
    is_new, context = item_counts(history) == 0, _context(history, catalogue, config)
    fill = fit_fill(history, config.popularity).recommend(split.users, config.k)[FILL]
    union, features = union_features(lists, tuned.fusion, context, split.users)
    rrf, _ = choose_candidates(union, features, None, is_new, tuned.fusion)
    fused, fused_features = topped_up(
        *choose_candidates(union, features, tuned.first_stage, is_new, tuned.fusion), fill, split.users, context
    )
    methods = {name: lists[name].rows for name in sorted(lists)}
    methods["popularity"] = fit_most_popular(history).recommend(split.users, config.k)["popularity"].rows
    methods |= {"fused_rrf": top_up(rrf, fill).rows, "fused": fused.rows}
    methods |= {f"ranked_{kind}": rerank(fused.rows, fused_features, scorer) for kind, scorer in sorted(tuned.scorers.items())}
    measured = {name: metrics_of(rows, split, catalogue.n_items, config.k) for name, rows in methods.items()}
    ranked = {name.removeprefix("ranked_"): m for name, m in measured.items() if name.startswith("ranked_")}
    chosen, refit = _refit(ranked, measured["fused"]["ndcg_at_10"], fused, fused_features, split, config)
    if chosen:
        measured["ranked"], methods["ranked"] = ranked[chosen], methods[f"ranked_{chosen}"]
    frames = [metric_rows(name, m) for name, m in measured.items()]
    recall = {name: user_recall(rows, split, catalogue.n_items, config.k) for name, rows in methods.items()}
    return Report(pl.concat([*frames, _split_rows(split)]), chosen or "none", refit, recall)


def _refit(
    ranked: dict[str, dict[str, float]],
    fused_ndcg: float,
    fused: Fused,
    features: np.ndarray,
    split: Split,
    config: CandidateConfig,
) -> tuple[str | None, Scorer | None]:
    """Return the kind with the better held-out NDCG@10 and that kind refitted on this split's rows.

    (None, None) when neither kind orders the held-out users' candidates better than the fused order does (or
    has no labelled row to learn from): a stage two that loses to the list it re-ranks is not served.
    """
    rows = labelled_rows(fused.rows, split.users, features, split)
    if not ranked or not rows.y.any():
        return None, None
    ndcg = {kind: metrics["ndcg_at_10"] for kind, metrics in ranked.items()}
    chosen = choose_scorer(ndcg)
    if ndcg[chosen] < fused_ndcg:
        log.info("stage two not served: held-out NDCG@10 %s against the fused order's %.4f", ndcg, fused_ndcg)
        return None, None
    refit = (train_lambdarank if chosen == "lightgbm" else train_mlp)(rows, feature_names(fused.names), config.ranker)
    refit.metrics = {**{f"ndcg_at_10_{k}": v for k, v in ndcg.items()}, "held_out_users": float(len(split.users))}
    return chosen, refit


@dataclass(frozen=True)
class Final:
    """Everything the published candidates need: sources fitted on all interactions, fusion, features, scorer."""

    sources: list[Source]
    fusion: FusionParams
    first_stage: Scorer | None
    history: History
    catalogue: Catalogue
    context: FeatureContext
    scorer: Scorer | None
    config: CandidateConfig
    fill: Source  # every item by trending, then catalogue order: tops up short lists


def fit_final(
    catalogue: Catalogue,
    log_: EncodedLog,
    items: ItemChunks | None,
    config: CandidateConfig,
    now: datetime,
    tuned: Tuned,
    scorer: Scorer | None,
    timings: Timings | None = None,
) -> Final:
    """Return the sources fitted on all of the run's interactions, as of now, with the tuned fusion and models."""
    history = _history(log_, catalogue, None, now, config)
    sources = fit_sources(history, catalogue, items, config, timings)
    context = _context(history, catalogue, config)
    fill = fit_fill(history, config.popularity)
    return Final(sources, tuned.fusion, tuned.first_stage, history, catalogue, context, scorer, config, fill)


@dataclass(frozen=True)
class CandidateChunk:
    """One chunk of users' published candidates: the long frame, and per user the feature matrix."""

    users: np.ndarray
    fused: Fused
    features: np.ndarray
    feature_names: tuple[str, ...]
    frame: pl.DataFrame

    def payloads(self, item_ids: pl.Series, user_ids: pl.Series) -> Iterator[tuple[str, list[str], np.ndarray]]:
        """Yield (user id, candidate item ids, their (n, features) float32 matrix) per user, fused order."""
        ids = item_ids.to_numpy()
        for local, user in enumerate(self.users):
            filled = self.fused.rows[local] >= 0
            yield str(user_ids[int(user)]), ids[self.fused.rows[local][filled]].tolist(), self.features[local][filled]


def candidates_frame(fused: Fused, users: np.ndarray, catalogue: Catalogue) -> pl.DataFrame:
    """Return candidates as the long table: user_id, rank, item_id, score, rrf_score, sources, rank_<list>, score_<list>."""
    local, slot = np.nonzero(fused.rows >= 0)
    ranks, scores = fused.ranks[local, slot], fused.source_scores[local, slot]
    present = ranks > 0
    names = np.array(fused.names)
    columns: dict[str, object] = {
        "user_id": catalogue.user_ids.gather(users[local]),
        "rank": (slot + 1).astype(np.int32),
        "item_id": catalogue.item_ids.gather(fused.rows[local, slot]),
        "score": fused.scores[local, slot].astype(np.float64),
        "rrf_score": fused.rrf[local, slot].astype(np.float64),
        # a candidate no list holds topped up a short list
        "sources": pl.Series([names[p].tolist() or [FILL] for p in present], dtype=pl.List(pl.String)),
    }
    for s, name in enumerate(fused.names):
        columns[f"rank_{name}"] = pl.Series(np.where(present[:, s], ranks[:, s], 0)).replace(0, None).cast(pl.Int32)
        columns[f"score_{name}"] = pl.Series(scores[:, s], nan_to_null=True).cast(pl.Float32)
    return pl.DataFrame(columns)


def candidate_chunks(final: Final, users: np.ndarray | None = None, timings: Timings | None = None) -> Iterator[CandidateChunk]:
    """Yield the published candidates of the users (default: every user row) chunk by chunk."""
    users = np.arange(final.catalogue.n_users) if users is None else users
    is_new = item_counts(final.history) == 0
    for start in range(0, len(users), final.config.user_chunk):
        part = users[start : start + final.config.user_chunk]
        lists = source_lists(final.sources, part, final.config.per_source, timings)
        started = time.perf_counter()
        fill = final.fill.recommend(part, final.config.k)[FILL]
        fused, features = first_stage_candidates(lists, final.fusion, final.first_stage, final.context, part, is_new, fill)
        frame = candidates_frame(fused, part, final.catalogue)
        if timings:
            timings.add("fusion", started)
        yield CandidateChunk(part, fused, features, feature_names(fused.names), frame)
