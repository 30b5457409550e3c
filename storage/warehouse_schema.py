"""The warehouse tables and views analysts query: the names and columns are the contract."""

from __future__ import annotations

RUN_COLUMNS: dict[str, str] = {
    "run_id": "VARCHAR PRIMARY KEY",
    "flow_run_id": "VARCHAR",
    "flow_name": "VARCHAR",
    "run_date": "DATE",
    "status": "VARCHAR",
    "started_at": "TIMESTAMPTZ",
    "finished_at": "TIMESTAMPTZ",
    "published_at": "TIMESTAMPTZ",
    "rows_in": "BIGINT",
    "rows_quarantined": "BIGINT",
    "rows_scored": "BIGINT",
    "interactions_in": "BIGINT",
    "interactions_quarantined": "BIGINT",
    "users_with_candidates": "BIGINT",
    "real_tokens": "BIGINT",
    "padded_tokens": "BIGINT",
    "padding_efficiency": "DOUBLE",
    "truncated_texts": "BIGINT",
    "texts_per_s": "DOUBLE",
    "wall_seconds": "DOUBLE",
    "device": "VARCHAR",
    "model_version": "VARCHAR",
    "contract_versions": "VARCHAR",
    "stage_seconds": "VARCHAR",
    "message": "VARCHAR",
}


def ddl(embedding_dim: int) -> list[str]:
    """Return the CREATE statements of every table and view (idempotent)."""
    runs = ",\n  ".join(f"{name} {kind}" for name, kind in RUN_COLUMNS.items())
    return [
        f"CREATE TABLE IF NOT EXISTS scoring_runs (\n  {runs}\n)",
        f"""CREATE TABLE IF NOT EXISTS item_scores (
  run_id VARCHAR NOT NULL, run_date DATE NOT NULL, item_id VARCHAR NOT NULL, model_version VARCHAR NOT NULL,
  topic VARCHAR NOT NULL, topic_score DOUBLE NOT NULL, token_count INTEGER NOT NULL, content_hash VARCHAR NOT NULL,
  embedding FLOAT[{embedding_dim}] NOT NULL
)""",
        """CREATE TABLE IF NOT EXISTS user_candidates (
  run_id VARCHAR NOT NULL, run_date DATE NOT NULL, user_id VARCHAR NOT NULL, rank INTEGER NOT NULL,
  item_id VARCHAR NOT NULL, score DOUBLE NOT NULL
)""",
        """CREATE TABLE IF NOT EXISTS quarantine (
  run_id VARCHAR NOT NULL, dataset VARCHAR NOT NULL, row_key VARCHAR, reason VARCHAR NOT NULL,
  rule VARCHAR, value VARCHAR
)""",
        """CREATE OR REPLACE VIEW latest_run AS
  SELECT * FROM scoring_runs WHERE status = 'published' ORDER BY published_at DESC LIMIT 1""",
        "CREATE OR REPLACE VIEW latest_item_scores AS SELECT * FROM item_scores WHERE run_id = (SELECT run_id FROM latest_run)",
        "CREATE OR REPLACE VIEW latest_user_candidates AS SELECT * FROM user_candidates WHERE run_id = (SELECT run_id FROM latest_run)",
    ]


ITEM_SCORE_COLUMNS = ["run_id", "run_date", "item_id", "model_version", "topic", "topic_score", "token_count", "content_hash", "embedding"]
CANDIDATE_COLUMNS = ["run_id", "run_date", "user_id", "rank", "item_id", "score"]
QUARANTINE_COLUMNS = ["run_id", "dataset", "row_key", "reason", "rule", "value"]
