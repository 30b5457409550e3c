"""Candidate-stage benchmark: demo-generator data through every source and the fusion, timed, with its recall table.

One run: generate (nightscore.demo, default 1M items x 100k users x ~10M interactions), hashed TF-IDF
text embeddings written to a file and streamed as blocks, then the stage as the nightly task runs it:
tune on validation (at most --tune-users users), evaluate on the held-out split (at most --eval-users),
fit every source on all interactions, and compute the published candidates of EVERY user chunk by chunk
(each chunk's frame and feature rows built, then dropped, as the task would write them). Prints the CPU
flags, per phase the wall time and the process's RSS (now and peak), per source its fit and recommend
time in the final pass and users/s, and the held-out metrics table. Item-item keeps a sparse neighbour
table (items x neighbours at most), never an items x items matrix; users are processed in --user-chunk
chunks, so the working set follows the chunk, not the number of users. Usage:

    nice -n 5 python benchmarks/candidate_scale.py [--items 1000000] [--users 100000] [--median 81] [--dim 384]
        [--user-chunk 2048] [--tune-users 5000] [--eval-users 10000] [--final-users N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.catalogues import scratch, text_embeddings
from models.recommender.candidate_stage import CandidateConfig, Timings, candidate_chunks, evaluate, fit_final, tune
from models.recommender.evaluation import METRICS, time_split
from models.recommender.retrieval import ItemChunks
from models.recommender.sources.base import encode_run
from nightscore.demo import DEMO_BASE_TIME, generate_demo_data

log = logging.getLogger("bench")
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx512vl", "amx_bf16", "amx_int8", "amx_tile", "fma")


def cpu_flags() -> str:
    """Return the model name and the SIMD flags of this CPU that matter for these kernels."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    return f"{model}; flags: {' '.join(f for f in FLAGS if f in flags) or 'none of ' + ' '.join(FLAGS)}"


def rss_mib() -> tuple[float, float]:
    """Return (current RSS, peak RSS) of this process in MiB."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        now = pages * resource.getpagesize() / 2**20
    except (OSError, IndexError, ValueError):
        now = math.nan
    return now, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class Phases:
    """Wall time and RSS after each phase, printed as one table."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float, float]] = []
        self._started = time.perf_counter()

    def done(self, name: str) -> None:
        """Record a phase that ended now."""
        now, peak = rss_mib()
        self.rows.append((name, time.perf_counter() - self._started, now, peak))
        log.info("phase %s: %.1f s, RSS %.0f MiB (peak %.0f)", name, self.rows[-1][1], now, peak)
        self._started = time.perf_counter()

    def print(self) -> None:
        """Print the phase table."""
        print(f"\n{'phase':34s} {'wall s':>8s} {'RSS MiB':>9s} {'peak MiB':>9s}")
        for name, seconds, now, peak in self.rows:
            print(f"{name:34s} {seconds:8.1f} {now:9.0f} {peak:9.0f}")


def print_metrics(table: pl.DataFrame, title: str) -> None:
    """Print a retrieval_metrics table as methods x metrics, then the split's own figures."""
    print(f"\n{title}")
    print(f"{'method':18s} " + " ".join(f"{m:>16s}" for m in METRICS))
    methods = [m for m in table["method"].unique(maintain_order=True).to_list() if m != "split"]
    for method in methods:
        values = dict(table.filter(pl.col("method") == method).select("metric", "value").iter_rows())
        print(f"{method:18s} " + " ".join(f"{values.get(m, math.nan):16.4f}" for m in METRICS))
    split = dict(table.filter(pl.col("method") == "split").select("metric", "value").iter_rows())
    print("split: " + ", ".join(f"{k} {int(v)}" for k, v in split.items()))


def run_stage(
    items: pl.DataFrame,
    interactions: pl.DataFrame,
    chunks: ItemChunks | None,
    config: CandidateConfig,
    phases: Phases | None = None,
) -> tuple[object, object, Timings, tuple[object, object]]:
    """Return (tuned, report, timings, (catalogue, log)) of tuning and held-out evaluation."""
    phases = phases or Phases()
    timings = Timings()
    catalogue, encoded = encode_run(items, interactions)
    phases.done("encode")
    evaluation = time_split(encoded, config.holdout_share)
    tuned = tune(catalogue, encoded, chunks, config, evaluation, timings)
    phases.done(f"tune ({tuned.validation_users} validation users)")
    report = evaluate(catalogue, encoded, chunks, config, evaluation, tuned, timings)
    phases.done("evaluate (held-out split)")
    return tuned, report, timings, (catalogue, encoded)


def final_pass(
    catalogue: object,
    encoded: object,
    chunks: ItemChunks | None,
    config: CandidateConfig,
    tuned: object,
    report: object,
    n_users: int | None,
    phases: Phases,
) -> tuple[Timings, int, int]:
    """Return (timings, users, candidate rows) of the fit on all interactions and every chunk's candidates."""
    timings = Timings()
    final = fit_final(catalogue, encoded, chunks, config, DEMO_BASE_TIME, tuned, report.scorer, timings)  # type: ignore[arg-type, attr-defined]
    phases.done("fit every source on all interactions")
    users = np.arange(catalogue.n_users if n_users is None else min(n_users, catalogue.n_users))  # type: ignore[attr-defined]
    rows = 0
    for chunk in candidate_chunks(final, users, timings):
        rows += chunk.frame.height
        del chunk
    phases.done(f"candidates of {len(users)} users")
    return timings, len(users), rows


def print_sources(timings: Timings, users: int) -> None:
    """Print per source its fit and recommend seconds in the final pass and users/s."""
    print(f"\n{'source':16s} {'fit s':>8s} {'recommend s':>12s} {'users/s':>10s}")
    names = sorted({k.split(".")[0] for k in timings.seconds if "." in k})
    for name in names:
        fit, rec = timings.seconds.get(f"{name}.fit", 0.0), timings.seconds.get(f"{name}.recommend", 0.0)
        print(f"{name:16s} {fit:8.1f} {rec:12.1f} {users / rec if rec else math.nan:10.0f}")
    print(f"{'fusion+features':16s} {'':8s} {timings.seconds.get('fusion', 0.0):12.1f}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--median", type=float, default=81.0, help="median interactions per user (81 -> ~100 mean)")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--user-chunk", type=int, default=2048)
    parser.add_argument("--tune-users", type=int, default=5_000)
    parser.add_argument("--eval-users", type=int, default=10_000)
    parser.add_argument("--final-users", type=int, default=None, help="publish only the first N users (default all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args = parse_args(argv)
    phases = Phases()
    items, interactions = generate_demo_data(args.items, args.users, args.seed, median_interactions=args.median)
    phases.done(f"generate ({interactions.height} interactions)")
    config = CandidateConfig(
        user_chunk=args.user_chunk,
        content_chunk=args.user_chunk,
        max_tune_users=args.tune_users,
        max_eval_users=args.eval_users,
        seed=args.seed,
    )
    config = replace(config, cooccurrence=replace(config.cooccurrence, score_chunk=min(2048, args.user_chunk)))
    with scratch() as folder:
        chunks = text_embeddings(items.select("item_id", "title", "body"), args.dim, Path(folder))
        items = items.drop("title", "body")
        phases.done(f"text embeddings (dim {args.dim}, on disk)")
        tuned, report, eval_timings, (catalogue, encoded) = run_stage(items, interactions, chunks, config, phases)
        del interactions
        timings, users, rows = final_pass(catalogue, encoded, chunks, config, tuned, report, args.final_users, phases)
    print(
        f"\n{args.items} items x {args.users} users x {encoded.user_rows.size} interactions (after the join), "  # type: ignore[attr-defined]
        f"K={config.k}, dim {args.dim}, user chunk {args.user_chunk}"
    )
    print(f"CPU: {cpu_flags()}")
    phases.print()
    print_sources(timings, users)
    print(f"published {rows} candidate rows for {users} users; fusion {tuned.fusion}")  # type: ignore[attr-defined]
    print_metrics(report.metrics, f"held-out metrics (ranker kind chosen: {report.chosen})")  # type: ignore[attr-defined]
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "phases": phases.rows,
                    "final": timings.seconds,
                    "evaluation": eval_timings.seconds,
                    "metrics": report.metrics.to_dicts(),  # type: ignore[attr-defined]
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
