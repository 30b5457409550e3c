"""Held-out quality of every candidate source, the fusion and the ranker on several catalogues, side by side.

Catalogues: the demo generator (sessions, series, bundles, taste clusters, new items) at the default demo
size and larger, and the latent-taste catalogue of benchmarks/catalogues.py (no sessions or series,
continuous item arrival), so that a fusion tuned for one structure is checked on another. Embeddings are
hashed TF-IDF of the item text (no encoder). Everything is tuned on a validation split inside the
training part and measured on the held-out split (models.recommender.evaluation). Usage:

    python benchmarks/candidate_quality.py [--catalogue demo:2000:500 latent:20000:5000 ...] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.candidate_scale import cpu_flags, print_metrics, run_stage
from benchmarks.catalogues import latent_catalogue, scratch, text_embeddings
from core.errors import ContractViolation
from models.recommender.candidate_stage import CandidateConfig
from models.recommender.evaluation import METRICS, check_gate
from nightscore.demo import generate_demo_data


def catalogue(spec: str, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Return (items, interactions) of a 'kind:items:users' spec."""
    kind, n_items, n_users = spec.split(":")
    if kind == "demo":
        return generate_demo_data(int(n_items), int(n_users), seed)
    if kind == "latent":
        return latent_catalogue(int(n_items), int(n_users), seed)
    raise SystemExit(f"unknown catalogue kind {kind!r}")


def mean_table(tables: list[pl.DataFrame]) -> pl.DataFrame:
    """Return the mean value per (method, metric) over seeds (order of the first table)."""
    stacked = pl.concat(tables)
    return stacked.group_by("method", "metric", maintain_order=True).agg(pl.col("value").mean())


def verdict(table: pl.DataFrame) -> str:
    """Return the targets: fused vs popularity and vs the best single source, ranked NDCG, cold recall."""
    value = {(m, k): v for m, k, v in table.iter_rows()}
    singles = [
        m
        for m in table["method"].unique().to_list()
        if m not in ("fused", "fused_rrf", "split", "popularity") and not m.startswith("ranked")
    ]
    best_recall = max(value[(m, "recall_at_k")] for m in singles)
    best_ndcg = max(value[(m, "ndcg_at_10")] for m in singles)
    fused_r, fused_n = value[("fused", "recall_at_k")], value[("fused", "ndcg_at_10")]
    cold = value.get(("fused", "cold_recall_at_k"), math.nan)
    first = "learned" if value[("fused", "recall_at_k")] != value[("fused_rrf", "recall_at_k")] else "RRF"
    return (
        f"first stage {first}; fused recall / popularity {fused_r / value[('popularity', 'recall_at_k')]:.2f}x; "
        f"fused recall / best single source {fused_r / best_recall:.2f}x; fused NDCG@10 / best single "
        f"{fused_n / best_ndcg:.2f}x; ranked NDCG@10 / popularity "
        f"{value[('ranked', 'ndcg_at_10')] / value[('popularity', 'ndcg_at_10')]:.2f}x; fused cold recall {cold:.3f}"
    )


def gate_outcome(report: object, config: CandidateConfig) -> str:
    """Return the candidate gate's outcome on one seed's held-out evaluation (a failure's message, not raised)."""
    try:
        return check_gate(report.metrics, report.recall, config.gate)  # type: ignore[attr-defined]
    except ContractViolation as exc:
        return f"FAILED: {exc}"


def main(argv: list[str] | None = None) -> int:
    """Run every catalogue over the seeds and print its mean table and verdict."""
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalogue", nargs="+", default=["demo:2000:500", "demo:20000:5000", "latent:20000:5000"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--dim", type=int, default=256)
    args = parser.parse_args(argv)
    print(f"CPU: {cpu_flags()}")
    for spec in args.catalogue:
        tables, chosen, gates = [], [], []
        for seed in args.seeds:
            items, interactions = catalogue(spec, seed)
            config = CandidateConfig(seed=seed)
            with scratch() as folder:
                chunks = text_embeddings(items, args.dim, Path(folder))
                tuned, report, _, _ = run_stage(items, interactions, chunks, config)
            tables.append(report.metrics)  # type: ignore[attr-defined]
            chosen.append(report.chosen)  # type: ignore[attr-defined]
            gates.append(f"seed {seed}: {gate_outcome(report, config)}; published {tuned.fallback or 'fused'}")  # type: ignore[attr-defined]
        table = mean_table(tables)
        print_metrics(table, f"{spec}: mean over seeds {args.seeds} (ranker kinds chosen: {chosen}); metrics {METRICS}")
        print(verdict(table))
        print("gate " + " | ".join(gates))
    return 0


if __name__ == "__main__":
    sys.exit(main())
