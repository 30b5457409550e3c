"""Stages after the model: topic scores per item, user vectors and top-K candidates per user."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import torch

from models.encoder import get_encoder
from models.engine import encode_texts
from models.retrieval import ITEM_BLOCK, Interactions, ItemChunks, candidates_table, interaction_weight_expr, top_k_items, user_vectors
from models.retrieval_quality import evaluate_retrieval, run_weights
from models.topics import topic_scores
from nightscore.run_context import RunContext
from nightscore.settings import Settings
from nightscore.stages.encode import encoder_spec
from storage.lake import Lake

log = logging.getLogger(__name__)


SCORE_BLOCK = 16_384  # item_ids per range of the external sort that orders item_scores (~25 MB of vectors)


def score_items(lake: Lake, run: RunContext, settings: Settings, shard_uris: list[str]) -> dict[str, object]:
    """Join shard embeddings with the plan and add zero-shot topics; produces ``item_scores.parquet``.

    Streams: shards, reused vectors and plan rows are spilled into item_id ranges of SCORE_BLOCK ids
    (local scratch Arrow IPC files), then each range is joined, sorted, scored and appended to the output,
    so one range is in memory at a time and the file is ordered by item_id as a whole-table sort would be.
    """
    started = time.perf_counter()
    encoder = get_encoder(encoder_spec(settings))
    names = list(settings.topic_labels)
    labels, _ = encode_texts(encoder, [settings.topic_labels[n] for n in names])
    plan_uri = run.path("plan.parquet")
    bounds = range_bounds(lake.read_parquet(plan_uri, "plan", columns=["item_id"]).get_column("item_id"))
    counts = {"plan": 0, "scored": 0}
    with RangeSpill(bounds) as spill:
        for uri in [*sorted(shard_uris), run.path("reused.parquet")]:
            for frame in lake.iter_frames(uri, "shard", columns=["item_id", "embedding"], batch_size=SCORE_BLOCK):
                spill.add("vectors", frame)
        for frame in lake.iter_frames(plan_uri, "plan", columns=["item_id", "content_hash", "token_count"], batch_size=SCORE_BLOCK):
            counts["plan"] += frame.height
            spill.add("plan", frame)
        blocks = (_scored_block(spill, r, run, encoder.version, names, labels, settings, counts) for r in range(len(bounds)))
        lake.write_parquet_frames(blocks, run.path("item_scores.parquet"))
    return {"rows_scored": counts["scored"], "missing": counts["plan"] - counts["scored"], "seconds": time.perf_counter() - started}


def range_bounds(item_ids: pl.Series) -> pl.Series:
    """Return the first item_id of each range of SCORE_BLOCK sorted ids (never a 1-row last range)."""
    ordered = item_ids.sort()
    starts = list(range(0, len(ordered), SCORE_BLOCK))
    if len(starts) > 1 and len(ordered) - starts[-1] == 1:
        starts.pop()  # a 1-row matmul takes another BLAS path: keep topic scores bit-identical to one big block
    return ordered.gather(starts) if starts else pl.Series("item_id", [""], dtype=pl.String)


def _scored_block(spill: "RangeSpill", r: int, run: RunContext, version: str, names: list[str], labels: np.ndarray,
                  settings: Settings, counts: dict[str, int]) -> pl.DataFrame:
    """Return range r of item_scores: plan rows joined 1:1 with their vectors, sorted by item_id, topics added."""
    scored = spill.read("plan", r).join(spill.read("vectors", r), on="item_id", how="inner", validate="1:1").sort("item_id")
    best, prob = topic_scores(scored.get_column("embedding").to_numpy(), labels, settings.topic_temperature)
    counts["scored"] += scored.height
    return scored.select(
        pl.lit(run.run_id).alias("run_id"), pl.lit(run.date).alias("run_date"), "item_id",
        pl.lit(version).alias("model_version"),
        pl.Series("topic", np.asarray(names)[best], dtype=pl.String), pl.Series("topic_score", prob),
        "token_count", "content_hash", "embedding",
    )


class RangeSpill:
    """Local scratch Arrow IPC stream files, one per (kind, item_id range), appended batch by batch and read back whole.

    IPC rather than Parquet: a stream writer holds no buffers between writes, while one ParquetWriter per
    open range held ~20 MB each (62 ranges × 2 kinds at 1M items: score_items peaked at 2.0 GB, now 0.9 GB).
    """

    def __init__(self, bounds: pl.Series) -> None:
        self.bounds = bounds
        self._dir = tempfile.TemporaryDirectory(prefix="nightscore-score-")
        self._writers: dict[tuple[str, int], pa.ipc.RecordBatchStreamWriter] = {}
        self._schemas: dict[str, pa.Schema] = {}

    def __enter__(self) -> "RangeSpill":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self._dir.cleanup()

    def add(self, kind: str, frame: pl.DataFrame) -> None:
        """Append a frame's rows to the files of the ranges their item_ids fall in."""
        ranges = (self.bounds.search_sorted(frame.get_column("item_id"), side="right") - 1).clip(0, None)
        for (r,), part in frame.with_columns(ranges.alias("_range")).partition_by("_range", as_dict=True).items():
            table = part.drop("_range").to_arrow()
            schema = self._schemas.setdefault(kind, table.schema)
            key = (kind, int(r))
            if key not in self._writers:
                self._writers[key] = pa.ipc.new_stream(self._path(*key), schema)
            self._writers[key].write_table(table.cast(schema))

    def read(self, kind: str, r: int) -> pl.DataFrame:
        """Return every row spilled into range r of kind (an empty frame when there is none)."""
        writer = self._writers.pop((kind, r), None)
        if writer is None:
            return pl.from_arrow(self._schemas[kind].empty_table()) if kind in self._schemas else pl.DataFrame(
                schema={"item_id": pl.String})
        writer.close()
        with pa.ipc.open_stream(self._path(kind, r)) as reader:
            return pl.from_arrow(reader.read_all())

    def close(self) -> None:
        """Close every writer still open."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def _path(self, kind: str, r: int) -> str:
        return str(Path(self._dir.name) / f"{kind}-{r:06d}.arrows")


def item_chunks(lake: Lake, uri: str, n_items: int) -> ItemChunks:
    """Return item_scores' embeddings as blocks of ITEM_BLOCK rows, read from the lake on each pass."""
    def read():
        for frame in lake.iter_frames(uri, "item_scores", columns=["embedding"], batch_size=ITEM_BLOCK):
            yield frame.get_column("embedding").to_numpy()

    return ItemChunks(n_items, read)


def build_candidates(lake: Lake, run: RunContext, settings: Settings) -> dict[str, object]:
    """Compute user vectors and exact top-K unseen items per user; produces ``user_candidates.parquet``.

    Item embeddings stream in blocks (never all at once); only item ids are held whole.
    """
    started, uri = time.perf_counter(), run.path("item_scores.parquet")
    index = lake.read_parquet(uri, "item_scores", columns=["item_id"]).with_row_index("item_row")
    interactions = lake.read_parquet(run.path("valid/interactions.parquet"), "interactions")
    users = interactions.select("user_id").unique().sort("user_id").with_row_index("user_row")
    joined = (interactions.join(index, on="item_id").join(users, on="user_id")
              .with_columns(interaction_weight_expr(run.reference_time, settings.event_weights, settings.recency_half_life_days)))
    inter = Interactions(joined["user_row"].to_numpy(), joined["item_row"].to_numpy(), joined["weight"].to_numpy(), users.height)
    device = torch.device("cuda" if settings.device != "cpu" and torch.cuda.is_available() else "cpu")
    items = item_chunks(lake, uri, index.height)
    rows, scores = top_k_items(user_vectors(items, inter).to(device), items, inter, settings.top_k, settings.user_chunk)
    frame = candidates_frame(run, users.get_column("user_id"), index.get_column("item_id"), rows, scores)
    lake.write_parquet(frame, run.path("user_candidates.parquet"))
    quality = retrieval_quality(index.get_column("item_id"), items, interactions, settings, run)
    return {"users_with_candidates": frame.get_column("user_id").n_unique(), "candidates": frame.height,
            **quality, "seconds": time.perf_counter() - started}


def retrieval_quality(item_ids: pl.Series, items: ItemChunks, interactions: pl.DataFrame, settings: Settings,
                      run: RunContext) -> dict[str, float]:
    """Return recall@K and NDCG@10 of retrieval on each user's last 2 interactions held out, vs popularity."""
    weights = run_weights(run.reference_time, settings.event_weights, settings.recency_half_life_days)
    q = evaluate_retrieval(item_ids.to_list(), items, interactions, weights,
                           k=settings.top_k, holdout=2, chunk=settings.user_chunk)
    log.info("retrieval on held-out interactions (%d users): recall@%d %.3f vs popularity %.3f; NDCG@10 %.3f vs %.3f",
             q.users_evaluated, q.k, q.recall_at_k, q.popularity_recall_at_k, q.ndcg_at_10, q.popularity_ndcg_at_10)
    return {"recall_at_k": q.recall_at_k, "ndcg_at_10": q.ndcg_at_10, "popularity_recall_at_k": q.popularity_recall_at_k,
            "popularity_ndcg_at_10": q.popularity_ndcg_at_10, "quality_users": q.users_evaluated}


def candidates_frame(run: RunContext, user_ids: pl.Series, item_ids: pl.Series, rows: np.ndarray, scores: np.ndarray) -> pl.DataFrame:
    """Return the long candidates table (run_id, run_date, user_id, rank, item_id, score), rank from 1."""
    table = candidates_table(user_ids.to_numpy(), item_ids.to_numpy(), rows, scores)
    return table.select(pl.lit(run.run_id).alias("run_id"), pl.lit(run.date).alias("run_date"), pl.all())
