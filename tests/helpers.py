"""Small helpers shared by the test tiers: numbers and demo input folders."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zlib
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from core.records import Published


# The candidate gate off, for the child-process runs that measure something else. The in-process flow tier runs
# the default gate, which leaves a log with too few held-out users ungated ("not enough data to gate"); the gate
# has its own tests in tests/flow/test_candidates_flow.py.
UNGATED = {"NIGHTSCORE_CANDIDATE_GATE_RECALL_MARGIN": "-1"}


REPO = Path(__file__).resolve().parents[1]


def fresh_interpreter_output(script: str, timeout: float = 120, env: dict[str, str] | None = None) -> str:
    """Return what a new Python process at the repository root prints running script (its imports are its own;
    env: its whole environment, else this process's)."""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def small_run_environment() -> dict[str, str]:
    """Return the NIGHTSCORE_ variables of the flow tier's CLI runs: the tiny encoder, ungated, shards of 40, K=20."""
    from tests.tiny_model import tiny_environment

    return {**tiny_environment(), **UNGATED, "NIGHTSCORE_SHARD_SIZE": "40", "NIGHTSCORE_TOP_K": "20"}


# `auto` narrowed for the tests that need MiniLM calibrated (tests/conftest.py measures each once per session): one
# backend at one token budget runs the same calibration code in seconds, where all backends x 3 budgets took 3-7
# minutes of one worker on a 2-core host. CLI runs given calibration_environment(CLI_CALIBRATION) read its choice.
CLI_CALIBRATION: dict[str, object] = {"backend": "torch", "calibration_budgets": [1024]}
OPENVINO_CALIBRATION: dict[str, object] = {"backend": "openvino", "calibration_budgets": [1024]}


def calibration_environment(fields: dict[str, object]) -> dict[str, str]:
    """Return the NIGHTSCORE_ variables that give a CLI run these encoder settings."""
    return {f"NIGHTSCORE_{name.upper()}": v if isinstance(v, str) else json.dumps(v) for name, v in fields.items()}


def nightly_command(cli: str | Path, inputs: Path, run_date: str, home: Path, items: Path | None = None) -> list[str]:
    """Return the `nightscore run nightly` command line over a demo-inputs folder (items: another items file)."""
    return [str(cli), *nightly_args(inputs, run_date, home, items)]


def nightly_args(inputs: Path, run_date: str, home: Path, items: Path | None = None) -> list[str]:
    """Return the arguments of `nightscore run nightly` over a demo-inputs folder (what tests.in_process runs)."""
    items_uri, interactions = str(items or inputs / "items.parquet"), str(inputs / "interactions.parquet")
    return ["run", "nightly", "--items", items_uri, "--interactions", interactions, "--run-date", run_date, "--home", str(home)]


def command_logs(home: Path) -> str:
    """Return every command's log file under home/logs (INFO and up; the console shows warnings only)."""
    return "".join(path.read_text() for path in sorted((home / "logs").glob("*.log")))


def restore_tree(snapshot: Path, home: Path) -> Path:
    """Return home after replacing it with a copy of snapshot (the same folder: a run's records name it)."""
    shutil.rmtree(home, ignore_errors=True)
    shutil.copytree(snapshot, home)
    return home


def cos_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return the row-wise cosine of two matrices, computed in float64."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def demo_inputs(folder: Path, items: int = 300, users: int = 60, seed: int = 0) -> Path:
    """Write deterministic demo inputs (items.parquet, interactions.parquet) into folder and return it."""
    from nightscore.demo import generate_demo_data

    folder.mkdir(parents=True, exist_ok=True)
    item_frame, interactions = generate_demo_data(items, users, seed=seed)
    item_frame.write_parquet(folder / "items.parquet")
    interactions.write_parquet(folder / "interactions.parquet")
    return folder


def published(**record: object) -> Published:
    """Return a Published run with a plausible scoring_runs record; keyword arguments override its columns."""
    import json
    from datetime import datetime

    from core.records import Published, RunRecord

    stage_seconds = cast("dict[str, float]", record.pop("stage_seconds", {"encode": 36.0, "publish": 4.0}))
    data_docs = cast("dict[str, str]", record.pop("data_docs", {"items": "/lake/docs/index.html"}))
    at = datetime(2026, 11, 30, 3, tzinfo=UTC)
    values: dict[str, Any] = {
        "run_id": "r1",
        "flow_run_id": None,
        "flow_name": "nightly",
        "run_date": "2026-11-30",
        "status": "published",
        "started_at": at,
        "finished_at": at,
        "rows_in": 2000,
        "rows_quarantined": 0,
        "rows_scored": 2000,
        "rows_reused": 0,
        "rows_computed": 2000,
        "shards_reused": 0,
        "interactions_in": 100,
        "interactions_quarantined": 0,
        "users_with_candidates": 10,
        "recall_at_k": 0.5,
        "ndcg_at_10": 0.2,
        "popularity_recall_at_k": 0.4,
        "popularity_ndcg_at_10": 0.1,
        "real_tokens": 1000,
        "padded_tokens": 1100,
        "padding_efficiency": 1000 / 1100,
        "truncated_texts": 0,
        "texts_per_s": 90.0,
        "wall_seconds": 100.0,
        "device": "cuda:0",
        "model_version": "m",
        "contract_versions": "c",
        "stage_seconds": json.dumps(stage_seconds),
        "data_docs": json.dumps(data_docs),
        **record,
    }
    return Published(RunRecord(**values), dict(data_docs), dict(stage_seconds), shards=4, cache_entries=10)


_TOKEN = re.compile(r"[a-z0-9]+")


def hashed_text_vectors(items: pl.DataFrame, dim: int = 256) -> pl.DataFrame:
    """Return (item_id, embedding): unit TF-IDF vectors of title + body over crc32-hashed tokens.

    A stand-in for the encoder's embeddings in tests and demos; deterministic, no model needed.
    """
    texts = items.select((pl.col("title").fill_null("") + " " + pl.col("body").fill_null("")).str.to_lowercase())
    counts = np.zeros((items.height, dim), dtype=np.float32)
    for row, text in enumerate(texts.to_series().to_list()):
        hashes = [zlib.crc32(token.encode()) % dim for token in _TOKEN.findall(text)]
        np.add.at(counts[row], hashes, 1.0)
    idf = np.log((1.0 + items.height) / (1.0 + (counts > 0).sum(axis=0))) + 1.0
    vectors = np.log1p(counts) * idf
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return pl.DataFrame({"item_id": items.get_column("item_id"), "embedding": list(vectors)})


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Return the ROC AUC (Mann-Whitney, ties counted half); NaN without both classes."""
    labels = np.asarray(labels).astype(bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = pl.Series(np.asarray(scores, dtype=np.float64)).rank("average").to_numpy()
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
