"""What each node of the scoring DAG hands the next: small frozen records of URIs, counts and timings.

Field names are the contract between tasks; no frame and no ``dict[str, object]`` crosses a task boundary.
The big data stays in the run's folder of the lake, named by the URIs these records carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any

from core.run_context import RunContext
from core.settings import Settings


@dataclass(frozen=True)
class RunRef(RunContext):
    """A run's identity and lake folder, with the settings it resolved once at its start (handed to every task)."""

    settings: Settings = field(repr=False, compare=False)
    embedding_dim: int

    def context(self) -> RunContext:
        """Return the run's identity alone (what run.json in its folder holds)."""
        return RunContext(**{f.name: getattr(self, f.name) for f in fields(RunContext)})


@dataclass(frozen=True)
class Ingested:
    """The run's typed snapshot of its inputs (ingest/items.parquet, ingest/interactions.parquet)."""

    items_uri: str
    interactions_uri: str
    items_in: int
    interactions_in: int
    seconds: float


@dataclass(frozen=True)
class Validated:
    """Inputs that passed their row contracts and dataset suites, and what was quarantined."""

    items_uri: str
    interactions_uri: str
    quarantine_uri: str
    rows_in: int
    rows_quarantined: int
    interactions_in: int
    interactions_quarantined: int
    users: int
    data_docs: dict[str, str]
    suite_versions: dict[str, str]
    seconds: float


@dataclass(frozen=True)
class EngineMode:
    """The inference mode a run encodes in: chosen by calibration (auto) or pinned, its fidelity and speed."""

    backend: str
    precision: str
    token_budget: int
    runtime: str
    fidelity_min: float
    fidelity_p1: float
    fidelity_mean: float
    calibrated: bool  # auto chose the mode by measurement on this kind of machine
    device_kind: str | None = None
    calibrated_tokens_per_s: float | None = None
    calibration_from_cache: bool | None = None  # read from an earlier calibration on this kind of machine
    calibration_file: str | None = None  # holds every candidate auto measured (the run's artifact shows them)
    streams: int = 1  # batches run at once (OpenVINO CPU streams)
    length_multiple: int = 1  # batch lengths rounded up to a multiple (a runtime's kernels)
    choice: str = "pinned"  # how it was chosen: pinned, calibrated (now), persisted (an earlier calibration), default
    choice_note: str | None = None  # why auto kept the default mode (its encoding did not pay for a calibration)

    @property
    def label(self) -> str:
        """Return backend/precision@budget and /sN for N streams, e.g. openvino/int8@1024/s2."""
        return f"{self.backend}/{self.precision}@{self.token_budget}" + (f"/s{self.streams}" if self.streams > 1 else "")


@dataclass(frozen=True)
class Plan:
    """The run's shard plan (plan.parquet) and the vectors it reuses from the latest publication (reused.parquet).

    ``engine`` is the mode auto chose (or the pinned one): every shard, local or on Ray, encodes in that mode.
    """

    engine: EngineMode
    plan_uri: str
    reused_uri: str
    shards: tuple[int, ...]
    items: int
    rows_reused: int
    rows_computed: int
    model_version: str
    truncated: int
    real_tokens: int
    seconds: float
    progress_artifact: str | None = None


@dataclass(frozen=True)
class ShardResult:
    """One encoded shard (shards/shard-NNNNN-<key>.parquet) and what encoding it did (nothing when reused)."""

    shard: int
    uri: str
    device: str
    model_version: str
    texts: int
    real_tokens: int
    padded_tokens: int
    truncated: int
    batches: int
    oom_splits: int
    seconds: float
    load_seconds: float
    reused: bool = False

    def as_json(self) -> dict[str, Any]:
        """Return the record as the shard's .done marker stores it."""
        return asdict(self)

    @classmethod
    def from_marker(cls, marker: dict[str, Any]) -> ShardResult:
        """Return a done shard from its marker, as reused: nothing was encoded for it in this attempt."""
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in marker.items() if k in known}, "reused": True, "seconds": 0.0})


@dataclass(frozen=True)
class EncodeTotals:
    """The run's encoding summed over the shards computed now (checkpoints and reused vectors counted apart)."""

    texts: int
    real_tokens: int
    padded_tokens: int
    truncated: int
    batches: int
    oom_splits: int
    seconds: float
    shards: int
    shards_reused: int
    device: str
    model_version: str
    rows_reused: int
    rows_computed: int
    load_seconds: float
    engine: EngineMode

    @property
    def padding_efficiency(self) -> float | None:
        """Return real / padded tokens of what was encoded now, or None when nothing was."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else None

    @property
    def texts_per_s(self) -> float | None:
        """Return encode throughput of this run, or None when nothing was encoded."""
        return self.texts / self.seconds if self.texts and self.seconds > 0 else None


@dataclass(frozen=True)
class Scored:
    """item_scores.parquet: every valid item's embedding with its zero-shot topic."""

    uri: str
    rows_scored: int
    missing: int
    seconds: float


@dataclass(frozen=True)
class MethodQuality:
    """One retrieval method's figures on the held-out interactions (a row group of retrieval_metrics)."""

    method: str
    recall_at_k: float | None
    ndcg_at_10: float | None
    cold_recall_at_k: float | None
    coverage_at_k: float | None


def stage_two_loss(quality: Sequence[MethodQuality]) -> tuple[float, float] | None:
    """Return (the better stage two's NDCG@10, the fused order's) when stage two ranked held-out users worse, else None."""
    ndcg = {q.method: q.ndcg_at_10 for q in quality if q.ndcg_at_10 is not None}
    ranked = [v for method, v in ndcg.items() if method.startswith("ranked_")]
    if not ranked or "fused" not in ndcg or max(ranked) >= ndcg["fused"]:
        return None
    return max(ranked), ndcg["fused"]


@dataclass(frozen=True)
class Candidates:
    """user_candidates.parquet and the retrieval quality measured on held-out interactions."""

    uri: str
    users_with_candidates: int
    candidates: int
    recall_at_k: float | None
    ndcg_at_10: float | None
    popularity_recall_at_k: float | None
    popularity_ndcg_at_10: float | None
    quality_users: int
    seconds: float
    entries_uri: str = ""  # candidate_entries.parquet: one cache entry (ids + feature rows) per user
    metrics_uri: str = ""  # retrieval_metrics.parquet: every method's held-out figures
    cold_recall_at_k: float | None = None
    ranker_kind: str = "none"
    ranker_version: str | None = None
    quality: tuple[MethodQuality, ...] = ()
    gate: str = ""  # the candidate gate's outcome: "passed: ...", or "not enough data to gate: ..."
    fallback: str | None = None  # the source published instead of the fused list (it lost to it on validation)


@dataclass(frozen=True)
class Checked:
    """The outputs passed their row contracts and dataset suites."""

    checked_rows: int
    data_docs: dict[str, str]
    suite_versions: dict[str, str]
    seconds: float


@dataclass(frozen=True)
class Staged:
    """The run's cache version, written but not yet visible, and the pointer it will replace."""

    cache_entries: int
    old_pointer: str | None


SCORED_BY = ("small", "large")  # item_scores.scored_by: the model whose topic decision an item carries


@dataclass(frozen=True)
class Routed:
    """The cascade (models/cascade.py): the items a larger encoder re-scored, why, within which budget, and its curve.

    Nothing routed (no large model, or a budget of 0) leaves every topic decision to the small model, as before.
    """

    uri: str | None  # routed.parquet: item_id, topic, topic_score of the routed items (None: none routed)
    curve_uri: str | None  # cascade_curve.parquet: the sample's agreement and cost at each share routed (None: no sample)
    large_version: str | None  # the large model's vector version (None: no large model configured)
    budget: str  # the budget as configured ("none", "share 0.2", "30 s", ...)
    items: int
    routed: int
    routed_truncated: int  # routed because the small model truncated the text
    routed_margin: int  # routed because the top-2 topic margin was small
    threshold: float | None  # the largest margin routed for its margin
    sample: int  # items encoded by both models for the curve
    agreement: float | None  # on the sample, at the run's share routed: cascade topic == all-large topic
    cost_ratio: float | None  # on the sample, at the run's share routed: cascade / all-large encode seconds
    large_seconds: float  # the large model's encode seconds (sample and routed items)
    seconds: float

    @classmethod
    def nothing(cls, items: int, large_version: str | None, budget: str, seconds: float) -> Routed:
        """Return the record of a run that routes nothing and draws no curve."""
        return cls(None, None, large_version, budget, items, 0, 0, 0, None, 0, None, None, 0.0, seconds)


@dataclass(frozen=True)
class Stages:
    """Every node's result of one run, as publication and the report read them."""

    ingested: Ingested
    validated: Validated
    plan: Plan
    encoded: EncodeTotals
    scored: Scored
    candidates: Candidates
    checked: Checked
    routed: Routed | None = None  # the cascade's node (None: a run recorded before it)

    def seconds(self) -> dict[str, float]:
        """Return each stage's seconds, in DAG order (stages the run did not have left out)."""
        stages = {name: getattr(self, attr) for name, attr in STAGE_NAMES.items()}
        return {name: round(float(stage.seconds), 3) for name, stage in stages.items() if stage is not None}


STAGE_NAMES = {
    "ingest": "ingested",
    "validate": "validated",
    "plan": "plan",
    "encode": "encoded",
    "route": "routed",
    "score": "scored",
    "candidates": "candidates",
    "validate_outputs": "checked",
}


@dataclass(frozen=True)
class RunRecord:
    """A finished run's scoring_runs row (storage/warehouse/schema.py RUN_COLUMNS holds the same names)."""

    run_id: str
    flow_run_id: str | None
    flow_name: str
    run_date: str
    status: str
    started_at: datetime
    finished_at: datetime
    rows_in: int
    rows_quarantined: int
    rows_scored: int
    rows_reused: int
    rows_computed: int
    shards_reused: int
    interactions_in: int
    interactions_quarantined: int
    users_with_candidates: int
    recall_at_k: float | None
    ndcg_at_10: float | None
    popularity_recall_at_k: float | None
    popularity_ndcg_at_10: float | None
    real_tokens: int
    padded_tokens: int
    padding_efficiency: float | None
    truncated_texts: int
    texts_per_s: float | None
    wall_seconds: float
    device: str
    model_version: str
    contract_versions: str
    stage_seconds: str  # JSON: stage -> seconds
    data_docs: str  # JSON: dataset -> Data Docs index.html
    backend: str | None = None
    precision: str | None = None
    token_budget: int | None = None
    engine_runtime: str | None = None
    fidelity_min: float | None = None
    fidelity_p1: float | None = None
    calibration_device_kind: str | None = None
    calibrated_tokens_per_s: float | None = None
    calibration_from_cache: bool | None = None
    engine_choice: str | None = None
    cold_recall_at_k: float | None = None
    ranker_kind: str | None = None
    ranker_version: str | None = None
    candidate_gate: str | None = None
    candidate_fallback: str | None = None
    cascade_model_version: str | None = None
    cascade_budget: str | None = None
    routed_items: int | None = None
    routed_truncated: int | None = None
    routed_margin: int | None = None
    cascade_threshold: float | None = None
    cascade_agreement: float | None = None
    cascade_cost_ratio: float | None = None
    cascade_seconds: float | None = None
    published_at: datetime | None = None
    message: str | None = None

    def row(self) -> dict[str, Any]:
        """Return the row as column -> value for the warehouse adapter."""
        return asdict(self)


@dataclass(frozen=True)
class Published:
    """A published run: its scoring_runs row as recorded, and what publication wrote."""

    record: RunRecord
    data_docs: dict[str, str]
    stage_seconds: dict[str, float]
    shards: int
    cache_entries: int
    serving_features: int = 0
    quality: tuple[MethodQuality, ...] = ()  # every retrieval method on the held-out interactions

    @property
    def run_id(self) -> str:
        """Return the published run's id."""
        return self.record.run_id


@dataclass(frozen=True)
class TrainedRanker:
    """A trained, versioned ranker in the lake and its offline metrics."""

    version: str
    uri: str
    trained_on: str
    metrics: dict[str, float]
    seconds: float
    previous: str | None = None  # the ranker the run served before: the same version means nothing changed
