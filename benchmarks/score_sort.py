"""The external sort of score-items: our RangeSpill (Arrow IPC ranges) against DuckDB ``ORDER BY`` under a memory limit.

score-items joins every shard's (item_id, embedding) with the plan and writes item_scores ordered by item_id.
Both methods read the same synthetic shards and plan, score topics per block the same way and write the same
file; each runs in its own process so its peak RSS (ru_maxrss) is its own. Prints one table with the CPU flags.

    python benchmarks/score_sort.py [--items 1000000] [--dim 384] [--root bench-results/score-sort]
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

log = logging.getLogger("bench")
SHARD_ROWS = 16_384
BLOCK = 16_384
DUCKDB_LIMITS = ("512MB", "1GB")  # DuckDB buffer pools tried (the lake writes use 512MB)


def cpu_flags() -> str:
    """Return the CPU model and the flags that matter for these kernels."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    wanted = [f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma")]
    return f"{model}; {' '.join(sorted(wanted))}"


def make_inputs(root: Path, items: int, dim: int) -> tuple[list[str], str]:
    """Write shuffled shards of unit vectors and the plan; return (shard URIs, plan URI)."""
    rng = np.random.default_rng(0)
    ids = np.array([f"item-{i:07d}" for i in rng.permutation(items)])
    shards = []
    for n, start in enumerate(range(0, items, SHARD_ROWS)):
        part = ids[start : start + SHARD_ROWS]
        vectors = rng.normal(size=(len(part), dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        path = root / f"shard-{n:05d}.parquet"
        pl.DataFrame({"item_id": part}).with_columns(
            pl.Series("embedding", vectors).cast(pl.Array(pl.Float32, dim))
        ).write_parquet(path)
        shards.append(str(path))
    plan = pl.DataFrame(
        {"item_id": ids, "content_hash": ["0" * 64] * items, "token_count": rng.integers(4, 256, items).astype(np.int32)}
    )
    plan.write_parquet(root / "plan.parquet")
    return shards, str(root / "plan.parquet")


def labels(dim: int) -> np.ndarray:
    """Return 8 fixed unit label vectors."""
    vectors = np.random.default_rng(1).normal(size=(8, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def scored(frame: pl.DataFrame, label_vectors: np.ndarray) -> pl.DataFrame:
    """Return a block with its topic and topic_score (the stage's per-block work)."""
    from models.topics import topic_scores

    best, prob = topic_scores(frame.get_column("embedding").to_numpy(), label_vectors, 0.05)
    return frame.with_columns(pl.Series("topic", best), pl.Series("topic_score", prob))


def run_spill(shards: list[str], plan: str, out: str, dim: int) -> None:
    """Our RangeSpill path, as tasks/score.py runs it."""
    from storage.lake import Lake
    from tasks.score import RangeSpill, range_bounds

    lake, label_vectors = Lake(str(Path(out).parent)), labels(dim)
    bounds = range_bounds(pl.read_parquet(plan, columns=["item_id"]).get_column("item_id"))
    with RangeSpill(bounds) as spill:
        for uri in shards:
            for frame in lake.iter_frames(uri, "shard", batch_size=BLOCK):
                spill.add("vectors", frame)
        for frame in lake.iter_frames(plan, "plan", batch_size=BLOCK):
            spill.add("plan", frame)
        blocks = (
            scored(
                spill.read("plan", r).join(spill.read("vectors", r), on="item_id", validate="1:1").sort("item_id"), label_vectors
            )
            for r in range(len(bounds))
        )
        lake.write_parquet_frames(blocks, out)


def run_duckdb(shards: list[str], plan: str, out: str, dim: int, memory: str) -> None:
    """DuckDB joins and sorts under a memory limit (spilling to its temp folder); blocks stream out in order."""
    import duckdb

    from storage.lake import Lake

    lake, label_vectors = Lake(str(Path(out).parent)), labels(dim)
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{memory}'")
    con.execute(f"SET temp_directory = '{Path(out).parent / 'duckdb-tmp'}'")
    shard_list = "[" + ", ".join(f"'{s}'" for s in shards) + "]"
    reader = con.execute(
        f"SELECT p.item_id, p.content_hash, p.token_count, v.embedding::FLOAT[{dim}] AS embedding FROM read_parquet('{plan}') p "
        f"JOIN read_parquet({shard_list}) v USING (item_id) ORDER BY p.item_id"
    ).to_arrow_reader(BLOCK)
    blocks = (scored(pl.DataFrame(pl.from_arrow(batch)), label_vectors) for batch in _batches(reader))
    lake.write_parquet_frames(blocks, out)


def _batches(reader: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
    yield from reader


def child(method: str, shards_json: str, plan: str, out: str, *, dim: int) -> None:
    """Run one method and print its seconds and peak RSS as JSON."""
    started = time.perf_counter()
    if method == "spill":
        run_spill(json.loads(shards_json), plan, out, dim)
    else:
        run_duckdb(json.loads(shards_json), plan, out, dim, method.removeprefix("duckdb-"))
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_mib": peak_mib}))


def main() -> None:
    """Build the inputs once, run both methods in their own processes, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--root", type=Path, default=Path("bench-results/score-sort"))
    parser.add_argument("--child", nargs=4)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.child:
        method, shards_json, plan_uri, out_uri = args.child
        child(method, shards_json, plan_uri, out_uri, dim=args.dim)
        return
    args.root.mkdir(parents=True, exist_ok=True)
    shards, plan = make_inputs(args.root, args.items, args.dim)
    results = {}
    methods = ["spill", *(f"duckdb-{limit}" for limit in DUCKDB_LIMITS)]
    for method in methods:
        out = args.root / f"item_scores-{method}.parquet"
        done = subprocess.run(
            [sys.executable, __file__, "--dim", str(args.dim), "--child", method, json.dumps(shards), plan, str(out)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            log.error("%s failed (exit %d): %s", method, done.returncode, done.stderr.strip().splitlines()[-1:])
            results[method] = {"seconds": float("nan"), "peak_mib": float("nan")}
            continue
        results[method] = json.loads(done.stdout.strip().splitlines()[-1])
    reference = pl.read_parquet(args.root / "item_scores-spill.parquet")
    print(f"CPU: {cpu_flags()}\n{args.items:,} items x {args.dim} floats")
    print(f"{'method':<34}{'seconds':>9}{'peak RSS MiB':>14}{'vs spill time':>15}{'vs spill RSS':>14}  same output")
    base = results["spill"]
    for method in methods:
        out = args.root / f"item_scores-{method}.parquet"
        same = out.exists() and pl.read_parquet(out).equals(reference)
        name = "RangeSpill (Arrow IPC ranges)" if method == "spill" else f"DuckDB ORDER BY ({method[7:]} limit)"
        r = results[method]
        print(
            f"{name:<34}{r['seconds']:>9.1f}{r['peak_mib']:>14.0f}{r['seconds'] / base['seconds']:>14.2f}x"
            f"{r['peak_mib'] / base['peak_mib']:>13.2f}x  {same}"
        )


if __name__ == "__main__":
    main()
