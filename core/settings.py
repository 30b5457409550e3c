"""The one settings object of nightscore: every option in its group, its default, and its NIGHTSCORE_ variable.

Options are grouped by what they shape (``settings.lake``, ``.warehouse``, ``.cache``, ``.encoder``, ``.topics``,
``.candidates``, ``.contracts``, ``.serving``, ``.ops``); each default is written once, here. The environment
keeps one flat variable per option, ``NIGHTSCORE_<NAME>`` (its name is the field's alias where the group's own
field name is shorter: ``settings.lake.url`` is ``NIGHTSCORE_LAKE_URL``), and so do keyword arguments:
``Settings(lake_url=...)`` and ``Settings(lake={"url": ...})`` are the same settings.

This module and `core.environment` are the only ones that read or write the process environment. A flow run
resolves its settings once (`current_settings`, in its first task) and hands them down in its run reference; a
caller that runs a flow in-process with settings of its own (the CLI's ``--home``) passes them with
`settings_scope`, never by writing variables.
"""

from __future__ import annotations

import json
import os
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

ENV_PREFIX = "NIGHTSCORE_"

DEFAULT_TOPIC_LABELS: dict[str, str] = {
    "sports": "sports, athletes, teams, matches and championships",
    "politics": "politics, elections, governments, parliaments and policy",
    "technology": "technology, software, computers, chips and the internet",
    "cooking": "cooking, recipes, food, kitchens and restaurants",
    "travel": "travel, tourism, flights, hotels and destinations",
    "finance": "finance, markets, stocks, banks and the economy",
    "health": "health, medicine, doctors, fitness and disease",
    "music": "music, bands, albums, concerts and songs",
}

SourceName = Literal["cooccurrence", "als", "content", "trending", "topic_trending"]
SOURCE_NAMES: tuple[SourceName, ...] = ("cooccurrence", "als", "content", "trending", "topic_trending")

DEFAULT_EVENT_WEIGHTS: dict[str, float] = {"view": 1.0, "click": 2.0, "purchase": 4.0}


class Group(BaseModel):
    """A group of options: filled by its own field names or by its flat aliases (the NIGHTSCORE_ names)."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", validate_default=True)


class LakeSettings(Group):
    """Where inputs and run folders live: a local folder or an s3:// prefix, and how transport errors are retried."""

    url: str | None = Field(
        None, alias="lake_url", description="Lake root: a local path or s3://bucket/prefix. Default <home>/lake."
    )
    items_uri: str | None = Field(
        None,
        description="Items Parquet (local path or s3://) a run scores when it is given none: what the scheduled nightly "
        "and backfills read. No default: a run without inputs refuses (exit 2); `--demo` asks for the demo data.",
    )
    interactions_uri: str | None = Field(None, description="Interactions Parquet read with items_uri (the two are set together).")
    # Only read when the lake is s3://...; credentials come from the standard AWS variables (AWS_ACCESS_KEY_ID,
    # AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or the AWS config/profile, never from here.
    s3_endpoint_url: str | None = Field(
        None, description="S3-compatible endpoint of an s3:// lake (MinIO, moto, ...). Default: AWS_ENDPOINT_URL, else AWS."
    )
    s3_region: str | None = Field(None, description="Region of the lake's bucket. Default: AWS_DEFAULT_REGION / the AWS config.")
    retries: int = Field(
        3,
        ge=0,
        alias="lake_retries",
        description="Retries of a lake operation that failed in transport (connection reset, timeout), with backoff.",
    )
    retry_backoff_s: float = Field(
        0.5, ge=0, alias="lake_retry_backoff_s", description="First backoff of the lake retries in seconds (doubles each time)."
    )


class WarehouseSettings(Group):
    """The warehouse analysts query (DuckDB file or PostgreSQL URL) and how long its locks are waited for."""

    url: str | None = Field(
        None, alias="warehouse_url", description="DuckDB file path or postgresql:// URL. Default <home>/warehouse.duckdb."
    )
    query_url: str | None = Field(
        None,
        alias="query_warehouse_url",
        description="Warehouse URL `nightscore query` connects with; on PostgreSQL a read-only, non-superuser role "
        "(README, 'Analysts on PostgreSQL'). Default: warehouse_url.",
    )
    lock_timeout_s: float = Field(
        60.0,
        ge=0,
        alias="warehouse_lock_timeout_s",
        description="How long a warehouse operation waits for another process's lock before it fails "
        "(a locked warehouse is never taken for 'no warehouse yet').",
    )
    query_timeout_s: float = Field(
        300.0,
        gt=0,
        description="`nightscore query` stops an analyst's statement after this many seconds, reading its rows included "
        "(PostgreSQL: statement_timeout and idle_in_transaction_session_timeout of the analyst's session).",
    )
    query_max_rows: int = Field(
        10_000,
        ge=0,
        description="Rows `nightscore query` prints at most unless --limit says otherwise (0: all); a cut result says so.",
    )


class CacheSettings(Group):
    """The candidate cache the online ranker reads: embedded SQLite file or Redis."""

    url: str | None = Field(
        None, alias="cache_url", description="Embedded cache file (SQLite) or redis://host:port/db. Default <home>/cache.sqlite."
    )
    prefix: str = Field("nightscore", alias="cache_prefix", description="Key prefix of every cache entry.")
    version_grace_s: float = Field(
        86_400,
        ge=0,
        alias="cache_version_grace_s",
        description="Cache versions older than the previous one expire after this many seconds (0: dropped at once).",
    )
    retries: int = Field(
        2,
        ge=0,
        alias="cache_retries",
        description="Retries of a cache operation that failed in transport (Redis reset or timeout), with backoff.",
    )


class EncoderSettings(Group):
    """The sentence encoder and its engine: model, device, backend and precision, batching, `auto`'s calibration."""

    model: str | None = Field(
        None,
        description="A local folder in sentence-transformers layout (pooling, normalisation and max length from "
        "its own config; width from the model; version = its content digest). Default: the packaged all-MiniLM-L6-v2.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto picks CUDA when available.")
    precision: Literal["auto", "fp32", "bf16", "fp16", "int8"] = Field(
        "auto",
        description="auto: chosen with backend and token budget by calibration (persisted per device kind); int8 = "
        "per-channel weights and per-token activations (torch) or static int8 with the lossiest layer roles kept float "
        "(OpenVINO); a pinned mode under its fidelity floor is refused.",
    )
    backend: Literal["auto", "torch", "torch-packed", "openvino", "onnxruntime"] = Field(
        "auto",
        description="auto: chosen with precision and token budget by a short calibration at warm-up, "
        "persisted per device kind under engine_cache_dir; a pinned backend/precision under its floor is refused. "
        "torch-packed: torch on padding-free token-major batches (BERT encoders), a candidate auto times like the rest.",
    )
    num_threads: int | None = Field(None, ge=1, description="Torch intra-op threads on CPU. Default: all cores.")
    tokenizer_threads: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Tokenizer instances, one per worker thread, each tokenizing its chunk of a shard. Default: 1 on "
        "CPU (the model needs the cores; measured no faster with more), every core up to 16 on CUDA (the host feeds the GPU).",
    )
    compile_mode: Literal["none", "default", "reduce-overhead", "max-autotune-no-cudagraphs"] = Field(
        "none",
        description="CUDA only: torch.compile mode of the torch-packed backend's layers (reduce-overhead also captures "
        "CUDA graphs); none: eager. Off unless measured faster on the device (benchmarks/inference.py "
        "--compile-modes); ignored on CPU.",
    )
    max_seq_length: int = Field(256, ge=8, le=512, description="Tokens per text; longer texts are truncated.")
    token_budget: int | None = Field(
        None,
        ge=64,
        description="Max rows x padded length per batch. Default: auto's calibrated budget (or 2048 CPU / 65536 CUDA).",
    )
    streams: int = Field(
        1,
        ge=1,
        le=64,
        description="Batches run at once on a multi-stream backend (OpenVINO CPU streams) when the mode is pinned; "
        "auto measures 1, 2, 4 and the thread count.",
    )
    bucket_boundaries: list[int] = Field(
        [32, 64, 128, 256], description="Upper token lengths of the length buckets (last one catches the rest)."
    )
    shard_size: int = Field(1024, ge=1, description="Rows per shard (the unit of scheduling and checkpointing).")
    fidelity_floor_float: float = Field(
        0.999, gt=0, le=1, description="Min cosine to torch fp32 on the probe texts for float modes (bf16, fp16, fp32 elsewhere)."
    )
    fidelity_floor_int8: float = Field(0.99, gt=0, le=1, description="Min cosine to torch fp32 on the probe texts for int8.")
    padding_floor: float = Field(
        0.97,
        ge=0,
        le=1,
        description="auto: min padding efficiency (real / computed token slots) of the chosen mode on the calibration"
        " corpus; a length multiple that pads more is passed over while a mode pads less. 0: speed alone decides.",
    )
    calibration_budgets: list[int] | None = Field(
        None, description="Token budgets auto tries. Default 1024/2048/4096 on CPU, 16k-128k on CUDA; token_budget pins one."
    )
    recalibrate: bool = Field(False, description="Ignore the persisted calibration and measure again (then persist).")
    calibrate_when_encode_s: float = Field(
        300.0,
        ge=0,
        description="auto on a machine kind not calibrated yet: calibrate (1-4 minutes on a small CPU) only when the run's "
        "texts would take at least this many seconds to encode in the default mode (timed on one batch); a shorter run "
        "encodes in the default mode (torch fp32 on CPU, bf16/fp16 on CUDA) and `nightscore calibrate` measures the "
        "machine. 0: always calibrate.",
    )
    engine_cache_dir: Path | None = Field(
        None,
        description="Converted models (by model digest, backend, precision) and calibrations, shared by every home on "
        "this machine. Default: the user cache folder (platformdirs: ~/.cache/nightscore/engine on Linux).",
    )

    @field_validator("bucket_boundaries")
    @classmethod
    def _sorted_boundaries(cls, value: list[int]) -> list[int]:
        if not value or sorted(set(value)) != value or value[0] < 1:
            raise ValueError("bucket_boundaries must be strictly increasing positive integers")
        return value


class TopicSettings(Group):
    """Zero-shot topics: the labels items are scored against."""

    labels: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_TOPIC_LABELS),
        alias="topic_labels",
        description="Topic name -> description embedded as its label.",
    )
    temperature: float = Field(0.05, gt=0, alias="topic_temperature", description="Softmax temperature over label cosines.")
    # The cascade (docs/cascade.md): every item's topic from the encoder above; the uncertain ones again from a larger one.
    large_model: str | None = Field(
        None,
        description="A local folder in sentence-transformers layout: the larger encoder uncertain topic decisions are "
        "routed to (loaded offline, run by the same engine and mode settings). None: no cascade, nothing is routed.",
    )
    large_max_seq_length: int = Field(
        512, ge=8, le=512, description="Tokens per text of the large model (a cap: its own max_seq_length applies when lower)."
    )
    cascade_budget_share: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Share of the run's items the large model may re-score (the margin threshold is tuned to it each "
        "run). None and cascade_budget_s None: nothing is routed; both set: the smaller budget applies.",
    )
    cascade_budget_s: float | None = Field(
        None,
        ge=0,
        description="Seconds the large model may spend re-scoring the run's items (its speed is timed on the sample; "
        "the sample's seconds count too). None: no budget in seconds.",
    )
    cascade_sample: int = Field(
        256,
        ge=0,
        le=100_000,
        description="Items (a seeded random sample) encoded by both models each run for the report's curve: agreement "
        "with the all-large topics against the share routed and the encode cost (0: no curve).",
    )
    cascade_route_truncated: bool = Field(
        True,
        description="Route the texts the small model truncated (token_count at its max length) before the uncertain ones.",
    )


class CandidateSettings(Group):
    """The candidate stage (models/recommender): sources, fusion, the stage-two ranker, evaluation and the gate."""

    top_k: int = Field(100, ge=1, le=1000, description="K: candidates per user (and the K of recall@K).")
    user_chunk: int = Field(2048, ge=1, description="Users per chunk in every candidate source and in publishing.")
    recency_half_life_days: float = Field(14.0, gt=0, description="Half-life of an interaction's weight.")
    event_weights: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_EVENT_WEIGHTS), description="Weight of each event type in user vectors."
    )
    sources: list[SourceName] = Field(
        default_factory=lambda: list(SOURCE_NAMES),
        alias="candidate_sources",
        description="Retrieval sources fused into the candidates (content also yields content_new: items with no interactions).",
    )
    per_source: int = Field(100, ge=1, alias="candidate_per_source", description="N: each source list's length before the union.")
    holdout_share: float = Field(
        0.1,
        gt=0,
        lt=1,
        alias="candidate_holdout_share",
        description="Share of the run's interactions, latest by time, held out for evaluation (and, inside "
        "the rest, for validation).",
    )
    max_tune_users: int = Field(
        5_000, ge=1, alias="candidate_max_tune_users", description="Users sampled to tune the fusion and train the rankers."
    )
    max_eval_users: int = Field(
        20_000, ge=1, alias="candidate_max_eval_users", description="Users sampled to evaluate on the held-out split."
    )
    max_new_items: int = Field(
        100_000, ge=1, alias="candidate_max_new_items", description="Newest interaction-less items content_new scores."
    )
    cooc_max_history: int = Field(50, ge=1, description="Co-visitation: a user's latest interactions that pair up.")
    cooc_window: int = Field(8, ge=1, description="Co-visitation: pairs within this many steps of a user's history.")
    cooc_neighbours: int = Field(100, ge=1, description="Co-visitation: neighbours kept per item (never a dense matrix).")
    cooc_alpha: float = Field(0.5, ge=0, le=1, description="Co-visitation: normalisation exponent (0.5 = cosine).")
    cooc_pairs_per_pass: int = Field(20_000_000, ge=1_000, description="Co-visitation: pairs aggregated per pass (memory bound).")
    cooc_serving_neighbours: int = Field(
        20,
        ge=0,
        description="Co-visitation: neighbours per item published for the online ranker's boost "
        "(serving/<run_id>/neighbours.parquet; 0: none published).",
    )
    als_factors: int = Field(64, ge=1, description="ALS: latent factors.")
    als_regularization: float = Field(0.05, ge=0, description="ALS: L2 regularisation.")
    als_alpha: float = Field(10.0, gt=0, description="ALS: confidence scaling of an interaction.")
    als_confidence: Literal["log", "linear"] = Field("log", description="ALS: confidence = 1 + alpha x log(1 + w/eps) or x w.")
    als_iterations: int = Field(15, ge=1, description="ALS: iterations.")
    trend_half_life_days: float = Field(7.0, gt=0, description="Trending: half-life of an interaction's count.")
    trend_min_users: int = Field(
        3, ge=1, description="Trending: an item trends only once this many distinct users interacted with it."
    )
    trend_user_cap: float = Field(
        2.0,
        gt=0,
        description="Trending: one user's weight on one item, at most (event weights summed, decayed): a few users "
        "repeating events cannot make an item trend.",
    )
    trend_new_user_days: float = Field(
        1.0,
        ge=0,
        description="Trending: a user's events count in proportion to the days since the user's first interaction, "
        "fully after this many (0: at once): a handful of brand-new (fake) users cannot make an item trend.",
    )
    topic_smoothing: float = Field(0.02, ge=0, description="Topic trending: additive smoothing of a user's topic shares.")
    fusion_quota_grid: list[float] = Field(
        default_factory=lambda: [0.0, 0.05, 0.1, 0.2, 0.3],
        description="Fusion tuning: the shares of K tried as the quota of new (interaction-less) items. Larger quotas "
        "find more new items and cost recall of the others (docs/tables.md).",
    )
    fusion_cold_target: float = Field(
        0.3, ge=0, le=1, description="Fusion tuning: the smallest new-item quota whose validation cold recall reaches this."
    )
    ranker_rounds: int = Field(300, ge=1, description="LightGBM LambdaRank (first stage and stage two): boosting rounds.")
    ranker_learning_rate: float = Field(0.05, gt=0, description="LightGBM: learning rate.")
    ranker_leaves: int = Field(31, ge=2, description="LightGBM: leaves per tree.")
    gate_recall_margin: float = Field(
        0.0,
        alias="candidate_gate_recall_margin",
        description="Gate: the run fails (exit 3) when fused recall@K is below popularity's recall@K + this margin "
        "with confidence (the paired bootstrap's upper bound of fused - popularity over held-out users is under it).",
    )
    gate_min_cold_recall: float = Field(
        0.0,
        ge=0,
        le=1,
        alias="candidate_gate_min_cold_recall",
        description="Gate: the run fails (exit 3) when the fused cold-item recall@K is under this (set "
        "0.25 for a catalogue whose texts describe their items; fewer than gate_min_cold_pairs held-out cold "
        "pairs = nothing to fail).",
    )
    gate_min_users: int = Field(
        50,
        ge=1,
        alias="candidate_gate_min_users",
        description="Gate and fallback: with fewer evaluated users than this the recall comparison is not made "
        "(the run records 'not enough data to gate'; the fused list ships).",
    )
    gate_min_cold_pairs: int = Field(
        20, ge=1, alias="candidate_gate_min_cold_pairs", description="Gate: held-out cold pairs needed to check the cold floor."
    )
    gate_bootstrap_rounds: int = Field(
        1000, ge=100, alias="candidate_gate_bootstrap_rounds", description="Gate and fallback: paired bootstrap resamples."
    )
    gate_confidence: float = Field(
        0.95,
        ge=0.5,
        lt=1,
        alias="candidate_gate_confidence",
        description="Gate and fallback: one-sided confidence that a list is worse before the run fails or the "
        "stage falls back to the source that beats its fusion on validation.",
    )
    seed: int = Field(0, description="Seed of every sample, ALS and LightGBM.")


class ContractSettings(Group):
    """Data contracts: row rules, quarantine limits and the dataset suites' tolerances."""

    quarantine_max_share: float = Field(
        0.05, ge=0, le=1, description="A dataset with a larger quarantined share fails the run (exit 3)."
    )
    max_text_chars: int = Field(100_000, ge=1, description="Longest accepted item text, in characters.")
    future_tolerance_hours: float = Field(24.0, ge=0, description="How far past the run date a timestamp may lie.")
    duplicate_id_policy: Literal["quarantine_all", "keep_latest"] = Field(
        "quarantine_all",
        description="Items sharing an item_id: quarantine_all quarantines every copy; keep_latest keeps "
        "the copy with the latest created_at (ties: the later row in the file) and quarantines the others.",
    )
    row_count_band: float = Field(0.5, ge=0, description="Dataset suites: allowed row-count change vs the previous run.")
    topic_share_tolerance: float = Field(0.1, ge=0, le=1, description="Dataset suites: allowed change of a topic's share.")
    mean_topic_score_tolerance: float = Field(0.1, ge=0, le=1, description="Dataset suites: allowed change of mean topic_score.")
    min_user_coverage: float = Field(0.9, ge=0, le=1, description="Dataset suites: users with candidates / users, at least.")
    data_docs_base_url: str | None = Field(
        None,
        description="HTTP(S) URL serving the lake root: run summaries link the GX Data Docs under it. Without it "
        "they link the run's contracts artifact in the Prefect UI.",
    )


class ServingSettings(Group):
    """The online ranker (`nightscore serve`); each option is NIGHTSCORE_SERVING_<NAME>."""

    fallback: bool = Field(
        True,
        alias="serving_fallback",
        description="Answer popular items (200, fallback popular) when the cache is down; else 503.",
    )
    max_in_flight: int = Field(
        256, ge=0, alias="serving_max_in_flight", description="Recommendation requests served at once; more are refused with 429."
    )
    model_refresh_s: float = Field(
        30.0,
        ge=0,
        alias="serving_model_refresh_s",
        description="How often the lake's current ranker is checked for a new one (0: never).",
    )
    blas_threads: int = Field(
        1, ge=1, alias="serving_blas_threads", description="BLAS/OpenMP threads of the ranker's forward pass (small matrices: 1)."
    )
    batching: bool = Field(
        True, alias="serving_batching", description="Score concurrent requests in one model call (False: one call per request)."
    )
    max_batch: int = Field(32, ge=1, alias="serving_max_batch", description="Most requests scored in one model call.")
    max_queue_delay_us: int = Field(
        0,
        ge=0,
        alias="serving_max_queue_delay_us",
        description="Longest a request waits for others to join its batch, us (0: those ready in the same loop turn).",
    )
    cache_timeout_s: float = Field(
        0.25, gt=0, alias="serving_cache_timeout_s", description="Socket timeout of a Redis cache read (then: fallback)."
    )
    breaker_open_s: float = Field(
        1.0, ge=0, alias="serving_breaker_open_s", description="After a cache failure, requests skip the cache this long."
    )
    cache_pool_size: int = Field(64, ge=1, alias="serving_cache_pool_size", description="Redis connections per worker.")
    events_retention_s: float = Field(
        172_800.0, gt=0, alias="serving_events_retention_s", description="How long events are kept (stream trim, recent items)."
    )
    events_max: int = Field(
        1_000_000, ge=1, alias="serving_events_max", description="Events held at most; more are refused with 429 until exported."
    )
    exclude_recent: bool = Field(
        True, alias="serving_exclude_recent", description="Drop candidates the user interacted with after their run was computed."
    )
    cooc_boost: float = Field(
        0.0,
        ge=0,
        alias="serving_cooc_boost",
        description="Add this x a candidate's co-visitation with the user's fresh events to its score (0: off; "
        "the run's neighbours are then not loaded).",
    )
    api_keys: list[Annotated[str, Field(min_length=16)]] = Field(
        default_factory=list,
        alias="serving_api_keys",
        description="Keys (16+ characters each) a client sends as `Authorization: Bearer <key>` or `X-API-Key` (JSON "
        "list). POST /v1/events and /metrics always need one, recommendations unless open_reads; none set: the service "
        "refuses to start unless allow_no_keys.",
    )
    open_reads: bool = Field(
        False, alias="serving_open_reads", description="Answer recommendations without a key (events and /metrics need one)."
    )
    allow_no_keys: bool = Field(
        False,
        alias="serving_allow_no_keys",
        description="Let the service start without api_keys, every endpoint open (single-host setups, tests).",
    )
    rate_limit_per_s: float = Field(
        100.0,
        ge=0,
        alias="serving_rate_limit_per_s",
        description="Requests per second a client (its key, else its address) may make to /v1/* per worker; more get "
        "429 with Retry-After (0: no limit).",
    )
    rate_limit_burst: int = Field(
        200, ge=1, alias="serving_rate_limit_burst", description="Requests a client may make at once above its rate."
    )
    events_max_age_s: float = Field(
        86_400.0,
        gt=0,
        alias="serving_events_max_age_s",
        description="An event whose ts is older than this is refused with 422 (its day may be exported already).",
    )


class OpsSettings(Group):
    """Operations: Prefect, the task runner and Ray, deployments and schedules, leases, callbacks, fail points."""

    prefect_startup_timeout_s: int = Field(120, ge=1, description="Startup timeout of Prefect's temporary server.")
    prefect_port: int = Field(4200, ge=1, le=65535, description="Port of the Prefect server `nightscore up` starts on 127.0.0.1.")
    task_runner: Literal["local", "ray"] = Field(
        "local",
        description="local: shards one at a time in the flow's process; ray: encode shards as Ray tasks "
        "(one GPU each when the cluster has GPUs). Needs PREFECT_API_URL (a real Prefect server) under ray.",
    )
    ray_address: str | None = Field(
        None,
        description="Ray cluster to use under task_runner=ray: None starts a local Ray in this process; "
        "'auto' joins the cluster this node belongs to; 'ray://host:10001' connects through Ray Client.",
    )
    ray_num_cpus: int | None = Field(None, ge=1, description="CPUs of the local Ray (ray_address None). Default: all cores.")
    schedule_timezone: str = Field("UTC", description="Timezone of the nightly and train-ranker crons (IANA name).")
    nightly_cron: str = Field("0 3 * * *", description="Cron of the nightly deployment (default 03:00).")
    train_ranker_cron: str = Field("0 5 * * 0", description="Cron of the weekly train-ranker deployment (Sunday 05:00).")
    work_pool: str = Field("nightscore", description="Process work pool of the deployments (queues on-demand and scheduled).")
    work_pool_concurrency: int | None = Field(
        2,
        ge=1,
        description="Flow runs the work pool runs at once (`nightscore deploy`/`up`); more wait as Scheduled, "
        "in queue priority order. None: no limit.",
    )
    gpu_limit: str | None = Field("gpu", description="Global concurrency limit every encode shard holds a slot of; empty = none.")
    gpu_slots: int = Field(1, ge=1, description="Slots of the gpu limit that `nightscore up` creates (one per GPU).")
    gpu_slot_lease_s: float = Field(
        60.0,
        ge=60,
        le=86400,
        description="Lease of a held gpu slot, renewed while its shard encodes: a run killed mid-shard frees its slot "
        "this long after (60, Prefect's minimum; Prefect's own default of 300 kept a killed run's slot for 5 minutes).",
    )
    hourly_price_usd: float = Field(
        2.0, ge=0, description="Hourly price of the scoring machine, for cost per 1k items in run reports."
    )
    run_lease_ttl_s: float = Field(
        120.0,
        gt=0,
        description="A run holds a lease on its run date, renewed every third of this many seconds; a lease "
        "not renewed for this long has expired (its holder died) and the run may be resumed.",
    )
    run_lease_wait_s: float = Field(
        300.0,
        ge=0,
        description="How long a second attempt for a run date waits for the live attempt's lease before it "
        "fails naming the holder.",
    )
    callback_allow_private: bool = Field(
        False, description="Let callback_url name loopback, link-local and private addresses (single-host setups, tests)."
    )
    failpoints: dict[str, str] = Field(
        default_factory=dict,
        description="Tests only (core/failpoints.py): named points of a run that pause ('pause') or fail with an injected "
        'disk-full error (\'enospc\'), e.g. {"publish:before-commit": "enospc"}. Empty in every real run.',
    )


GROUPS: dict[str, type[Group]] = {
    "lake": LakeSettings,
    "warehouse": WarehouseSettings,
    "cache": CacheSettings,
    "encoder": EncoderSettings,
    "topics": TopicSettings,
    "candidates": CandidateSettings,
    "contracts": ContractSettings,
    "serving": ServingSettings,
    "ops": OpsSettings,
}


def flat_names() -> dict[str, tuple[str, str]]:
    """Return every grouped option's flat name (alias, else field name) -> (group, field)."""
    return {(info.alias or name): (group, name) for group, model in GROUPS.items() for name, info in model.model_fields.items()}


def _is_complex(info: FieldInfo) -> bool:
    """Return whether a field's environment value is JSON (lists, dicts), not a plain string."""
    kinds = [info.annotation]
    if isinstance(info.annotation, types.UnionType) or typing.get_origin(info.annotation) is typing.Union:
        kinds = [k for k in typing.get_args(info.annotation) if k is not type(None)]
    return any(typing.get_origin(k) in (list, dict, tuple) or k in (list, dict, tuple) for k in kinds)


class FlatEnvironment(PydanticBaseSettingsSource):
    """NIGHTSCORE_<NAME> variables, one per option, sorted into their groups (JSON for lists and dicts)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """Return nothing per field: __call__ reads every variable at once."""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        """Return the options the environment sets, nested by group."""
        values: dict[str, Any] = {}
        for flat, (group, name) in flat_names().items():
            raw = os.environ.get(ENV_PREFIX + flat.upper())
            if raw is not None:
                info = GROUPS[group].model_fields[name]
                values.setdefault(group, {})[name] = json.loads(raw) if _is_complex(info) else raw
        home = os.environ.get(ENV_PREFIX + "HOME")
        if home is not None:
            values["home"] = home
        return values


class Settings(BaseSettings):
    """Every nightscore option, by group; each is also read from the environment as NIGHTSCORE_<NAME>."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    home: Path = Field(Path(".nightscore"), description="Folder of the embedded defaults (lake, DuckDB, cache).")
    lake: LakeSettings = Field(default_factory=LakeSettings)
    warehouse: WarehouseSettings = Field(default_factory=WarehouseSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    encoder: EncoderSettings = Field(default_factory=EncoderSettings)
    topics: TopicSettings = Field(default_factory=TopicSettings)
    candidates: CandidateSettings = Field(default_factory=CandidateSettings)
    contracts: ContractSettings = Field(default_factory=ContractSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    ops: OpsSettings = Field(default_factory=OpsSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Return keyword arguments first, then the flat NIGHTSCORE_ variables (no .env or secrets files)."""
        return init_settings, FlatEnvironment(settings_cls)

    @model_validator(mode="before")
    @classmethod
    def _group_flat_names(cls, data: Any) -> Any:
        """Sort flat option names (lake_url=..., top_k=...) into their groups; a group's own values win over none."""
        if not isinstance(data, dict):
            return data
        names, grouped = flat_names(), dict(data)
        for key in [k for k in grouped if k in names]:
            group, field = names[key]
            current = grouped.get(group) or {}
            if isinstance(current, Group):
                current = current.model_dump()
            grouped[group] = {**current, field: grouped.pop(key)}
        return grouped

    @property
    def lake_root(self) -> str:
        """Return the lake root URI (local path or s3://...)."""
        return self.lake.url or str(self.home / "lake")

    @property
    def warehouse_location(self) -> str:
        """Return the warehouse URL or DuckDB path."""
        return self.warehouse.url or str(self.home / "warehouse.duckdb")

    @property
    def cache_location(self) -> str:
        """Return the cache URL (redis://) or embedded store path."""
        return self.cache.url or str(self.home / "cache.sqlite")

    @property
    def query_warehouse_location(self) -> str:
        """Return the warehouse URL or path analysts' queries use (query_url, else the warehouse's)."""
        return self.warehouse.query_url or self.warehouse_location

    @property
    def engine_cache(self) -> Path:
        """Return the folder of converted models and calibrations: one per user and machine, whatever the home."""
        return self.encoder.engine_cache_dir or Path(platformdirs.user_cache_dir("nightscore")) / "engine"

    @property
    def logs_dir(self) -> Path:
        """Return the folder of the log files (one per command or flow run)."""
        return self.home / "logs"

    def with_inputs(self, items_uri: str, interactions_uri: str) -> Settings:
        """Return these settings with the inputs a run reads when it is given none (lake.items_uri and interactions_uri)."""
        lake = self.lake.model_copy(update={"items_uri": items_uri, "interactions_uri": interactions_uri})
        return self.model_copy(update={"lake": lake})

    def flat(self, exclude_defaults: bool = True) -> dict[str, Any]:
        """Return the settings as flat option name -> JSON value (what NIGHTSCORE_<NAME> variables hold)."""
        out: dict[str, Any] = {"home": str(self.home)}
        for group in GROUPS:
            values = getattr(self, group).model_dump(mode="json", by_alias=True, exclude_defaults=exclude_defaults)
            out.update(values)
        return out


def load_settings(**overrides: object) -> Settings:
    """Return settings read from NIGHTSCORE_* variables, with explicit (flat or grouped) overrides on top."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]


_SCOPED: ContextVar[Settings | None] = ContextVar("nightscore_settings", default=None)


@contextmanager
def settings_scope(settings: Settings) -> Iterator[Settings]:
    """Make settings the ones flow runs started inside the block resolve (the CLI's --home and friends)."""
    token = _SCOPED.set(settings)
    try:
        yield settings
    finally:
        _SCOPED.reset(token)


def current_settings() -> Settings:
    """Return the settings of the enclosing settings_scope, else those of this process's NIGHTSCORE_* variables."""
    return _SCOPED.get() or load_settings()
