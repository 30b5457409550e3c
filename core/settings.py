"""The one settings object of nightscore: every option, its default, and its NIGHTSCORE_ variable.

This is the only module that reads or writes the process environment (serving/config.py reads the
service's own options): `load_settings` reads NIGHTSCORE_* variables, `apply_runtime_defaults` sets the
switches of the libraries we drive (Prefect, Hugging Face, Great Expectations), and `child_environment`
builds the environment of the processes we start (workers, servers, Ray workers).

A flow run resolves its settings once (`current_settings`, in its first task) and hands them down in its
run reference; a caller that runs a flow in-process with settings of its own (the CLI's ``--home``) passes
them with `settings_scope`, never by writing variables.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

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


class Settings(BaseSettings):
    """Every nightscore option; each is also read from the environment as NIGHTSCORE_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="NIGHTSCORE_", env_nested_delimiter="__", extra="ignore")

    # --- where things live -------------------------------------------------------------------
    home: Path = Field(Path(".nightscore"), description="Folder of the embedded defaults (lake, DuckDB, cache).")
    lake_url: str | None = Field(None, description="Lake root: a local path or s3://bucket/prefix. Default <home>/lake.")
    warehouse_url: str | None = Field(None, description="DuckDB file path. Default <home>/warehouse.duckdb.")
    cache_url: str | None = Field(
        None, description="Embedded cache file (SQLite) or redis://host:port/db. Default <home>/cache.sqlite."
    )
    cache_prefix: str = Field("nightscore", description="Key prefix of every cache entry.")

    # --- lake on S3 --------------------------------------------------------------------------
    # Only read when lake_url is s3://...; credentials come from the standard AWS variables
    # (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or the AWS config/profile, never from here.
    s3_endpoint_url: str | None = Field(
        None, description="S3-compatible endpoint of an s3:// lake (MinIO, moto, ...). Default: AWS_ENDPOINT_URL, else AWS."
    )
    s3_region: str | None = Field(None, description="Region of the lake's bucket. Default: AWS_DEFAULT_REGION / the AWS config.")

    # --- cache versions ------------------------------------------------------------------------
    cache_version_grace_s: float = Field(
        86_400,
        ge=0,
        description="Cache versions older than the previous one expire after this many seconds (0: dropped at once).",
    )

    # --- encoder ---------------------------------------------------------------------------
    encoder: Literal["minilm", "tiny"] = Field(
        "minilm", description="minilm: the real all-MiniLM-L6-v2; tiny: a random 1-layer model of the same shape (tests)."
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto picks CUDA when available.")
    precision: Literal["auto", "fp32", "bf16", "fp16", "int8"] = Field(
        "auto",
        description="auto: chosen with backend and token budget by calibration (persisted per device kind); int8 = "
        "per-channel weights and per-token activations (torch) or static int8 with the lossiest layer roles kept float "
        "(OpenVINO); a pinned mode under its fidelity floor is refused.",
    )
    num_threads: int | None = Field(None, ge=1, description="Torch intra-op threads on CPU. Default: all cores.")
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
    # Engine backends and `auto` (issue 16): models/ takes these through EncoderSpec, never from the environment.
    model: str | None = Field(
        None,
        description="A local folder in sentence-transformers layout (pooling, normalisation and max length from "
        "its own config; width from the model; version = its content digest). Default: the packaged all-MiniLM-L6-v2.",
    )
    backend: Literal["auto", "torch", "openvino", "onnxruntime"] = Field(
        "auto",
        description="auto: chosen with precision and token budget by a short calibration at warm-up, "
        "persisted per device kind under engine_cache_dir; a pinned backend/precision under its floor is refused.",
    )
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
    engine_cache_dir: Path | None = Field(
        None, description="Converted models (by model digest, backend, precision) and calibrations. Default <home>/engine."
    )

    # --- scoring ---------------------------------------------------------------------------
    topic_labels: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_TOPIC_LABELS), description="Topic name -> description embedded as its label."
    )
    topic_temperature: float = Field(0.05, gt=0, description="Softmax temperature over label cosines.")
    top_k: int = Field(100, ge=1, le=1000, description="K: candidates per user (and the K of recall@K).")
    user_chunk: int = Field(2048, ge=1, description="Users per chunk in every candidate source and in publishing.")
    recency_half_life_days: float = Field(14.0, gt=0, description="Half-life of an interaction's weight.")
    event_weights: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_EVENT_WEIGHTS), description="Weight of each event type in user vectors."
    )

    # --- candidates: sources, fusion, ranker, gate (models/recommender/candidate_stage.py) ----------------------------
    candidate_sources: list[SourceName] = Field(
        default_factory=lambda: list(SOURCE_NAMES),
        description="Retrieval sources fused into the candidates (content also yields content_new: items with no interactions).",
    )
    candidate_per_source: int = Field(100, ge=1, description="N: each source list's length before the union.")
    candidate_holdout_share: float = Field(
        0.1,
        gt=0,
        lt=1,
        description="Share of the run's interactions, latest by time, held out for evaluation (and, inside "
        "the rest, for validation).",
    )
    candidate_max_tune_users: int = Field(5_000, ge=1, description="Users sampled to tune the fusion and train the rankers.")
    candidate_max_eval_users: int = Field(20_000, ge=1, description="Users sampled to evaluate on the held-out split.")
    candidate_max_new_items: int = Field(100_000, ge=1, description="Newest interaction-less items content_new scores.")
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
    topic_smoothing: float = Field(0.02, ge=0, description="Topic trending: additive smoothing of a user's topic shares.")
    fusion_quota_grid: list[float] = Field(
        default_factory=lambda: [0.0, 0.05, 0.1, 0.2, 0.3],
        description="Fusion tuning: the shares of K tried as the quota "
        "of new (interaction-less) items. Larger quotas find more new items and cost recall of the others (docs/tables.md).",
    )
    fusion_cold_target: float = Field(
        0.3, ge=0, le=1, description="Fusion tuning: the smallest new-item quota whose validation cold recall reaches this."
    )
    ranker_rounds: int = Field(300, ge=1, description="LightGBM LambdaRank (first stage and stage two): boosting rounds.")
    ranker_learning_rate: float = Field(0.05, gt=0, description="LightGBM: learning rate.")
    ranker_leaves: int = Field(31, ge=2, description="LightGBM: leaves per tree.")
    candidate_gate_recall_margin: float = Field(
        0.0, description="Gate: the run fails (exit 3) when fused recall@K < popularity's recall@K + this margin."
    )
    candidate_gate_min_cold_recall: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Gate: the run fails (exit 3) when the fused cold-item recall@K is under this (set "
        "0.25 for a catalogue whose texts describe their items; no held-out cold item = nothing to fail).",
    )
    seed: int = Field(0, description="Seed of every sample, ALS and LightGBM.")

    # --- contracts -------------------------------------------------------------------------
    quarantine_max_share: float = Field(
        0.05, ge=0, le=1, description="A dataset with a larger quarantined share fails the run (exit 3)."
    )
    max_text_chars: int = Field(100_000, ge=1, description="Longest accepted item text, in characters.")
    future_tolerance_hours: float = Field(24.0, ge=0, description="How far past the run date a timestamp may lie.")

    row_count_band: float = Field(0.5, ge=0, description="Dataset suites: allowed row-count change vs the previous run.")
    topic_share_tolerance: float = Field(0.1, ge=0, le=1, description="Dataset suites: allowed change of a topic's share.")
    mean_topic_score_tolerance: float = Field(0.1, ge=0, le=1, description="Dataset suites: allowed change of mean topic_score.")
    min_user_coverage: float = Field(0.9, ge=0, le=1, description="Dataset suites: users with candidates / users, at least.")

    # --- resilience --------------------------------------------------------------------------
    fault_pause_at: str | None = Field(
        None, description="Chaos/test hook: pause at a named point (ingest, shard:N, publish) until stopped or killed."
    )

    # --- prefect ---------------------------------------------------------------------------
    prefect_startup_timeout_s: int = Field(120, ge=1, description="Startup timeout of Prefect's temporary server.")

    # --- distributed -------------------------------------------------------------------------
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

    # --- deployments (nightscore up, the Prefect UI) ---------------------------------------
    schedule_timezone: str = Field("UTC", description="Timezone of the nightly and train-ranker crons (IANA name).")
    nightly_cron: str = Field("0 3 * * *", description="Cron of the nightly deployment (default 03:00).")
    train_ranker_cron: str = Field("0 5 * * 0", description="Cron of the weekly train-ranker deployment (Sunday 05:00).")
    work_pool: str = Field("nightscore", description="Process work pool of the deployments (queues on-demand and scheduled).")
    gpu_limit: str | None = Field("gpu", description="Global concurrency limit every encode shard holds a slot of; empty = none.")
    gpu_slots: int = Field(1, ge=1, description="Slots of the gpu limit that `nightscore up` creates (one per GPU).")
    hourly_price_usd: float = Field(
        2.0, ge=0, description="Hourly price of the scoring machine, for cost per 1k items in run reports."
    )
    prefect_port: int = Field(4200, ge=1, le=65535, description="Port of the Prefect server `nightscore up` starts on 127.0.0.1.")

    # --- safety and operations (issue 18) ---
    query_warehouse_url: str | None = Field(
        None,
        description="Warehouse URL `nightscore query` connects with; on PostgreSQL a read-only, non-superuser role "
        "(README, 'Analysts on PostgreSQL'). Default: warehouse_url.",
    )
    warehouse_lock_timeout_s: float = Field(
        60.0,
        ge=0,
        description="How long a warehouse operation waits for another process's lock before it fails "
        "(a locked warehouse is never taken for 'no warehouse yet').",
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
    work_pool_concurrency: int | None = Field(
        2,
        ge=1,
        description="Flow runs the work pool runs at once (`nightscore deploy`/`up`); more wait as Scheduled, "
        "in queue priority order. None: no limit.",
    )
    lake_retries: int = Field(
        3, ge=0, description="Retries of a lake operation that failed in transport (connection reset, timeout), with backoff."
    )
    lake_retry_backoff_s: float = Field(
        0.5, ge=0, description="First backoff of the lake retries in seconds (doubles each time)."
    )
    cache_retries: int = Field(
        2, ge=0, description="Retries of a cache operation that failed in transport (Redis reset or timeout), with backoff."
    )
    duplicate_id_policy: Literal["quarantine_all", "keep_latest"] = Field(
        "quarantine_all",
        description="Items sharing an item_id: quarantine_all quarantines every copy; keep_latest keeps "
        "the copy with the latest created_at (ties: the later row in the file) and quarantines the others.",
    )
    data_docs_base_url: str | None = Field(
        None,
        description="HTTP(S) URL serving the lake root: run summaries link the GX Data Docs under it. Without it "
        "they link the run's contracts artifact in the Prefect UI.",
    )
    fault_fail_at: str | None = Field(
        None,
        description="Chaos/test hook: raise an injected I/O error at a named point (publish:before-commit, "
        "publish:partitions, publish:after-partitions).",
    )

    @field_validator("bucket_boundaries")
    @classmethod
    def _sorted_boundaries(cls, value: list[int]) -> list[int]:
        if not value or sorted(set(value)) != value or value[0] < 1:
            raise ValueError("bucket_boundaries must be strictly increasing positive integers")
        return value

    @property
    def lake_root(self) -> str:
        """Return the lake root URI (local path or s3://...)."""
        return self.lake_url or str(self.home / "lake")

    @property
    def warehouse_location(self) -> str:
        """Return the warehouse URL or DuckDB path."""
        return self.warehouse_url or str(self.home / "warehouse.duckdb")

    @property
    def cache_location(self) -> str:
        """Return the cache URL (redis://) or embedded store path."""
        return self.cache_url or str(self.home / "cache.sqlite")

    @property
    def query_warehouse_location(self) -> str:
        """Return the warehouse URL or path analysts' queries use (query_warehouse_url, else the warehouse's)."""
        return self.query_warehouse_url or self.warehouse_location

    @property
    def engine_cache(self) -> Path:
        """Return the folder of converted models and calibrations (local: OpenVINO reads its IR files from disk)."""
        return self.engine_cache_dir or self.home / "engine"

    @property
    def logs_dir(self) -> Path:
        """Return the folder of the log files (one per command or flow run)."""
        return self.home / "logs"


def load_settings(**overrides: object) -> Settings:
    """Return settings read from NIGHTSCORE_* variables, with explicit overrides on top."""
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


# Library switches: offline model libraries, no telemetry, a startup timeout a slow 2-core machine can meet.
def _library_defaults(settings: Settings) -> dict[str, str]:
    return {
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": str(settings.prefect_startup_timeout_s),
        "PREFECT_UI_ENABLED": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "true",
        "GX_ANALYTICS_ENABLED": "False",
    }


def apply_runtime_defaults(settings: Settings) -> None:
    """Set Prefect's, Hugging Face's and Great Expectations' process switches, never overriding the user's.

    Prefect runs in its local ephemeral mode unless PREFECT_API_URL is set; model libraries are told they
    are offline (the encoder's files ship inside a package; nothing may be downloaded).
    """
    for name, value in _library_defaults(settings).items():
        os.environ.setdefault(name, value)


# Variables a worker process needs besides NIGHTSCORE_*: where the Prefect API is, offline model libraries,
# an S3 endpoint/region. Credentials stay in each node's own environment.
PASSTHROUGH = (
    "PREFECT_API_URL",
    "PREFECT_API_AUTH_STRING",
    "PREFECT_SERVER_ANALYTICS_ENABLED",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "TOKENIZERS_PARALLELISM",
    "GX_ANALYTICS_ENABLED",
    "AWS_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
)


def settings_environment(settings: Settings) -> dict[str, str]:
    """Return NIGHTSCORE_* variables that reproduce settings in another process (home made absolute)."""
    values = settings.model_dump(mode="json", exclude_defaults=True)
    values["home"] = str(Path(settings.home).resolve())
    return {f"NIGHTSCORE_{name.upper()}": v if isinstance(v, str) else json.dumps(v) for name, v in values.items()}


def worker_environment(settings: Settings, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the small environment of a remote worker (Ray): settings, library switches and PASSTHROUGH variables."""
    env = {**_library_defaults(settings), **{k: v for k, v in os.environ.items() if k in PASSTHROUGH}}
    return {**env, **settings_environment(settings), **(extra or {})}


def child_environment(settings: Settings, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the environment of a local child process (server, worker): this one's, plus settings and extra."""
    return {**_library_defaults(settings), **os.environ, **settings_environment(settings), **(extra or {})}
