"""Benchmark inputs: hashed TF-IDF text embeddings streamed from a file, and a second, differently built catalogue.

text_embeddings: unit TF-IDF vectors of title + body over hashed tokens (polars' hash), built in chunks
and written to a float32 file that ItemChunks reads block by block (no encoder needed; the vectors come
from the text only, so they cannot leak the generator's hidden structure).

latent_catalogue: a catalogue with none of the demo generator's sessions, series or bundles. Items and
users have latent taste vectors; item appeal is log-normal; items arrive uniformly over the whole period;
each user draws their items without replacement by Gumbel-top-n over taste . item + appeal, at times
after each item's creation. An item's topic is the largest of its first 8 latent coordinates, so the
text (from the topic) says something about taste, as a real catalogue's descriptions do.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl

from models.recommender.retrieval import ItemChunks
from nightscore.demo import DEMO_BASE_TIME, EVENT_PROBS, EVENTS, bodies, epoch_us, titles, topics

TOKEN = r"[a-z0-9]+"


def _hashed_counts(items: pl.DataFrame, dim: int) -> pl.DataFrame:
    """Return (row, bucket, count) of one chunk's hashed tokens."""
    text = (pl.col("title").fill_null("") + " " + pl.col("body").fill_null("")).str.to_lowercase()
    tokens = items.select(text.str.extract_all(TOKEN).alias("token")).with_row_index("row").explode("token")
    buckets = tokens.drop_nulls("token").select("row", (pl.col("token").hash(seed=0) % dim).cast(pl.Int32).alias("bucket"))
    return buckets.group_by("row", "bucket").len("count").sort("row", "bucket")


def text_embeddings(items: pl.DataFrame, dim: int, folder: Path, chunk: int = 65_536, block: int = 16_384) -> ItemChunks:
    """Return the items' TF-IDF vectors as ItemChunks over a file in folder (two passes over the texts)."""
    parts = [
        _hashed_counts(items.slice(start, chunk), dim).with_columns(pl.col("row") + start)
        for start in range(0, items.height, chunk)
    ]
    counts = pl.concat(parts)
    df = np.bincount(counts["bucket"].to_numpy(), minlength=dim)
    idf = (np.log((1.0 + items.height) / (1.0 + df)) + 1.0).astype(np.float32)
    path = folder / "embeddings.f32"
    rows, buckets, values = (counts[c].to_numpy() for c in ("row", "bucket", "count"))
    bounds = np.searchsorted(rows, np.arange(0, items.height + block, block))
    with path.open("wb") as out:
        for n, start in enumerate(range(0, items.height, block)):
            size = min(block, items.height - start)
            dense = np.zeros((size, dim), dtype=np.float32)
            lo, hi = bounds[n], bounds[n + 1]
            dense[rows[lo:hi] - start, buckets[lo:hi]] = np.log1p(values[lo:hi]) * idf[buckets[lo:hi]]
            dense /= np.maximum(np.linalg.norm(dense, axis=1, keepdims=True), 1e-12)
            dense.tofile(out)
    return file_chunks(path, items.height, dim, block)


def file_chunks(path: Path, n_items: int, dim: int, block: int) -> ItemChunks:
    """Return ItemChunks reading a float32 (n_items, dim) file block by block (read, not mapped)."""

    def read() -> Iterator[np.ndarray]:
        with path.open("rb") as handle:
            for start in range(0, n_items, block):
                rows = min(block, n_items - start)
                yield np.fromfile(handle, dtype=np.float32, count=rows * dim).reshape(rows, dim)

    return ItemChunks(n_items, read)


def scratch() -> tempfile.TemporaryDirectory[str]:
    """Return a temporary folder for embedding files."""
    return tempfile.TemporaryDirectory(prefix="nightscore-candidates-")


def latent_catalogue(
    n_items: int, n_users: int, seed: int = 0, factors: int = 16, span_days: int = 120, median: float = 20.0
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Return (items, interactions) of the latent-taste catalogue (see the module docstring)."""
    rng = np.random.default_rng([seed, 99])
    item_vec = rng.standard_normal((n_items, factors)).astype(np.float32)
    appeal = rng.normal(0.0, 1.0, n_items).astype(np.float32)
    topic_idx = np.argmax(item_vec[:, : len(topics())], axis=1)
    created = epoch_us(DEMO_BASE_TIME) - rng.integers(0, span_days * 86_400, n_items) * 1_000_000
    created[rng.random(n_items) < 0.5] -= 365 * 86_400 * 1_000_000  # half the catalogue predates the log
    items = pl.DataFrame(
        {
            "item_id": [f"item-{i:06d}" for i in range(1, n_items + 1)],
            "title": titles(rng, topic_idx),
            "body": bodies(rng, topic_idx),
            "created_at": pl.Series(created).cast(pl.Datetime("us", "UTC")),
            "topic": np.array(topics())[topic_idx].tolist(),
        }
    )
    return items, _latent_interactions(rng, item_vec, appeal, created, n_users, median)


def _latent_interactions(
    rng: np.random.Generator, item_vec: np.ndarray, appeal: np.ndarray, created: np.ndarray, n_users: int, median: float
) -> pl.DataFrame:
    """Return interactions drawn by Gumbel-top-n of taste . item + appeal, each after its item's creation."""
    user_vec = rng.standard_normal((n_users, item_vec.shape[1])).astype(np.float32) * 0.6
    counts = np.clip(np.rint(rng.lognormal(np.log(median), 0.9, n_users)), 1, 500).astype(np.int64)
    start = epoch_us(DEMO_BASE_TIME) - 120 * 86_400 * 1_000_000
    users, picks, times = [], [], []
    for lo in range(0, n_users, 512):
        hi = min(lo + 512, n_users)
        utility = user_vec[lo:hi] @ item_vec.T + appeal + rng.gumbel(size=(hi - lo, len(appeal))).astype(np.float32)
        order = np.argsort(-utility, axis=1)
        for u in range(hi - lo):
            chosen = order[u, : counts[lo + u]]
            first = np.maximum(created[chosen], start)
            ts = first + (rng.random(len(chosen)) * (epoch_us(DEMO_BASE_TIME) - first)).astype(np.int64)
            users.append(np.full(len(chosen), lo + u))
            picks.append(chosen)
            times.append(ts // 1_000_000 * 1_000_000)
    user, item, ts = np.concatenate(users), np.concatenate(picks), np.concatenate(times)
    events = rng.choice(len(EVENTS), size=len(user), p=EVENT_PROBS)
    return pl.DataFrame(
        {
            "user_id": [f"user-{u + 1:05d}" for u in user],
            "item_id": [f"item-{i + 1:06d}" for i in item],
            "event": np.array(EVENTS)[events].tolist(),
            "ts": pl.Series(ts).cast(pl.Datetime("us", "UTC")),
        }
    ).sort("user_id", "ts")
