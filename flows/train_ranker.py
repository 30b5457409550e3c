"""The train_ranker flow: fit the stage-two ranking model on a published run's interactions and scores."""

from __future__ import annotations

from prefect import flow

from core.records import TrainedRanker
from flows.params import TrainRankerParams
from tasks.train_ranker import published_run, train


@flow(name="train-ranker")
def train_ranker(params: TrainRankerParams = TrainRankerParams()) -> TrainedRanker:
    """Train, version and save the ranker on a published run (the latest by default); return its metrics."""
    run = published_run(params.run_id)
    return train(run)
