"""Stage-one retrieval benchmark: nightscore's chunked exact top-K next to plain torch.mm and FAISS.

One run, same random unit vectors (float32, seed 0), same threads. Rows:
  nightscore  models.recommender.retrieval.top_k_items (chunked matmul, seen items masked, exact tie order)
  torch.mm    the same chunks, matmul only into a reused buffer: the rate ceiling, no top-K at all
  faiss       IndexFlatIP exact search with k + max_seen, seen items removed afterwards (the peer)
Prints users/s, achieved GFLOP/s (2*U*I*D / s), the share of the torch.mm rate, the process's peak RSS
after each row (getrusage; peaks only grow, so rows run in this order), whether nightscore's candidates
equal FAISS's on a sample of users, and the ratios. Usage:

    python benchmarks/retrieval.py [--users 100000] [--items 50000] [--dim 384] [--k 100] [--chunk 2048]
                                   [--max-seen 8] [--threads N] [--check 1000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.recommender.retrieval import Interactions, top_k_items

log = logging.getLogger("bench")
SCORE_TOLERANCE = 1e-5  # fp32 dot products of unit vectors from different BLAS kernels differ by ~1e-7


@dataclass
class Row:
    """One method's timed pass and the process's peak RSS right after it."""

    method: str
    seconds: float
    peak_rss_mib: float
    note: str = ""


def peak_rss_mib() -> float:
    """Return this process's peak resident set size so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mib() -> float:
    """Return this process's resident set size now, in MiB (Linux /proc; the peak so far elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return peak_rss_mib()
    return pages * resource.getpagesize() / 2**20


def unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """Return n random float32 unit vectors of dim."""
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def random_seen(rng: np.random.Generator, n_users: int, n_items: int, max_seen: int) -> Interactions:
    """Return 0..max_seen distinct seen items per user, sorted by user (uint32 rows, as polars gives them)."""
    counts = rng.integers(0, max_seen + 1, n_users)
    users = np.repeat(np.arange(n_users, dtype=np.int64), counts)
    keys = np.unique(users * n_items + rng.integers(0, n_items, users.size))  # drops the rare repeat
    users, items = keys // n_items, keys % n_items
    return Interactions(users.astype(np.uint32), items.astype(np.uint32), np.ones(users.size, np.float32), n_users)


def run_nightscore(
    users: torch.Tensor, items: torch.Tensor, seen: Interactions, k: int, chunk: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """Return (item rows, scores, seconds) of nightscore's top_k_items."""
    started = time.perf_counter()
    rows, scores = top_k_items(users, items, seen, k, chunk)
    return rows, scores, time.perf_counter() - started


def run_matmul(users: torch.Tensor, items: torch.Tensor, chunk: int) -> float:
    """Return the seconds of the same chunked products, matmul only, into one reused output buffer."""
    out = torch.empty((chunk, items.shape[0]), dtype=torch.float32)
    items_t = items.T
    started = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, users.shape[0], chunk):
            block = users[start : start + chunk]
            torch.mm(block, items_t, out=out[: block.shape[0]])
    return time.perf_counter() - started


def run_faiss(users: np.ndarray, items: np.ndarray, k: int, threads: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Return (item rows, scores, seconds) of a FAISS IndexFlatIP exact search (index build included)."""
    import faiss

    faiss.omp_set_num_threads(threads)
    started = time.perf_counter()
    index = faiss.IndexFlatIP(items.shape[1])
    index.add(items)
    scores, rows = index.search(users, k)
    return rows, scores, time.perf_counter() - started


def faiss_unseen(
    rows: np.ndarray, scores: np.ndarray, seen: Interactions, sample: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Return FAISS's first k results per sampled user after removing that user's seen items."""
    seen_keys = set(zip(seen.user_rows.astype(np.int64).tolist(), seen.item_rows.astype(np.int64).tolist(), strict=False))
    out_rows = np.full((sample.size, k), -1, dtype=np.int64)
    out_scores = np.full((sample.size, k), -np.inf, dtype=np.float32)
    for n, user in enumerate(sample.tolist()):
        keep = [j for j, item in enumerate(rows[user].tolist()) if (user, item) not in seen_keys][:k]
        out_rows[n, : len(keep)], out_scores[n, : len(keep)] = rows[user, keep], scores[user, keep]
    return out_rows, out_scores


def compare(ours: tuple[np.ndarray, np.ndarray], peer: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
    """Return how many sampled users' lists are identical, differ only by float-rounding swaps, or really differ."""
    (rows, scores), (peer_rows, peer_scores) = ours, peer
    same = (rows == peer_rows).all(axis=1)
    # A swap between near-equal scores (or at the k-th boundary) leaves the score at every rank equal.
    close = np.abs(scores.astype(np.float64) - peer_scores).max(axis=1) <= SCORE_TOLERANCE
    return {
        "users": int(rows.shape[0]),
        "identical": int(same.sum()),
        "rounding_swaps": int((~same & close).sum()),
        "mismatched": int((~same & ~close).sum()),
        "max_score_diff": float(np.abs(scores - peer_scores).max()),
    }


def print_table(rows: list[Row], n_users: int, flops: float) -> None:
    """Print the side-by-side table: seconds, users/s, GFLOP/s, share of the torch.mm rate, peak RSS."""
    ceiling = next((r.seconds for r in rows if r.method == "torch.mm"), None)
    print(f"\n{'method':<12} {'seconds':>9} {'users/s':>10} {'GFLOP/s':>9} {'of mm':>7} {'peak RSS MiB':>13}  note")
    for r in rows:
        share = f"{ceiling / r.seconds:7.0%}" if ceiling else f"{'-':>7}"
        print(
            f"{r.method:<12} {r.seconds:9.2f} {n_users / r.seconds:10.0f} {flops / r.seconds / 1e9:9.1f} "
            f"{share} {r.peak_rss_mib:13.0f}  {r.note}"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, default=100_000)
    p.add_argument("--items", type=int, default=50_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--chunk", type=int, default=2048, help="users per matrix product (nightscore's user_chunk)")
    p.add_argument("--max-seen", type=int, default=8, help="seen items per user are drawn from 0..max-seen")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--check", type=int, default=1000, help="users sampled to compare with FAISS")
    p.add_argument("--skip-faiss", action="store_true")
    p.add_argument("--json", help="write the results here as JSON")
    return p.parse_args(argv)


def setup(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, Interactions]:
    """Return (user vectors, item vectors, seen items) for the run (seed 0)."""
    rng = np.random.default_rng(0)
    items = unit_vectors(rng, args.items, args.dim)
    users = unit_vectors(rng, args.users, args.dim)
    return users, items, random_seen(rng, args.users, args.items, args.max_seen)


def warm_up(users: torch.Tensor, items: torch.Tensor, seen: Interactions, k: int) -> None:
    """Run one small chunk through top_k_items so one-off start-up costs stay out of the timings."""
    n = min(64, users.shape[0])
    few = Interactions(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), n)
    top_k_items(users[:n], items, few, k, n)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every method once, print the table and the checks, and return the results."""
    torch.set_num_threads(args.threads)
    users_np, items_np, seen = setup(args)
    users, items = torch.from_numpy(users_np), torch.from_numpy(items_np)
    max_seen = int(np.bincount(seen.user_rows.astype(np.int64), minlength=args.users).max())
    warm_up(users, items, seen, args.k)
    baseline = current_rss_mib()
    rows, scores, seconds = run_nightscore(users, items, seen, args.k, args.chunk)
    results = [Row("nightscore", seconds, peak_rss_mib(), f"top_k_items, chunk {args.chunk}")]
    results.append(Row("torch.mm", run_matmul(users, items, args.chunk), peak_rss_mib(), "same chunks, matmul only"))
    check: dict[str, float] = {}
    if not args.skip_faiss:
        peer_rows, peer_scores, seconds = run_faiss(users_np, items_np, args.k + max_seen, args.threads)
        results.append(Row("faiss", seconds, peak_rss_mib(), f"IndexFlatIP, k={args.k + max_seen}, then seen removed"))
        sample = np.random.default_rng(1).choice(args.users, min(args.check, args.users), replace=False)
        peer = faiss_unseen(peer_rows, peer_scores, seen, sample, args.k)
        check = compare((rows[sample], scores[sample]), peer)
    flops = 2.0 * args.users * args.items * args.dim
    report(args, results, check, baseline, flops)
    return {"args": vars(args), "rows": [asdict(r) for r in results], "check": check, "baseline_rss_mib": baseline}


def report(args: argparse.Namespace, results: list[Row], check: dict[str, float], baseline: float, flops: float) -> None:
    """Print the table, the memory bound, the FAISS check and the ratios."""
    print(
        f"\n{args.users} users x {args.items} items x dim {args.dim}, K={args.k}, threads {args.threads}, "
        f"torch {torch.__version__}"
    )
    print_table(results, args.users, flops)
    chunk_mib = min(args.chunk, args.users) * args.items * 4 / 2**20
    out_mib = args.users * args.k * (8 + 4) / 2**20
    grown = results[0].peak_rss_mib - baseline
    print(
        f"\nmemory: RSS before nightscore {baseline:.0f} MiB (vectors + seen items); its peak was "
        f"{grown:.0f} MiB above that, against one chunk's scores {chunk_mib:.0f} MiB (chunk x items x 4 B) "
        f"+ the top-K outputs {out_mib:.0f} MiB (users x K x 12 B): the working set follows the chunk, "
        f"not the number of users"
    )
    if check:
        print(
            f"check vs FAISS on {check['users']} sampled users: identical {check['identical']}, "
            f"float-rounding swaps {check['rounding_swaps']}, mismatched {check['mismatched']} "
            f"(max |score diff| {check['max_score_diff']:.2e})"
        )
    by = {r.method: r.seconds for r in results}
    print(
        f"ratios: nightscore / torch.mm time {by['nightscore'] / by['torch.mm']:.2f}x"
        + (f", faiss / nightscore time {by['faiss'] / by['nightscore']:.2f}x" if "faiss" in by else "")
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 1 when nightscore's candidates really differ from FAISS's."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    args = parse_args(argv)
    result = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 1 if result["check"] and result["check"]["mismatched"] else 0


if __name__ == "__main__":
    sys.exit(main())
