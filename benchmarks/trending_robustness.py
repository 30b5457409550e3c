"""How far a few fake users push new items into real users' candidate lists: plain trending against the robust one.

On the demo data (2000 items, 500 users by default), ``--targets`` new items (no interaction yet) each get one click
from each of F fake users, an hour before the run; then the candidate stage runs as the nightly does (tune on the
validation split, fit on every interaction, each user's published K candidates). For each F the table says in how
many of the real users' candidate lists the targets land (mean and max over the targets) and how many real users
get at least one, with plain trending (the old sources: every user and event counted in full), with the distinct
users and per-user cap alone, and with the settings' defaults (new users discounted too). Embeddings are hashed
TF-IDF of the item text (no encoder). Usage:

    python benchmarks/trending_robustness.py [--fake-users 1 3 6 12 24] [--targets 5] [--items 2000 --users 500]
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.candidate_scale import cpu_flags
from core.settings import CandidateSettings
from models.recommender.candidate_stage import CandidateConfig, candidate_chunks, fit_final, tune
from models.recommender.evaluation import time_split
from models.recommender.retrieval import ItemChunks
from models.recommender.sources.base import encode_run
from nightscore.demo import DEMO_BASE_TIME, generate_demo_data
from tests.helpers import hashed_text_vectors

log = logging.getLogger("bench")
PLAIN = {"trend_min_users": 1, "trend_user_cap": math.inf, "trend_new_user_days": 0.0}
CAPS_ONLY = {"trend_new_user_days": 0.0}


def with_fakes(items: pl.DataFrame, interactions: pl.DataFrame, targets: list[str], fakes: int) -> pl.DataFrame:
    """Return the interactions plus one click by each of `fakes` new users on each target, an hour before the run."""
    if fakes == 0:
        return interactions
    ts = DEMO_BASE_TIME - timedelta(hours=1)
    rows = [(f"fake-{u:03d}", item, "click", ts) for u in range(fakes) for item in targets]
    fake = pl.DataFrame(rows, schema=["user_id", "item_id", "event", "ts"], orient="row").cast(interactions.schema)
    return pl.concat([interactions.select(fake.columns), fake])


def reach(items: pl.DataFrame, interactions: pl.DataFrame, targets: list[str], config: CandidateConfig) -> tuple[list[int], int]:
    """Return, per target, in how many real users' published candidate lists it is, and how many real users have any."""
    catalogue, encoded = encode_run(items, interactions)
    vectors = np.stack(hashed_text_vectors(items)["embedding"].to_list()).astype(np.float32)
    chunks = ItemChunks.of(vectors, 512)
    tuned = tune(catalogue, encoded, chunks, config, time_split(encoded, config.holdout_share))
    final = fit_final(catalogue, encoded, chunks, config, DEMO_BASE_TIME, tuned, None)
    frame = pl.concat([chunk.frame.select("user_id", "item_id") for chunk in candidate_chunks(final)])
    real = frame.with_columns(pl.col("user_id").cast(pl.String)).filter(~pl.col("user_id").str.starts_with("fake-"))
    hits = real.filter(pl.col("item_id").cast(pl.String).is_in(targets))
    per_target = [hits.filter(pl.col("item_id").cast(pl.String) == t).height for t in targets]
    return per_target, hits.get_column("user_id").n_unique()


def new_items(items: pl.DataFrame, interactions: pl.DataFrame, n: int) -> list[str]:
    """Return n items nobody interacted with (the demo's new items), in catalogue order."""
    seen = set(interactions.get_column("item_id").to_list())
    return [i for i in items.get_column("item_id").to_list() if i not in seen][:n]


def main() -> None:
    """Print the table: fake users x events -> real users' lists holding the targets, plain against robust trending."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fake-users", type=int, nargs="+", default=[0, 1, 3, 6, 12, 24])
    parser.add_argument("--targets", type=int, default=5)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    items, interactions = generate_demo_data(args.items, args.users, args.seed)
    targets = new_items(items, interactions, args.targets)
    defaults = CandidateSettings()
    caps = f"min users {defaults.trend_min_users}, cap {defaults.trend_user_cap:g}"
    configs = {
        "plain": CandidateSettings(**PLAIN),
        caps: CandidateSettings(**CAPS_ONLY),
        f"{caps}, new {defaults.trend_new_user_days:g} d": defaults,
    }
    real_users = interactions.get_column("user_id").n_unique()
    print(f"trending robustness: demo {args.items} items x {real_users} real users, {len(targets)} new target items,")
    print(f"each fake user clicks each target once; K = {defaults.top_k}; CPU: {cpu_flags()}\n")
    print(f"{'trending':<36} {'fake users':>10} {'events':>7} {'lists/target':>13} {'max':>5} {'users with any':>15} {'s':>6}")
    for name, options in configs.items():
        for fakes in args.fake_users:
            started = time.perf_counter()
            config = CandidateConfig.from_settings(options, "cpu")
            per_target, users = reach(items, with_fakes(items, interactions, targets, fakes), targets, config)
            seconds = time.perf_counter() - started
            mean = sum(per_target) / len(per_target)
            row = f"{name:<36} {fakes:>10} {fakes * len(targets):>7} {mean:>13.1f} {max(per_target):>5} {users:>15}"
            print(f"{row} {seconds:>6.1f}")


if __name__ == "__main__":
    main()
