"""The warehouse tables and views analysts query: the names and columns are the contract.

Columns are declared once with a portable type name (``text``, ``vector``, ...); ``ddl`` renders them
for one SQL dialect. Every difference between DuckDB and PostgreSQL DDL lives in this module.
"""

from __future__ import annotations

import hashlib
from typing import Literal

Dialect = Literal["duckdb", "postgres"]

SQL_TYPES: dict[str, dict[str, str]] = {
    "duckdb": {
        "text": "VARCHAR",
        "date": "DATE",
        "timestamp": "TIMESTAMPTZ",
        "int": "INTEGER",
        "bigint": "BIGINT",
        "boolean": "BOOLEAN",
        "double": "DOUBLE",
        "vector": "FLOAT[{dim}]",
    },
    "postgres": {
        "text": "VARCHAR",
        "date": "DATE",
        "timestamp": "TIMESTAMPTZ",
        "int": "INTEGER",
        "bigint": "BIGINT",
        "boolean": "BOOLEAN",
        "double": "DOUBLE PRECISION",
        "vector": "REAL[] CHECK (cardinality({name}) = {dim})",
    },
}

RUN_COLUMNS: dict[str, str] = {
    "run_id": "text PRIMARY KEY",
    "flow_run_id": "text",
    "flow_name": "text",
    "run_date": "date",
    "status": "text",
    "started_at": "timestamp",
    "finished_at": "timestamp",
    "published_at": "timestamp",
    "rows_in": "bigint",
    "rows_quarantined": "bigint",
    "rows_scored": "bigint",
    "rows_reused": "bigint",
    "rows_computed": "bigint",
    "shards_reused": "bigint",
    "interactions_in": "bigint",
    "interactions_quarantined": "bigint",
    "users_with_candidates": "bigint",
    "recall_at_k": "double",
    "ndcg_at_10": "double",
    "popularity_recall_at_k": "double",
    "popularity_ndcg_at_10": "double",
    "real_tokens": "bigint",
    "padded_tokens": "bigint",
    "padding_efficiency": "double",
    "truncated_texts": "bigint",
    "texts_per_s": "double",
    "wall_seconds": "double",
    "device": "text",
    "model_version": "text",
    "contract_versions": "text",
    "stage_seconds": "text",
    "data_docs": "text",
    "message": "text",
    # the inference mode (issue 16): chosen by calibration or pinned, its fidelity to torch fp32 and its speed
    "backend": "text",
    "precision": "text",
    "token_budget": "int",
    "engine_runtime": "text",
    "fidelity_min": "double",
    "fidelity_p1": "double",
    "calibration_device_kind": "text",
    "calibrated_tokens_per_s": "double",
    "calibration_from_cache": "boolean",
    "engine_choice": "text",  # how the mode was chosen: pinned, calibrated, persisted, default (auto, not calibrated)
    # the candidates (issue 15): fused recall@K on held-out interactions is recall_at_k, the served ranking's NDCG@10 is
    # ndcg_at_10; every method's figures are in retrieval_metrics
    "cold_recall_at_k": "double",
    "ranker_kind": "text",
    "ranker_version": "text",
    # the candidate gate's outcome and the source published instead of the fused list (issue 33)
    "candidate_gate": "text",
    "candidate_fallback": "text",
    # the cascade (issue 36): the large model uncertain topic decisions were routed to, the budget, how many were
    # routed and why, and on the run's sample what that kept of the all-large topics at what share of its cost
    "cascade_model_version": "text",
    "cascade_budget": "text",
    "routed_items": "bigint",
    "routed_truncated": "bigint",
    "routed_margin": "bigint",
    "cascade_threshold": "double",
    "cascade_agreement": "double",
    "cascade_cost_ratio": "double",
    "cascade_seconds": "double",
}

# Candidate sources whose rank and score each user_candidates row carries (null: the source did not list the item).
CANDIDATE_LISTS = ("cooccurrence", "als", "content", "content_new", "trending", "topic_trending")

TABLES: dict[str, dict[str, str]] = {
    "scoring_runs": RUN_COLUMNS,
    "item_scores": {
        "run_id": "text NOT NULL",
        "run_date": "date NOT NULL",
        "item_id": "text NOT NULL",
        "model_version": "text NOT NULL",
        "topic": "text NOT NULL",
        "topic_score": "double NOT NULL",
        "scored_by": "text",  # nullable in the DDL only: warehouses made before the cascade get it by ALTER TABLE
        "token_count": "int NOT NULL",
        "content_hash": "text NOT NULL",
        "embedding": "vector NOT NULL",
    },
    "user_candidates": {
        "run_id": "text NOT NULL",
        "run_date": "date NOT NULL",
        "user_id": "text NOT NULL",
        "rank": "int NOT NULL",
        "item_id": "text NOT NULL",
        "score": "double NOT NULL",
        "rrf_score": "double",
        "sources": "text",
        **{f"rank_{name}": "int" for name in CANDIDATE_LISTS},
        **{f"score_{name}": "double" for name in CANDIDATE_LISTS},
    },
    "retrieval_metrics": {
        "run_id": "text NOT NULL",
        "method": "text NOT NULL",
        "metric": "text NOT NULL",
        "value": "double",
    },
    "quarantine": {
        "run_id": "text NOT NULL",
        "dataset": "text NOT NULL",
        "row_key": "text",
        "reason": "text NOT NULL",
        "rule": "text",
        "value": "text",
    },
}

# Tables nightscore keeps for itself (not part of the analysts' contract, and not required of a warehouse made
# before them: a writer creates them when missing).
INTERNAL_TABLES: dict[str, dict[str, str]] = {
    # One row per run_date with a live run: who holds it and until when (heartbeats push expires_at).
    "run_leases": {
        "lease_key": "text PRIMARY KEY",
        "run_id": "text",
        "holder": "text NOT NULL",
        "acquired_at": "timestamp",
        "renewed_at": "timestamp",
        "expires_at": "timestamp",
    },
}

# The one definition of "latest": the newest run_date that published, ties broken by the later publication.
# Views, rollback_latest, retract and latest_published order published runs this way, so publishing an older
# run_date (a backfill) never moves latest_* or the cache pointer backwards.
NEWEST_FIRST = "run_date DESC, published_at DESC, run_id DESC"

VIEWS: dict[str, str] = {
    "latest_run": f"SELECT * FROM scoring_runs WHERE status = 'published' ORDER BY {NEWEST_FIRST} LIMIT 1",
    "latest_item_scores": "SELECT * FROM item_scores WHERE run_id = (SELECT run_id FROM latest_run)",
    "latest_user_candidates": "SELECT * FROM user_candidates WHERE run_id = (SELECT run_id FROM latest_run)",
}

# PostgreSQL only: indexes for the views' run_id lookups and run_date replacement (DuckDB's zone maps
# do that job), and round(double precision, integer), which DuckDB has and PostgreSQL lacks, so the
# same analyst SQL runs on both.
POSTGRES_EXTRAS: dict[str, str] = {
    "item_scores_run_id": "CREATE INDEX IF NOT EXISTS item_scores_run_id ON item_scores (run_id)",
    "item_scores_run_date": "CREATE INDEX IF NOT EXISTS item_scores_run_date ON item_scores (run_date)",
    "user_candidates_run_id": "CREATE INDEX IF NOT EXISTS user_candidates_run_id ON user_candidates (run_id)",
    "user_candidates_run_date": "CREATE INDEX IF NOT EXISTS user_candidates_run_date ON user_candidates (run_date)",
    "quarantine_run_id": "CREATE INDEX IF NOT EXISTS quarantine_run_id ON quarantine (run_id)",
    "round": (
        "CREATE OR REPLACE FUNCTION round(double precision, integer) RETURNS double precision "
        "LANGUAGE sql IMMUTABLE STRICT AS 'SELECT round($1::numeric, $2)::double precision'"
    ),
}

ITEM_SCORE_COLUMNS = list(TABLES["item_scores"])
CANDIDATE_COLUMNS = list(TABLES["user_candidates"])
QUARANTINE_COLUMNS = list(TABLES["quarantine"])
METRIC_COLUMNS = list(TABLES["retrieval_metrics"])


def kind(table: str, column: str) -> str:
    """Return the portable type name of a column (``text``, ``date``, ``vector``, ...)."""
    return TABLES[table][column].split()[0]


def column_sql(name: str, spec: str, dialect: Dialect, embedding_dim: int) -> str:
    """Return one column's declaration (type and constraints) in a dialect."""
    portable, _, constraints = spec.partition(" ")
    sql_type = SQL_TYPES[dialect][portable].format(name=name, dim=embedding_dim)
    return f"{sql_type} {constraints}".strip()


def _create_table(table: str, columns: dict[str, str], dialect: Dialect, embedding_dim: int) -> str:
    body = ",\n  ".join(f"{name} {column_sql(name, spec, dialect, embedding_dim)}" for name, spec in columns.items())
    return f"CREATE TABLE IF NOT EXISTS {table} (\n  {body}\n)"


def ddl(embedding_dim: int, dialect: Dialect = "duckdb") -> list[str]:
    """Return the CREATE statements of every table, view (and PostgreSQL index), all idempotent."""
    statements = [_create_table(table, columns, dialect, embedding_dim) for table, columns in TABLES.items()]
    statements += upgrade_ddl(dialect)
    if dialect == "postgres":
        statements += list(POSTGRES_EXTRAS.values())
    return statements


def upgrade_ddl(dialect: Dialect) -> list[str]:
    """Return the idempotent statements a writer runs on an existing warehouse: internal tables, current view definitions."""
    statements = [_create_table(table, columns, dialect, 0) for table, columns in INTERNAL_TABLES.items()]
    statements += added_columns(dialect)
    return statements + [f"CREATE OR REPLACE VIEW {name} AS {sql}" for name, sql in VIEWS.items()]


def ddl_version(dialect: Dialect) -> str:
    """Return the version of the DDL a writer keeps a warehouse at (a hash of upgrade_ddl's statements)."""
    return hashlib.sha256("\n".join(upgrade_ddl(dialect)).encode()).hexdigest()[:16]


def added_columns(dialect: Dialect) -> list[str]:
    """Return ALTER TABLE ... ADD COLUMN IF NOT EXISTS for every column a warehouse made by an older release may lack."""
    return [
        f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} {column_sql(name, spec, dialect, 0)}"
        for table, columns in TABLES.items()
        for name, spec in columns.items()
        if "PRIMARY KEY" not in spec and "NOT NULL" not in spec
    ]


def object_names(dialect: Dialect) -> list[str]:
    """Return the tables, views and indexes ``ddl`` creates (to tell whether it must run)."""
    extras = [name for name in POSTGRES_EXTRAS if name != "round"] if dialect == "postgres" else []
    return [*TABLES, *VIEWS, *extras]
